package portal

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Statuses a partner filters by: the state of an event's latest delivery.
var Statuses = []string{"pending", "in_flight", "failed", "delivered", "dead_letter", "replayed"}

// periods are the deliveries page's choices of how far back to look.
var periods = []struct{ Key, Label string }{{"24h", "last 24 hours"}, {"7d", "last 7 days"}, {"30d", "last 30 days"}}

var periodDur = map[string]time.Duration{"24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour, "30d": 30 * 24 * time.Hour}

type deliveriesPage struct {
	Period, Status, Type, Key, Value, Since, Until string
	Periods                                        []struct{ Key, Label string }
	Statuses, Keys, Types                          []string
	Rows                                           []deliveryRow
	Capped                                         bool
	Error                                          string
}

type deliveryRow struct {
	EventID, EventType, Status string
	Search                     map[string]any
	Attempts                   int
	LastCode                   *int
	Committed                  *time.Time
	Ingested                   time.Time
}

// deliveriesSQL lists the partner's events, the newest ingested first,
// each with its latest delivery's state. Every condition is on e.endpoint
// = $1 first: the partner's name comes from its session, never the URL.
// It is written as the index events_endpoint_ingested's expression
// (migration 037), the endpoint concatenated with an empty string,
// which nothing else names.
// Times are commit times; the index is by ingest, which follows the
// commit, so a period's start bounds it exactly and its end, with a day's
// slack, nearly (an event ingested over a day after its commit, by a
// relay that was down that long, is listed without an end only).
const deliveriesSQL = `
SELECT e.event_id::text, e.event_type, e.search, e.committed_at, e.ingested_at,
       coalesce(d.status, 'in_flight'), coalesce(d.attempts, 0), d.code
FROM postbox.events e
LEFT JOIN LATERAL (
  SELECT (array_agg(status ORDER BY id DESC))[1] AS status, sum(attempt_count)::int AS attempts,
         (array_agg(last_status_code ORDER BY id DESC))[1] AS code
  FROM postbox.deliveries WHERE event_pk = e.id
) d ON true
WHERE (e.endpoint || '') = $1 AND e.ingested_at >= $2 AND coalesce(e.committed_at, e.ingested_at) >= $2
  AND ($3::timestamptz IS NULL OR (coalesce(e.committed_at, e.ingested_at) < $3 AND e.ingested_at < $3 + interval '1 day'))
  AND ($4 = '' OR e.event_type = $4)
  AND ($5::jsonb IS NULL OR (e.search IS NOT NULL AND e.search @> $5::jsonb))
  AND ($6 = '' OR coalesce(d.status, 'in_flight') = $6)
ORDER BY e.ingested_at DESC, e.id DESC
LIMIT $7`

// typesSQL are the event types the partner received in the period, for
// the filter's choices: from the report's rollups (a few rows an hour,
// folded and not yet folded),
// not the events (a busy partner's hundreds of thousands a day).
const typesSQL = `
SELECT DISTINCT event_type FROM (
  SELECT event_type FROM postbox.report_buckets WHERE endpoint = $1 AND bucket >= $2
  UNION ALL
  SELECT event_type FROM postbox.report_deltas WHERE endpoint = $1 AND bucket >= $2) t
WHERE event_type <> ''
ORDER BY 1 LIMIT 50`

// deliveries is the partner's deliveries of a period, with filters by
// status, event type and time, and search by a search_keys field.
func (p *Portal) deliveries(rq *request) error {
	q := rq.r.URL.Query()
	pg := deliveriesPage{Period: q.Get("period"), Status: q.Get("status"), Type: strings.TrimSpace(q.Get("type")),
		Key: q.Get("key"), Value: strings.TrimSpace(q.Get("value")), Since: strings.TrimSpace(q.Get("since")),
		Until: strings.TrimSpace(q.Get("until")), Periods: periods, Statuses: Statuses, Keys: rq.cfg.SearchKeys}
	if _, ok := periodDur[pg.Period]; !ok {
		pg.Period = "7d"
	}
	if !slices.Contains(Statuses, pg.Status) {
		pg.Status = ""
	}
	now := p.now()
	since := now.Add(-periodDur[pg.Period])
	var until *time.Time
	var problems []string
	if pg.Since != "" {
		t, err := parseTime(pg.Since)
		if err != nil {
			problems = append(problems, "From: "+err.Error())
		} else {
			since = t
		}
	}
	if pg.Until != "" {
		t, err := parseTime(pg.Until)
		if err != nil {
			problems = append(problems, "To: "+err.Error())
		} else {
			until = &t
		}
	}
	var search *string
	if pg.Value != "" {
		if len(rq.cfg.SearchKeys) == 0 {
			problems = append(problems, "Search is not available: no search keys are configured.")
		} else {
			if !slices.Contains(rq.cfg.SearchKeys, pg.Key) {
				pg.Key = rq.cfg.SearchKeys[0]
			}
			doc, _ := json.Marshal(map[string]string{pg.Key: pg.Value})
			s := string(doc)
			search = &s
		}
	}
	if len(problems) > 0 {
		pg.Error = strings.Join(problems, " ")
		p.render(rq.w, rq, http.StatusBadRequest, "deliveries", "Deliveries", "deliveries", pg)
		return nil
	}
	rows, err := rq.pool.Query(rq.ctx, deliveriesSQL, rq.endpoint, since, until, pg.Type, search, pg.Status, ListLimit+1)
	if err != nil {
		return err
	}
	for rows.Next() {
		var d deliveryRow
		var doc []byte
		if err := rows.Scan(&d.EventID, &d.EventType, &doc, &d.Committed, &d.Ingested, &d.Status, &d.Attempts, &d.LastCode); err != nil {
			rows.Close()
			return err
		}
		if len(doc) > 0 {
			_ = json.Unmarshal(doc, &d.Search)
		}
		pg.Rows = append(pg.Rows, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(pg.Rows) > ListLimit {
		pg.Rows, pg.Capped = pg.Rows[:ListLimit], true
	}
	if pg.Types, err = collect(rq, typesSQL, rq.endpoint, since); err != nil {
		return err
	}
	p.render(rq.w, rq, http.StatusOK, "deliveries", "Deliveries", "deliveries", pg)
	return nil
}

func collect(rq *request, sql string, args ...any) ([]string, error) {
	rows, err := rq.pool.Query(rq.ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// parseTime reads "2006-01-02", "2006-01-02 15:04", or RFC 3339 (UTC
// unless the text says otherwise).
func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("want a time such as 2026-01-02 or 2026-01-02 15:04 (UTC)")
}

type eventPage struct {
	EventID, EventType, Payload string
	CommittedAt                 *time.Time
	CreatedAt, IngestedAt       time.Time
	Deliveries                  []deliveryView
	CanReplay, ShowResponse     bool
}

type deliveryView struct {
	ID                  int64
	Status              string
	ByPartner, IsReplay bool
	Steps               []step
}

type step struct {
	When                   time.Time
	After, Class           string
	What, Detail, Response string
}

// eventNotFound is the answer for an event id the partner has no event
// of: the same whether the id is unknown or another partner's.
var eventNotFound = &httpError{http.StatusNotFound, "Event not found", "You have no event with this id (or it is older than the retention period)."}

// event is one event's timeline at the partner's endpoint: its commit,
// every delivery and attempt, and its payload (the partner's own data).
func (p *Portal) event(rq *request) error {
	id, ok := canonicalUUID(rq.r.PathValue("id"))
	if !ok {
		return eventNotFound
	}
	var pk int64
	pg := eventPage{EventID: id, ShowResponse: rq.cfg.Portal.ShowResponse}
	var payload []byte
	err := rq.pool.QueryRow(rq.ctx, `
		SELECT id, event_type, payload, committed_at, created_at, ingested_at FROM postbox.events
		WHERE event_id = $1::uuid AND endpoint = $2`, id, rq.endpoint).
		Scan(&pk, &pg.EventType, &payload, &pg.CommittedAt, &pg.CreatedAt, &pg.IngestedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return eventNotFound
	}
	if err != nil {
		return err
	}
	pg.Payload = prettyJSON(payload)
	from := pg.CreatedAt
	if pg.CommittedAt != nil {
		from = *pg.CommittedAt
	}
	rows, err := rq.pool.Query(rq.ctx, `
		SELECT d.id, d.status, d.replay_of IS NOT NULL, r.delivery_id IS NOT NULL, d.created_at, d.updated_at, d.delivered_at,
		       coalesce(d.last_error, '')
		FROM postbox.deliveries d LEFT JOIN postbox.portal_replays r ON r.delivery_id = d.id
		WHERE d.event_pk = $1 AND d.endpoint = $2 ORDER BY d.id`, pk, rq.endpoint)
	if err != nil {
		return err
	}
	type dl struct {
		v                deliveryView
		created, updated time.Time
		delivered        *time.Time
		lastError        string
	}
	var dls []dl
	var ids []int64
	for rows.Next() {
		var d dl
		if err := rows.Scan(&d.v.ID, &d.v.Status, &d.v.IsReplay, &d.v.ByPartner, &d.created, &d.updated, &d.delivered, &d.lastError); err != nil {
			rows.Close()
			return err
		}
		dls = append(dls, d)
		ids = append(ids, d.v.ID)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	attempts := map[int64][]step{}
	if len(ids) > 0 {
		rows, err := rq.pool.Query(rq.ctx, `
			SELECT delivery_id, attempt, started_at, duration_ms::float8, status_code, coalesce(error_class, ''), coalesce(error, ''),
			       coalesce(response, ''), coalesce(sent, '')
			FROM postbox.all_attempts WHERE delivery_id = ANY($1) AND endpoint = $2 ORDER BY delivery_id, attempt, started_at`, ids, rq.endpoint)
		if err != nil {
			return err
		}
		for rows.Next() {
			var did int64
			var n int
			var s step
			var dur float64
			var code *int
			var class, errText, resp, target string
			if err := rows.Scan(&did, &n, &s.When, &dur, &code, &class, &errText, &resp, &target); err != nil {
				rows.Close()
				return err
			}
			s.What = fmt.Sprintf("Attempt %d", n)
			switch {
			case code != nil && errText == "":
				s.What += fmt.Sprintf(" → HTTP %d", *code)
				s.Class = "ok"
			case code != nil:
				s.What += fmt.Sprintf(" → HTTP %d", *code)
				s.Class = "warn"
			default:
				s.What += " → no response"
				s.Class = "warn"
			}
			s.What += " in " + formatMS(dur)
			var detail []string
			if errText != "" {
				detail = append(detail, logsafe.Text(errText, true))
			}
			if target != "" {
				// The partner's own URL as the request was sent, query
				// included: it is its own data (redact_path is for the
				// operator's pages and the log).
				detail = append(detail, "to "+target)
			}
			s.Detail = strings.Join(detail, " · ")
			if rq.cfg.Portal.ShowResponse && resp != "" {
				s.Response = logsafe.Text(resp, true)
			}
			attempts[did] = append(attempts[did], s)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	for _, d := range dls {
		first := step{When: d.created, What: "Queued for delivery"}
		if !d.v.IsReplay {
			// A first attempt made straight from the stream starts before
			// its event's and delivery's rows are written: the event was
			// queued no later than that attempt.
			if pg.IngestedAt.Before(first.When) {
				first.When = pg.IngestedAt
			}
			if a := attempts[d.v.ID]; len(a) > 0 && a[0].When.Before(first.When) {
				first.When = a[0].When
				first.Detail = "sent straight from the stream, before its records were written"
			}
		}
		switch {
		case d.v.ByPartner:
			first.What = "Queued again: replayed by partner"
		case d.v.IsReplay:
			first.What = "Queued again: replayed by the sender"
		}
		steps := append([]step{first}, attempts[d.v.ID]...)
		switch postboxtype.DeliveryState(d.v.Status) {
		case postboxtype.DeliveryDelivered:
			at := d.updated
			if d.delivered != nil {
				at = *d.delivered
			}
			steps = append(steps, step{When: at, Class: "ok", What: "Delivered"})
		case postboxtype.DeliveryDeadLetter, postboxtype.DeliveryReplayed:
			steps = append(steps, step{When: d.updated, Class: "bad", What: "Dead-lettered: no more attempts", Detail: logsafe.Text(d.lastError, true)})
			pg.CanReplay = rq.cfg.Portal.AllowReplay && postboxtype.DeliveryState(d.v.Status) == postboxtype.DeliveryDeadLetter
		case postboxtype.DeliveryFailed:
			steps = append(steps, step{When: d.updated, Class: "warn", What: "Waiting to retry", Detail: logsafe.Text(d.lastError, true)})
		case postboxtype.DeliveryInFlight:
			steps = append(steps, step{When: d.updated, Class: "warn", What: "Attempt in flight"})
		}
		for i := range steps {
			after := steps[i].When.Sub(from)
			if after < 0 {
				// Clocks of two machines: never shown as before the commit.
				steps[i].After = "at commit"
			} else {
				steps[i].After = "+" + formatMS(float64(after)/float64(time.Millisecond))
			}
		}
		d.v.Steps = steps
		pg.Deliveries = append(pg.Deliveries, d.v)
	}
	if len(dls) > 0 {
		// Only the latest delivery's state counts for a resend.
		pg.CanReplay = rq.cfg.Portal.AllowReplay && dls[len(dls)-1].v.Status == string(postboxtype.DeliveryDeadLetter)
	}
	p.render(rq.w, rq, http.StatusOK, "event", "Event", "deliveries", pg)
	return nil
}

func prettyJSON(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(b)
	}
	return string(out)
}

// canonicalUUID returns s as PostgreSQL prints a uuid, or false.
func canonicalUUID(s string) (string, bool) {
	s = strings.ToLower(strings.ReplaceAll(s, "-", ""))
	if len(s) != 32 {
		return "", false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return "", false
		}
	}
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:], true
}

type healthPage struct {
	Stats                *telemetry.EndpointStats
	Attempts, Successful int64
	Rate                 float64
	Paused               bool
}

// health is the partner's endpoint: success rate and latency over 24
// hours, breaker state, pause. Attempts are counted where they are kept:
// postbox.attempts, and a first attempt that delivered on its delivery's
// row (by the indexes of each, not the all_attempts view's union).
func (p *Portal) health(rq *request) error {
	pg := healthPage{}
	eps, err := telemetry.LoadEndpointsRefreshed(rq.ctx, rq.pool, rq.endpoint)
	if err != nil {
		return err
	}
	if len(eps) == 1 {
		pg.Stats = &eps[0]
		pg.Paused = pg.Stats.PausedUntil != nil && pg.Stats.PausedUntil.After(p.now())
	}
	if err := rq.pool.QueryRow(rq.ctx, `
		SELECT (SELECT count(*) FROM postbox.attempts WHERE endpoint = $1 AND started_at >= now() - interval '24 hours')
		     + (SELECT count(*) FROM postbox.deliveries WHERE endpoint = $1 AND status = 'delivered' AND attempted_by IS NOT NULL
		          AND delivered_at >= now() - interval '24 hours'),
		       (SELECT count(*) FROM postbox.attempts WHERE endpoint = $1 AND started_at >= now() - interval '24 hours' AND outcome = 'delivered')
		     + (SELECT count(*) FROM postbox.deliveries WHERE endpoint = $1 AND status = 'delivered' AND attempted_by IS NOT NULL
		          AND delivered_at >= now() - interval '24 hours')`, rq.endpoint).Scan(&pg.Attempts, &pg.Successful); err != nil {
		return err
	}
	if pg.Attempts > 0 {
		pg.Rate = float64(pg.Successful) / float64(pg.Attempts)
	}
	p.render(rq.w, rq, http.StatusOK, "health", "Health", "health", pg)
	return nil
}

type verifyPage struct {
	Secrets                       []string
	ShowSecret                    bool
	HeaderID, HeaderTS, HeaderSig string
}

// verify says how to check a delivery's signature; the partner's own
// secret(s) only with portal.show_secret.
func (p *Portal) verify(rq *request) error {
	pg := verifyPage{ShowSecret: rq.cfg.Portal.ShowSecret, HeaderID: outbox.HeaderID, HeaderTS: outbox.HeaderTimestamp,
		HeaderSig: outbox.HeaderSignature}
	if pg.ShowSecret {
		ep := rq.cfg.Endpoint(rq.endpoint)
		for _, s := range rq.cfg.SigningSecrets(ep) {
			pg.Secrets = append(pg.Secrets, s.Reveal())
		}
	}
	p.render(rq.w, rq, http.StatusOK, "verify", "Verify signatures", "verify", pg)
	return nil
}

// replay resends one of the partner's own dead letters: its latest
// delivery must be a dead letter of this endpoint; rate-limited per
// endpoint, logged with the link's id.
func (p *Portal) replay(rq *request) (string, error) {
	if !rq.cfg.Portal.AllowReplay {
		return "", &httpError{http.StatusForbidden, "Not allowed", "Resending is not enabled for this portal."}
	}
	id, ok := canonicalUUID(strings.TrimSpace(rq.r.PostFormValue("event_id")))
	if !ok {
		return "", eventNotFound
	}
	var exists bool
	if err := rq.pool.QueryRow(rq.ctx, `SELECT EXISTS (SELECT 1 FROM postbox.events WHERE event_id = $1::uuid AND endpoint = $2)`,
		id, rq.endpoint).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		return "", eventNotFound
	}
	if !p.limits.allow("replay|"+rq.endpoint, ReplaysPerMinute) {
		return "", &httpError{http.StatusTooManyRequests, "Too many resends", fmt.Sprintf("At most %d resends a minute: wait a moment.", ReplaysPerMinute)}
	}
	f := postboxtype.ReplayFilter{Endpoint: rq.endpoint, EventIDs: []string{id}, DeadLetters: true}
	_, n, err := ops.Replay(rq.ctx, rq.pool, rq.cfg, f, false, 0)
	if err != nil {
		return "", err
	}
	back := Prefix + "events/" + id
	if n == 0 {
		return back + "?done=nothing", nil
	}
	if _, err := rq.pool.Exec(rq.ctx, `
		INSERT INTO postbox.portal_replays (delivery_id, endpoint, link_id)
		SELECT max(d.id), $2, $3 FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1::uuid AND e.endpoint = $2 AND d.replay_of IS NOT NULL
		HAVING max(d.id) IS NOT NULL
		ON CONFLICT DO NOTHING`, id, rq.endpoint, rq.claims.LinkID); err != nil {
		return "", err
	}
	p.log.Info().Str("endpoint", rq.endpoint).Str("event_id", id).Str("link", rq.claims.LinkID).Msg("portal replay by partner")
	return back + "?done=replayed", nil
}
