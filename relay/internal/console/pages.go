package console

import (
	"errors"
	"html/template"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Windows of the pages.
const (
	// OverviewWindow is the overview's chart and hour figures.
	OverviewWindow = time.Hour
	// LatencyBin is the latency chart's bin (the histograms').
	LatencyBin = 5 * time.Minute
)

type overviewPage struct {
	S                 telemetry.Summary
	Alerts            []telemetry.Alert
	SlotFiring        bool
	Chart             template.HTML
	Delivered, Failed int
}

// overview is the whole pipeline at a glance. Every figure comes from a
// summarised or indexed query: the health summary, the stored endpoint
// stats (refreshed every minute) for the alerts, and per-minute counts.
func (c *Console) overview(rq *request) error {
	s, err := telemetry.LoadSummary(rq.ctx, rq.pool, rq.cfg.Slot)
	if err != nil {
		return err
	}
	eps, err := telemetry.LoadStoredEndpoints(rq.ctx, rq.pool)
	if err != nil {
		return err
	}
	s.InvalidEndpoints = telemetry.InvalidEndpoints(rq.cfg)
	p := overviewPage{S: s, Alerts: telemetry.Firing(telemetry.Evaluate(s, eps, rq.cfg.Alerts))}
	for _, a := range p.Alerts {
		p.SlotFiring = p.SlotFiring || a.Name == telemetry.AlertSlotLag
	}
	counts, err := telemetry.DeliveriesPerMinute(rq.ctx, rq.pool, OverviewWindow)
	if err != nil {
		return err
	}
	end := s.At.Truncate(time.Minute)
	if s.At.IsZero() {
		end = c.now().Truncate(time.Minute)
	}
	minutes := make([]time.Time, 0, 60)
	for t := end.Add(-OverviewWindow + time.Minute); !t.After(end); t = t.Add(time.Minute) {
		minutes = append(minutes, t)
	}
	delivered, failed := make([]float64, len(minutes)), make([]float64, len(minutes))
	for _, m := range counts {
		i := int(m.Minute.Sub(minutes[0]) / time.Minute)
		if i < 0 || i >= len(minutes) {
			continue
		}
		delivered[i], failed[i] = float64(m.Delivered), float64(m.Failed)
		p.Delivered += m.Delivered
		p.Failed += m.Failed
	}
	p.Chart = Chart{
		Label:  "Deliveries and failed attempts per minute over the last hour",
		X:      minutes,
		Series: []Series{{Name: "delivered", Class: "c-ok", Values: delivered}, {Name: "failed", Class: "c-bad", Values: failed}},
		Empty:  "no deliveries in the last hour",
	}.Bars()
	c.render(rq, http.StatusOK, "overview", "Overview", "overview", 0, p)
	return nil
}

type endpointsPage struct {
	Endpoints []endpointRow
	Capped    bool
}

// endpointRow is a line of the endpoints table: its figures (HasStats:
// it has deliveries or samples), where it is defined, and whether its
// events wait.
type endpointRow struct {
	telemetry.EndpointStats
	HasStats bool
	// Source is config.SourceFile, config.SourceTable, or "" (rows that
	// carry their own URL).
	Source string
	// Of a table row: Disabled, Invalid (why it cannot be used, cut as
	// stored text is: it may quote a value); Conflict:
	// the file defines the name too, and its settings are used.
	Disabled bool
	Invalid  string
	Conflict bool
}

// endpoints is the table of `postbox endpoints`: every endpoint with
// figures, every endpoint of the file, and the rows of postbox.endpoints
// (each judged as the relay judges it), the first EndpointsLimitDefault
// by name.
func (c *Console) endpoints(rq *request) error {
	eps, err := telemetry.LoadEndpointsRefreshed(rq.ctx, rq.pool, "")
	if err != nil {
		return err
	}
	rows, err := readEndpointRows(rq.ctx, rq.pool, endpointRowsSQL, "", EndpointsLimitDefault+1)
	if err != nil {
		return err
	}
	byName := map[string]*endpointRow{}
	var list []*endpointRow
	get := func(name string) *endpointRow {
		if r, ok := byName[name]; ok {
			return r
		}
		r := &endpointRow{EndpointStats: telemetry.EndpointStats{Endpoint: name}}
		byName[name] = r
		list = append(list, r)
		return r
	}
	for _, e := range eps {
		r := get(e.Endpoint)
		r.EndpointStats, r.HasStats = e, true
		r.LastError = c.text(rq, e.LastError)
	}
	tes := make([]config.TableEndpoint, len(rows))
	for i, row := range rows {
		tes[i] = endpoints.Parse(row)
	}
	scratch := scratchConfig(rq.cfg, tes)
	for _, te := range tes {
		r := get(te.Name)
		ep := scratch.Endpoint(te.Name)
		r.Source, r.Disabled, r.Invalid = config.SourceTable, ep.Disabled, c.text(rq, ep.Invalid)
	}
	for name := range rq.cfg.Endpoints {
		r := get(name)
		r.Conflict = r.Source == config.SourceTable
		r.Source = config.SourceFile
	}
	slices.SortFunc(list, func(a, b *endpointRow) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	p := endpointsPage{}
	if len(list) > EndpointsLimitDefault {
		list, p.Capped = list[:EndpointsLimitDefault], true
	}
	for _, r := range list {
		p.Endpoints = append(p.Endpoints, *r)
	}
	c.render(rq, http.StatusOK, "endpoints", "Endpoints", "endpoints", 0, p)
	return nil
}

type endpointPage struct {
	Name       string
	Configured bool
	// Source, Disabled, Invalid, Conflict: as the endpoints table's.
	Source             string
	Disabled, Conflict bool
	Invalid            string
	// Applying: this instance has applied an older revision of the row
	// (or none) yet; changes apply within a second.
	Applying bool
	// Settings are shown read-only: a file endpoint's, or a row's to a
	// request that may not edit it; Form is a row's edit form.
	Settings     []kv
	Form         *endpointForm
	Changes      []change
	ChangesLimit int
	Stats        *telemetry.EndpointStats
	Chart        template.HTML
	Attempts     []postboxtype.AttemptRow
	AttemptLimit int
	// FailingNow: the last attempt failed (no success since).
	FailingNow bool
}

// endpoint is one endpoint: where it is defined and its settings (a
// table row's edit form), its figures, its latency over 24 hours per five
// minutes, its last attempts, pause and resume, and its changes.
func (c *Console) endpoint(rq *request) error {
	name := rq.r.PathValue("name")
	p := endpointPage{Name: name, AttemptLimit: ListLimitDefault, ChangesLimit: ChangesLimitDefault}
	fileEp, inFile := rq.cfg.Endpoints[name]
	row, err := readEndpointRow(rq.ctx, rq.pool, name)
	if err != nil {
		return err
	}
	if row != nil {
		ep := resolveScratch(rq.cfg, endpoints.Parse(row))
		p.Source, p.Disabled, p.Invalid, p.Conflict = config.SourceTable, ep.Disabled, c.text(rq, ep.Invalid), inFile
		p.Applying = rq.cfg.EndpointTable != nil && rq.cfg.EndpointTable.Revision(name) < ep.Revision
		if rq.s.canAct() {
			p.Form = formFromRow(row)
			p.Form.Actor = rq.actor()
		} else {
			p.Settings = c.rowSettings(rq, row)
		}
	}
	if inFile {
		p.Source = config.SourceFile
		p.Settings = c.fileSettings(rq, fileEp)
	}
	p.Configured = p.Source != ""
	if p.Changes, err = readChanges(rq.ctx, rq.pool, name, ChangesLimitDefault); err != nil {
		return err
	}
	eps, err := telemetry.LoadEndpointsRefreshed(rq.ctx, rq.pool, name)
	if err != nil {
		return err
	}
	if len(eps) == 1 {
		p.Stats = &eps[0]
		p.Stats.LastError = c.text(rq, p.Stats.LastError)
		f, ok := p.Stats.LastFailureAt, p.Stats.LastSuccessAt
		p.FailingNow = f != nil && (ok == nil || f.After(*ok))
	} else if !p.Configured && len(p.Changes) == 0 {
		return errNotFound
	}
	series, err := telemetry.LatencySeries(rq.ctx, rq.pool, name)
	if err != nil {
		return err
	}
	p.Chart = latencyChart(series, c.now())
	if p.Attempts, err = telemetry.RecentAttempts(rq.ctx, rq.pool, name, ListLimitDefault); err != nil {
		return err
	}
	for i := range p.Attempts {
		p.Attempts[i].Error = c.text(rq, p.Attempts[i].Error)
		p.Attempts[i].Target = c.target(rq, p.Attempts[i].Target)
	}
	c.render(rq, http.StatusOK, "endpoint", name, "endpoints", 0, p)
	return nil
}

// latencyChart draws p50/p95/p99 per five-minute bin over the last 24
// hours; bins without attempts are gaps.
func latencyChart(points []telemetry.LatencyPoint, now time.Time) template.HTML {
	end := now.UTC().Truncate(LatencyBin)
	n := int(telemetry.Window / LatencyBin)
	bins := make([]time.Time, n)
	p50, p95, p99 := make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range bins {
		bins[i] = end.Add(-time.Duration(n-1-i) * LatencyBin)
		p50[i], p95[i], p99[i] = math.NaN(), math.NaN(), math.NaN()
	}
	for _, pt := range points {
		i := int(pt.Bin.Sub(bins[0]) / LatencyBin)
		if i < 0 || i >= n || pt.Count == 0 {
			continue
		}
		p50[i], p95[i], p99[i] = pt.P50MS, pt.P95MS, pt.P99MS
	}
	return Chart{
		Label: "Latency percentiles per five minutes over the last 24 hours",
		X:     bins,
		Series: []Series{{Name: "p50", Class: "c-p50", Values: p50}, {Name: "p95", Class: "c-p95", Values: p95},
			{Name: "p99", Class: "c-p99", Values: p99}},
		Format: formatMS,
		Empty:  "no attempts in the last 24 hours",
	}.Lines()
}

type deadLettersPage struct {
	Endpoint, Window string
	Windows          []window
	WindowLabel      string
	Since            time.Time
	Analysis         []telemetry.Analysis
	List             []postboxtype.DeadLetter
	Capped           bool
}

// window is a choice of how far back a page looks.
type window struct {
	Key, Label string
	D          time.Duration
}

// deadLetterWindows are the dead-letter page's windows.
var deadLetterWindows = []window{{"1h", "the last hour", time.Hour}, {"24h", "the last 24 hours", 24 * time.Hour},
	{"7d", "the last 7 days", 7 * 24 * time.Hour}, {"30d", "the last 30 days", 30 * 24 * time.Hour}}

// deadLetters is the analysis with its advice and the newest dead letters.
func (c *Console) deadLetters(rq *request) error {
	q := rq.r.URL.Query()
	p := deadLettersPage{Endpoint: strings.TrimSpace(q.Get("endpoint")), Window: "7d", Windows: deadLetterWindows}
	w := deadLetterWindows[2]
	for _, c := range deadLetterWindows {
		if c.Key == q.Get("since") {
			w = c
		}
	}
	p.Window, p.WindowLabel, p.Since = w.Key, w.Label, c.now().Add(-w.D)
	var err error
	if p.Analysis, err = telemetry.AnalyzeDeadLetters(rq.ctx, rq.pool, p.Endpoint, p.Since); err != nil {
		return err
	}
	for i := range p.Analysis {
		p.Analysis[i].PrimaryError = c.text(rq, p.Analysis[i].PrimaryError)
	}
	if p.List, err = telemetry.ListDeadLetters(rq.ctx, rq.pool, p.Endpoint, p.Since, ListLimitDefault+1); err != nil {
		return err
	}
	if len(p.List) > ListLimitDefault {
		p.List, p.Capped = p.List[:ListLimitDefault], true
	}
	for i := range p.List {
		p.List[i].LastError = c.text(rq, p.List[i].LastError)
	}
	c.render(rq, http.StatusOK, "deadletters", "Dead letters", "dead-letters", 0, p)
	return nil
}

type eventsPage struct {
	ID, Payload, Endpoint, Status, Since, Until string
	Keys                                        []string
	Statuses                                    []string
	Searched, Capped, Filtered                  bool
	Results                                     []postboxtype.EventSummary
	Error                                       string
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// events searches events by payload key, endpoint, status and time.
func (c *Console) events(rq *request) error {
	q := rq.r.URL.Query()
	p := eventsPage{ID: strings.TrimSpace(q.Get("id")), Payload: strings.TrimSpace(q.Get("payload")),
		Endpoint: strings.TrimSpace(q.Get("endpoint")), Status: q.Get("status"),
		Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until")),
		Keys: rq.cfg.SearchKeys, Statuses: telemetry.EventStatuses}
	if p.ID != "" {
		if !uuidRe.MatchString(p.ID) {
			p.Error = "An event id is a UUID, such as 0b9c5f0e-5d3c-4e59-9f8e-2f4b8f1c6a10."
			c.render(rq, http.StatusBadRequest, "events", "Events", "events", 0, p)
			return nil
		}
		http.Redirect(rq.w, rq.r, "/events/"+strings.ToLower(p.ID), http.StatusSeeOther)
		return nil
	}
	f := telemetry.EventFilter{Endpoint: p.Endpoint, Limit: ListLimitDefault + 1}
	if p.Status != "" && !slices.Contains(telemetry.EventStatuses, p.Status) {
		p.Status = ""
	}
	f.Status = p.Status
	var problems []string
	for _, kv := range q["payload"] {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			problems = append(problems, "Write a payload search as key=value, with a key from search_keys.")
			continue
		}
		if f.Payload == nil {
			f.Payload = map[string]string{}
		}
		f.Payload[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if len(f.Payload) > 0 {
		if err := telemetry.CheckSearchKeys(rq.cfg.SearchKeys, f.Payload); err != nil {
			problems = append(problems, err.Error())
		}
	}
	now := c.now()
	for _, t := range []struct {
		text string
		into *time.Time
		name string
	}{{p.Since, &f.Since, "since"}, {p.Until, &f.Until, "until"}} {
		if t.text == "" {
			continue
		}
		at, err := parseSince(t.text, now)
		if err != nil {
			problems = append(problems, t.name+": "+err.Error())
			continue
		}
		*t.into = at
	}
	if len(problems) > 0 {
		p.Error = strings.Join(problems, " ")
		c.render(rq, http.StatusBadRequest, "events", "Events", "events", 0, p)
		return nil
	}
	// An empty form lists the newest events.
	p.Searched = true
	p.Filtered = f.Endpoint != "" || f.Status != "" || len(f.Payload) > 0 || !f.Since.IsZero() || !f.Until.IsZero()
	res, err := telemetry.SearchEvents(rq.ctx, rq.pool, f)
	if err != nil {
		return err
	}
	if len(res) > ListLimitDefault {
		res, p.Capped = res[:ListLimitDefault], true
	}
	p.Results = res
	c.render(rq, http.StatusOK, "events", "Events", "events", 0, p)
	return nil
}

// parseSince reads "24h", "7d", "90m" (ago) or a time: RFC 3339, or
// "2006-01-02 15:04" and "2006-01-02" in UTC.
func parseSince(s string, now time.Time) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := time.ParseDuration(d + "h"); err == nil && n >= 0 {
			return now.Add(-24 * n), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errors.New("want a duration such as 24h or 7d, or a time such as 2006-01-02 15:04 (UTC)")
}

type eventPage struct {
	ID          string
	Stories     []storyView
	LogPayloads bool
}

type storyView struct {
	postboxtype.EventStory
	Deliveries []deliveryView
}

type deliveryView struct {
	postboxtype.DeliveryStory
	Steps []step
}

// step is one line of a delivery's timeline.
type step struct {
	When time.Time
	// After is how long after the event's commit (its write, when the
	// commit is unknown).
	After                  string
	Class                  string // ok, bad, warn or ""
	What, Detail, Response string
}

// event is one event's timeline at each of its endpoints.
func (c *Console) event(rq *request) error {
	id := strings.ToLower(rq.r.PathValue("id"))
	if !uuidRe.MatchString(id) {
		return errNotFound
	}
	stories, err := telemetry.LoadEvent(rq.ctx, rq.pool, id)
	if errors.Is(err, telemetry.ErrEventNotFound) {
		return &httpError{http.StatusNotFound, "Event not found", "No event has this id (or it is older than event_retention)."}
	}
	if err != nil {
		return err
	}
	p := eventPage{ID: id, LogPayloads: rq.cfg.LogPayloads}
	telemetry.ForOperator(stories, rq.cfg)
	byPartner, err := partnerReplays(rq, stories)
	if err != nil {
		return err
	}
	for _, st := range stories {
		sv := storyView{EventStory: st}
		for _, d := range st.Deliveries {
			steps := c.steps(rq, d)
			if link, ok := byPartner[d.ID]; ok {
				steps[0].What = "Queued again: replayed by partner (portal link " + link + ")"
			}
			for i := 1; i < len(steps) && i <= len(d.Attempts); i++ {
				if steps[i].When.Before(st.IngestedAt) {
					steps[i].Detail = strings.TrimPrefix(steps[i].Detail+" · started before its ingest committed (sent from memory as the event was written)", " · ")
				}
			}
			from := st.CreatedAt
			if st.CommittedAt != nil {
				from = *st.CommittedAt
			}
			for i := range steps {
				steps[i].After = "+" + formatSpan(max(0, steps[i].When.Sub(from)))
			}
			sv.Deliveries = append(sv.Deliveries, deliveryView{DeliveryStory: d, Steps: steps})
		}
		p.Stories = append(p.Stories, sv)
	}
	c.render(rq, http.StatusOK, "event", "Event "+shortID(id), "events", 0, p)
	return nil
}

// steps tells a delivery's story: queued (or replayed), each attempt, and
// how it ended.
func (c *Console) steps(rq *request, d postboxtype.DeliveryStory) []step {
	first := step{When: d.CreatedAt, What: "Queued for delivery"}
	if d.ReplayOf != nil {
		first.What = "Queued again by a replay"
	}
	if d.Retarget != "" {
		to := d.Retarget
		if to == postboxtype.RetargetEndpointURL {
			to = "the endpoint's url"
		}
		first.What += " to " + to + ", not the row's url"
	}
	out := []step{first}
	for _, a := range d.Attempts {
		s := step{When: a.StartedAt, What: "Attempt " + itoa(a.Attempt)}
		switch {
		case a.StatusCode != nil && a.Error == "":
			s.What += " → HTTP " + itoa(*a.StatusCode)
			s.Class = "ok"
		case a.StatusCode != nil:
			s.What += " → HTTP " + itoa(*a.StatusCode)
			s.Class = "warn"
		default:
			s.What += " → no response"
			s.Class = "warn"
		}
		s.What += " in " + formatMS(a.DurationMS)
		var detail []string
		if a.Error != "" {
			e := c.text(rq, a.Error)
			if a.ErrorClass != "" {
				e = label(a.ErrorClass) + ": " + e
			}
			detail = append(detail, e)
		}
		if a.Target != "" {
			detail = append(detail, "to "+c.target(rq, a.Target))
		}
		if a.Sent != "" && a.Sent != a.Target {
			detail = append(detail, "sent as "+a.Sent)
		}
		if a.Instance != "" {
			detail = append(detail, "by "+a.Instance)
		}
		s.Detail = strings.Join(detail, " · ")
		s.Response = a.Response // telemetry.ForOperator's rule, the CLI's too
		out = append(out, s)
	}
	switch postboxtype.DeliveryState(d.Status) {
	case postboxtype.DeliveryDelivered:
		at := d.UpdatedAt
		if d.DeliveredAt != nil {
			at = *d.DeliveredAt
		}
		out = append(out, step{When: at, Class: "ok", What: "Delivered"})
	case postboxtype.DeliveryDeadLetter:
		out = append(out, step{When: d.UpdatedAt, Class: "bad", What: "Dead-lettered", Detail: c.text(rq, d.LastError)})
	case postboxtype.DeliveryReplayed:
		out = append(out, step{When: d.UpdatedAt, Class: "bad", What: "Dead-lettered (replayed later)", Detail: c.text(rq, d.LastError)})
	case postboxtype.DeliveryFailed:
		out = append(out, step{When: d.UpdatedAt, Class: "warn", What: "Waiting to retry", Detail: c.text(rq, d.LastError)})
	case postboxtype.DeliveryInFlight:
		out = append(out, step{When: d.UpdatedAt, Class: "warn", What: "Attempt in flight"})
	}
	return out
}

// text is stored free text (an error, a last response) as a page may show
// it: secrets removed always, URL query strings unless log_payloads.
func (c *Console) text(rq *request, s string) string { return logsafe.Text(s, rq.cfg.LogPayloads) }

// target is an attempt's target: stored as scheme://host/path already;
// cut again in case an older row kept more.
func (c *Console) target(rq *request, s string) string {
	if rq.cfg.LogPayloads {
		return s
	}
	return logsafe.URL(s)
}

// replay enqueues events again: every dead letter of an endpoint, or one
// event at one endpoint (only if still dead, from the dead-letter page).
// A url given sends the replayed deliveries there instead of their rows'
// urls, as postbox replay --url does: checked by the same rule
// (ops.CheckRetarget) before anything is queued, and at each attempt as a
// row's url is (the endpoint's allow_row_url, the SSRF guard).
func (c *Console) replay(rq *request) (string, error) {
	f := postboxtype.ReplayFilter{Endpoint: strings.TrimSpace(rq.r.PostFormValue("endpoint")),
		DeadLetters: rq.r.PostFormValue("dead_letters") == "1"}
	if id := strings.TrimSpace(rq.r.PostFormValue("event_id")); id != "" {
		if !uuidRe.MatchString(id) {
			return "", badRequest("An event id is a UUID.")
		}
		f.EventIDs = []string{id}
	}
	if f.Endpoint == "" {
		return "", badRequest("A replay from the console names an endpoint.")
	}
	f.URL = strings.TrimSpace(rq.r.PostFormValue("url"))
	if err := ops.CheckRetarget(f); err != nil {
		return "", badRequest("The url is refused: %s.", strings.TrimPrefix(err.Error(), "replay: url: "))
	}
	_, n, err := ops.Replay(rq.ctx, rq.pool, rq.cfg, f, false, 0)
	if err != nil {
		return "", err
	}
	// Whether it was retargeted, not where: the url may carry a partner's
	// parameters or a token in its path.
	ev := c.log.Info().Str("endpoint", f.Endpoint).Int("enqueued", n).Bool("dead_letters", f.DeadLetters).
		Bool("url_given", f.URL != "").Str("by", rq.s.by())
	if len(f.EventIDs) == 1 {
		ev = ev.Str("event_id", f.EventIDs[0])
	}
	ev.Msg("console replay")
	done := "replayed"
	if f.URL != "" {
		done = "replayed_url"
	}
	return withFlash(rq.r.PostFormValue("back"), done, n), nil
}

// pauseChoices are the pause form's durations (0: until resumed).
var pauseChoices = map[string]time.Duration{"15m": 15 * time.Minute, "1h": time.Hour, "4h": 4 * time.Hour, "24h": 24 * time.Hour, "resume": 0}

func (c *Console) pause(rq *request) (string, error) {
	name := rq.r.PathValue("name")
	d, ok := pauseChoices[rq.r.PostFormValue("for")]
	if !ok {
		return "", badRequest("Pause for 15m, 1h, 4h, 24h, or until resumed.")
	}
	var until time.Time // zero: until resumed
	if d > 0 {
		until = c.now().Add(d)
	}
	if err := ops.Pause(rq.ctx, rq.pool, name, until); err != nil {
		return "", err
	}
	c.log.Info().Str("endpoint", name).Dur("for", d).Str("by", rq.s.by()).Msg("console pause")
	return withFlash("/endpoints/"+pathEscape(name), "paused", -1), nil
}

func (c *Console) resume(rq *request) (string, error) {
	name := rq.r.PathValue("name")
	if err := ops.Resume(rq.ctx, rq.pool, name); err != nil {
		return "", err
	}
	c.log.Info().Str("endpoint", name).Str("by", rq.s.by()).Msg("console resume")
	return withFlash("/endpoints/"+pathEscape(name), "resumed", -1), nil
}

// partnerReplays are the deliveries of stories that a partner queued from
// its portal (portal.allow_replay), with the link it came through.
func partnerReplays(rq *request, stories []postboxtype.EventStory) (map[int64]string, error) {
	var ids []int64
	for _, st := range stories {
		for _, d := range st.Deliveries {
			if d.ReplayOf != nil {
				ids = append(ids, d.ID)
			}
		}
	}
	out := map[int64]string{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := rq.pool.Query(rq.ctx, `SELECT delivery_id, link_id FROM postbox.portal_replays WHERE delivery_id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var link string
		if err := rows.Scan(&id, &link); err != nil {
			return nil, err
		}
		out[id] = link
	}
	return out, rows.Err()
}
