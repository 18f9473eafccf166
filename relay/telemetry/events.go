package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Event search limits.
const (
	// EventLimitDefault is how many events a search returns when its
	// filter sets no limit.
	EventLimitDefault = 50
	// EventLimitMax is the most events one search returns.
	EventLimitMax = 1000
)

var (
	// ErrSearchKeyNotConfigured is the error of a payload search by a key
	// that search_keys does not list: such fields are not indexed.
	ErrSearchKeyNotConfigured = errors.New("payload key is not a configured search key")
	// ErrUnknownStatus is the error of a search by a status no delivery has.
	ErrUnknownStatus = errors.New("unknown delivery status")
	// ErrEventNotFound is the error of a story asked for an event id that
	// postbox has not ingested (or has purged after event_retention).
	ErrEventNotFound = errors.New("no event")
)

// EventStatuses are the delivery states a search can filter by.
var EventStatuses = []string{
	string(postboxtype.DeliveryPending), string(postboxtype.DeliveryInFlight), string(postboxtype.DeliveryFailed),
	string(postboxtype.DeliveryDelivered), string(postboxtype.DeliveryDeadLetter), string(postboxtype.DeliveryReplayed),
}

// EventFilter selects events. Zero fields do not filter.
type EventFilter struct {
	Endpoint string
	// Type is the event type ("" for any).
	Type string
	// After continues a search past the last event of a previous page:
	// its NextCursor ("" for the first page).
	After string
	// Status is the state of the event's latest delivery (one of
	// EventStatuses).
	Status string
	// Since and Until bound the event's commit time (its ingest time when
	// the commit time is unknown): Since <= t < Until.
	Since, Until time.Time
	// Payload are search_keys fields and the values they must have (as
	// text: a number 42 matches "42"). See CheckSearchKeys.
	Payload map[string]string
	// Limit caps the answer: EventLimitDefault when 0, at most
	// EventLimitMax.
	Limit int
}

// CheckSearchKeys returns an error wrapping ErrSearchKeyNotConfigured when
// payload names a field that cfgKeys (the configuration's search_keys)
// does not list, saying how to add it.
func CheckSearchKeys(cfgKeys []string, payload map[string]string) error {
	var missing []string
	for k := range payload {
		if !slices.Contains(cfgKeys, k) {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	for _, k := range missing {
		if !validSearchKey(k) {
			return fmt.Errorf("%w: %q cannot be one: search_keys are top-level payload field names (letters, digits, _ and -, at most 64)",
				ErrSearchKeyNotConfigured, k)
		}
	}
	quoted := make([]string, len(missing))
	for i, k := range missing {
		quoted[i] = fmt.Sprintf("%q", k)
	}
	return fmt.Errorf("%w: %s; add it to the configuration (search_keys: [%s]) and reload or restart postbox. "+
		"Only events ingested after that can be found by it: events ingested before the key was added are not indexed",
		ErrSearchKeyNotConfigured, strings.Join(quoted, ", "), strings.Join(append(slices.Clone(cfgKeys), missing...), ", "))
}

// validSearchKey is the configuration's rule for search_keys.
func validSearchKey(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for _, r := range k {
		ok := r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !ok {
			return false
		}
	}
	return true
}

// eventTimeSQL is an event's time in searches: its commit time, its
// ingest time when found by reconciliation (no commit known).
const eventTimeSQL = `coalesce(e.committed_at, e.ingested_at)`

// latestStatusSQL is true when the state of an event's latest delivery is
// %s. Spelled as a semi-join, it lets the planner start from the
// deliveries in a rare state (their partial indexes: a dead letter among
// millions delivered) or from the newest events for a common one.
// With an endpoint, the deliveries are narrowed to it too (%s), so a rare
// state of one endpoint starts from that endpoint's part of the index.
const latestStatusSQL = `e.id IN (
  SELECT d.event_pk FROM postbox.deliveries d
  WHERE d.status = %s%s AND NOT EXISTS (SELECT 1 FROM postbox.deliveries n WHERE n.event_pk = d.event_pk AND n.id > d.id))`

// underWaySQL is true for an event under way: in flight in an instance's
// memory, its delivery not written yet.
const underWaySQL = `e.id IN (SELECT event_pk FROM postbox.events_under_way)`

// Searches order events by commit time, and no index does: the commit
// time is not known for every event (reconciliation finds some without),
// and a second index on events would slow every ingest. Events are
// numbered as they are ingested, and an event is ingested after it
// commits (both times from the database's clock). So a search runs in two
// steps. searchBoundSQL takes the $1 matching events ingested last (the
// highest ids, through the primary key): none of the events ingested
// before the earliest commit time among them can be in the answer, as $1
// events at least as recent are known. searchEventsSQL then reads only the
// events ingested since that bound (events_ingested_at), as many as were
// ingested since (normally about $1), and orders those. Both read the conditions %[1]s (on e); a
// payload filter finds its events through events_search instead.
const searchBoundSQL = `
SELECT min(h.t) FROM (
  SELECT ` + eventTimeSQL + ` AS t FROM postbox.events e
  WHERE %[1]s
  ORDER BY e.id DESC LIMIT $1) h`

// searchEventsSQL: the bound is the last argument, %[2]s.
const searchEventsSQL = `
SELECT e.event_id::text, e.endpoint, e.event_type, coalesce(d.status, 'in_flight'), coalesce(d.attempts, 0), e.committed_at,
       ` + eventTimeSQL + `, e.id
FROM (
  SELECT e.id, e.event_id, e.endpoint, e.event_type, e.committed_at, e.ingested_at FROM postbox.events e
  WHERE e.ingested_at >= %[2]s AND %[1]s
  ORDER BY ` + eventTimeSQL + ` DESC, e.id DESC
  LIMIT $1
) e
LEFT JOIN LATERAL (
  SELECT (array_agg(status ORDER BY id DESC))[1] AS status, sum(attempt_count)::int AS attempts
  FROM postbox.deliveries WHERE event_pk = e.id
) d ON true
ORDER BY ` + eventTimeSQL + ` DESC, e.id DESC`

// searchEventsQuery returns the two statements of f and their arguments
// (the second takes one more: the first's answer).
func searchEventsQuery(f EventFilter) (bound, list string, args []any, err error) {
	limit := f.Limit
	if limit <= 0 {
		limit = EventLimitDefault
	}
	limit = min(limit, EventLimitMax)
	args = []any{limit}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	var conds []string
	endpoint := ""
	if f.Endpoint != "" {
		endpoint = arg(f.Endpoint)
		conds = append(conds, "e.endpoint = "+endpoint)
	}
	if f.Type != "" {
		conds = append(conds, "e.event_type = "+arg(f.Type))
	}
	if f.After != "" {
		at, id, err := parseCursor(f.After)
		if err != nil {
			return "", "", nil, err
		}
		// Older than the page's last event, in the list's order.
		conds = append(conds, "("+eventTimeSQL+", e.id) < ("+arg(at)+"::timestamptz, "+arg(id)+"::int8)")
	}
	if f.Status != "" {
		if !slices.Contains(EventStatuses, f.Status) {
			return "", "", nil, fmt.Errorf("%w %q: want one of %s", ErrUnknownStatus, f.Status, strings.Join(EventStatuses, ", "))
		}
		narrow := ""
		if endpoint != "" {
			narrow = " AND d.endpoint = " + endpoint
		}
		cond := fmt.Sprintf(latestStatusSQL, arg(f.Status), narrow)
		if f.Status == string(postboxtype.DeliveryInFlight) {
			cond = "(" + cond + " OR " + underWaySQL + ")"
		}
		conds = append(conds, cond)
	}
	if !f.Since.IsZero() {
		p := arg(f.Since)
		// Ingested no earlier than committed: the ingest time bounds the
		// index range.
		conds = append(conds, "e.ingested_at >= "+p, eventTimeSQL+" >= "+p)
	}
	if !f.Until.IsZero() {
		conds = append(conds, eventTimeSQL+" < "+arg(f.Until))
	}
	if len(f.Payload) > 0 {
		doc, err := json.Marshal(f.Payload)
		if err != nil {
			return "", "", nil, fmt.Errorf("payload filter: %w", err)
		}
		// Containment, the one operator events_search (jsonb_path_ops)
		// serves; the partial index's predicate is spelled out.
		conds = append(conds, "e.search IS NOT NULL", "e.search @> "+arg(string(doc))+"::jsonb")
	}
	where := "true"
	if len(conds) > 0 {
		where = strings.Join(conds, " AND ")
	}
	return fmt.Sprintf(searchBoundSQL, where), fmt.Sprintf(searchEventsSQL, where, fmt.Sprintf("$%d", len(args)+1)), args, nil
}

// SearchEvents returns the events f selects, the newest first (by commit
// time, by ingest time when the commit is unknown). It returns an error
// wrapping ErrUnknownStatus for a status no delivery has; check payload
// keys against the configuration with CheckSearchKeys first.
func SearchEvents(ctx context.Context, q Querier, f EventFilter) ([]postboxtype.EventSummary, error) {
	out, _, err := SearchEventsPage(ctx, q, f)
	return out, err
}

// SearchEventsPage is SearchEvents, with the cursor of the page that
// follows (EventFilter.After) when this one is full ("" when it is the
// last): paging goes as far back as events are kept, Limit at a time.
func SearchEventsPage(ctx context.Context, q Querier, f EventFilter) (page []postboxtype.EventSummary, next string, err error) {
	boundSQL, listSQL, args, err := searchEventsQuery(f)
	if err != nil {
		return nil, "", err
	}
	out := []postboxtype.EventSummary{}
	var bound *time.Time
	if err := q.QueryRow(ctx, boundSQL, args...).Scan(&bound); err != nil {
		return nil, "", fmt.Errorf("search events: %w", err)
	}
	if bound == nil {
		return out, "", nil // nothing matches
	}
	rows, err := q.Query(ctx, listSQL, append(args, *bound)...)
	if err != nil {
		return nil, "", fmt.Errorf("search events: %w", err)
	}
	defer rows.Close()
	var lastAt time.Time
	var lastID int64
	for rows.Next() {
		var e postboxtype.EventSummary
		if err := rows.Scan(&e.EventID, &e.Endpoint, &e.EventType, &e.Status, &e.Attempts, &e.CommittedAt, &lastAt, &lastID); err != nil {
			return nil, "", fmt.Errorf("search events: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("search events: %w", err)
	}
	if len(out) == searchLimit(f) {
		next = fmt.Sprintf("%d_%d", lastAt.UnixMicro(), lastID)
	}
	return out, next, nil
}

// ErrBadCursor is a search's After that no page gave.
var ErrBadCursor = errors.New("not a cursor of a previous page")

// parseCursor reads a NextCursor: the last event's time in microseconds
// and its row id.
func parseCursor(c string) (time.Time, int64, error) {
	us, id, ok := strings.Cut(c, "_")
	t, err1 := strconv.ParseInt(us, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, 0, fmt.Errorf("%w: %q", ErrBadCursor, printable(c))
	}
	return time.UnixMicro(t), n, nil
}

// searchLimit is the page size f asks for.
func searchLimit(f EventFilter) int {
	if f.Limit <= 0 {
		return EventLimitDefault
	}
	return min(f.Limit, EventLimitMax)
}

// canonicalUUID returns s as PostgreSQL's canonical text of a uuid, or
// false when s is not one (hyphens anywhere and braces around are
// accepted, as PostgreSQL does).
func canonicalUUID(s string) (string, bool) {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
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

// printable drops control characters, so an id from the command line
// cannot rewrite the operator's terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
}

// LoadEvent returns the stories of eventID, one per endpoint it went to
// (in endpoint order), each with its deliveries in id order and their
// attempts in order. For an id postbox does not hold it returns an empty
// slice and an error wrapping ErrEventNotFound.
func LoadEvent(ctx context.Context, q Querier, eventID string) ([]postboxtype.EventStory, error) {
	stories := []postboxtype.EventStory{}
	id, ok := canonicalUUID(eventID)
	if !ok {
		return stories, fmt.Errorf("%w %s (an event id is a UUID)", ErrEventNotFound, printable(eventID))
	}
	rows, err := q.Query(ctx, `
		SELECT id, event_id::text, endpoint, event_type, matched, coalesce(commit_lsn::text, ''), committed_at, created_at, ingested_at
		FROM postbox.events WHERE event_id = $1::uuid ORDER BY endpoint`, id)
	if err != nil {
		return stories, fmt.Errorf("event %s: %w", id, err)
	}
	var pks []int64
	byPK := map[int64]int{}
	for rows.Next() {
		var s postboxtype.EventStory
		var pk int64
		if err := rows.Scan(&pk, &s.EventID, &s.Endpoint, &s.EventType, &s.Matched, &s.CommitLSN, &s.CommittedAt, &s.CreatedAt, &s.IngestedAt); err != nil {
			rows.Close()
			return []postboxtype.EventStory{}, fmt.Errorf("event %s: %w", id, err)
		}
		s.Deliveries = []postboxtype.DeliveryStory{}
		byPK[pk] = len(stories)
		pks = append(pks, pk)
		stories = append(stories, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return []postboxtype.EventStory{}, fmt.Errorf("event %s: %w", id, err)
	}
	if len(stories) == 0 {
		return stories, fmt.Errorf("%w %s", ErrEventNotFound, id)
	}

	rows, err = q.Query(ctx, `
		SELECT id, event_pk, status, replay_of, url, created_at, updated_at, delivered_at, coalesce(last_error, '')
		FROM postbox.deliveries WHERE event_pk = ANY($1) ORDER BY id`, pks)
	if err != nil {
		return []postboxtype.EventStory{}, fmt.Errorf("event %s: deliveries: %w", id, err)
	}
	type ref struct{ story, delivery int }
	var ids []int64
	byID := map[int64]ref{}
	for rows.Next() {
		var d postboxtype.DeliveryStory
		var pk int64
		var retarget *string
		if err := rows.Scan(&d.ID, &pk, &d.Status, &d.ReplayOf, &retarget, &d.CreatedAt, &d.UpdatedAt, &d.DeliveredAt, &d.LastError); err != nil {
			rows.Close()
			return []postboxtype.EventStory{}, fmt.Errorf("event %s: deliveries: %w", id, err)
		}
		switch {
		case retarget == nil:
		case *retarget == "":
			d.Retarget = postboxtype.RetargetEndpointURL
		default:
			d.Retarget = logsafe.URL(*retarget)
		}
		d.Attempts = []postboxtype.AttemptRecord{}
		s := &stories[byPK[pk]]
		byID[d.ID] = ref{byPK[pk], len(s.Deliveries)}
		ids = append(ids, d.ID)
		s.Deliveries = append(s.Deliveries, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return []postboxtype.EventStory{}, fmt.Errorf("event %s: deliveries: %w", id, err)
	}
	if len(ids) < len(pks) {
		if err := readUnderWay(ctx, q, pks, byPK, stories); err != nil {
			return []postboxtype.EventStory{}, fmt.Errorf("event %s: %w", id, err)
		}
	}
	if len(ids) == 0 {
		return stories, nil
	}

	rows, err = q.Query(ctx, `
		SELECT delivery_id, `+attemptColumns+`
		FROM postbox.all_attempts a WHERE a.delivery_id = ANY($1) ORDER BY a.delivery_id, a.attempt, a.started_at`, ids)
	if err != nil {
		return []postboxtype.EventStory{}, fmt.Errorf("event %s: attempts: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var a postboxtype.AttemptRecord
		var deliveryID int64
		if err := rows.Scan(append([]any{&deliveryID}, attemptScanTargets(&a)...)...); err != nil {
			return []postboxtype.EventStory{}, fmt.Errorf("event %s: attempts: %w", id, err)
		}
		roundMS(&a.DurationMS)
		r := byID[deliveryID]
		d := &stories[r.story].Deliveries[r.delivery]
		d.Attempts = append(d.Attempts, a)
	}
	if err := rows.Err(); err != nil {
		return []postboxtype.EventStory{}, fmt.Errorf("event %s: attempts: %w", id, err)
	}
	return stories, nil
}

// readUnderWay names the instance holding each of the stories' events
// under way.
func readUnderWay(ctx context.Context, q Querier, pks []int64, byPK map[int64]int, stories []postboxtype.EventStory) error {
	rows, err := q.Query(ctx, `SELECT event_pk, owner FROM postbox.events_under_way WHERE event_pk = ANY($1)`, pks)
	if err != nil {
		return fmt.Errorf("under way: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var pk int64
		var owner string
		if err := rows.Scan(&pk, &owner); err != nil {
			return fmt.Errorf("under way: %w", err)
		}
		stories[byPK[pk]].UnderWayAt = owner
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("under way: %w", err)
	}
	return nil
}

// attemptTableColumns are postbox.attempts' columns, as attemptsOnDeliveries
// and postbox.all_attempts name them.
const attemptTableColumns = `delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
       error_class, error, response, target, instance, sent`

// attemptsOnDeliveries selects the first attempts kept on their deliveries
// (migration 026) with attemptTableColumns: postbox.all_attempts' second
// branch. Their start is computed, so readers that look for them by time
// add a condition on delivered_at (at or after the start), which
// deliveries_first_attempt (by endpoint) and deliveries_delivered_at serve.
const attemptsOnDeliveries = `
SELECT id AS delivery_id, endpoint, 1 AS attempt, delivered_at - last_response_ms * interval '1 millisecond' AS started_at,
       last_response_ms AS duration_ms, last_status_code AS status_code, 'delivered'::text AS outcome,
       NULL::text AS error_class, last_error AS error, last_response AS response, attempt_target AS target,
       attempted_by AS instance, attempt_sent AS sent
FROM postbox.deliveries WHERE status = 'delivered' AND attempted_by IS NOT NULL`

// attemptColumns are a postboxtype.AttemptRecord's columns of postbox.attempts a, in
// attemptScanTargets order.
const attemptColumns = `a.attempt, a.started_at, a.status_code, a.duration_ms::float8, coalesce(a.error, ''),
       coalesce(a.error_class, ''), coalesce(a.response, ''), coalesce(a.target, ''), a.instance, coalesce(a.sent, a.target, '')`

func attemptScanTargets(a *postboxtype.AttemptRecord) []any {
	return []any{&a.Attempt, &a.StartedAt, &a.StatusCode, &a.DurationMS, &a.Error, &a.ErrorClass, &a.Response, &a.Target, &a.Instance, &a.Sent}
}

// ResponseForOperator is an attempt's stored response body as the
// operator may see it, in the console and the CLI alike: hidden (hidden
// true) unless log_payloads, a partner's body may echo the payload or a
// token; with it, secrets removed still.
func ResponseForOperator(response string, logPayloads bool) (shown string, hidden bool) {
	switch {
	case response == "":
		return "", false
	case !logPayloads:
		return "", true
	}
	return logsafe.Text(response, true), false
}

// ForOperator applies to stories what the operator may see of them, the
// same in the console and the CLI: the response bodies
// (ResponseForOperator) and the targets as sent (SentForOperator, under
// each story's endpoint's redact_path).
func ForOperator(stories []postboxtype.EventStory, cfg *config.Config) {
	for i := range stories {
		redact := cfg.Endpoint(stories[i].Endpoint).RedactPath
		for j := range stories[i].Deliveries {
			for k := range stories[i].Deliveries[j].Attempts {
				a := &stories[i].Deliveries[j].Attempts[k]
				a.Response, a.ResponseHidden = ResponseForOperator(a.Response, cfg.LogPayloads)
				a.Sent = SentForOperator(a.Sent, redact, cfg.LogPayloads)
			}
		}
	}
}

// SentForOperator is an attempt's target as sent (AttemptRecord.Sent),
// as the operator may see it: only with log_payloads (the query is the
// partner's data, as the payload is), and with the endpoint's
// redact_path applied. "" when it may not be shown.
func SentForOperator(sent string, redact config.RedactPath, logPayloads bool) string {
	if !logPayloads || sent == "" {
		return ""
	}
	if redact == 0 {
		return sent
	}
	u, err := url.Parse(sent)
	if err != nil {
		return ""
	}
	u.RawPath = redact.Redacted(u.EscapedPath())
	u.Path, _ = url.PathUnescape(u.RawPath)
	return u.String()
}

// recentAttemptsSQL is RecentAttempts' statement: the newest $2 of
// endpoint $1's attempt rows and of the attempts kept on its deliveries,
// each read newest first by its index, then the newest $2 of both. (The
// kept ones are taken newest delivered first: one delivered later but
// started earlier than the last taken may be missed, by the length of its
// request.)
const recentAttemptsSQL = `
		SELECT a.delivery_id, a.endpoint, coalesce(e.event_id::text, ''), ` + attemptColumns + `
		FROM ((SELECT ` + attemptTableColumns + ` FROM postbox.attempts WHERE endpoint = $1 ORDER BY started_at DESC LIMIT $2)
		      UNION ALL
		      (` + attemptsOnDeliveries + ` AND endpoint = $1 ORDER BY delivered_at DESC LIMIT $2)) AS a
		LEFT JOIN postbox.deliveries d ON d.id = a.delivery_id
		LEFT JOIN postbox.events e ON e.id = d.event_pk
		WHERE a.endpoint = $1
		ORDER BY a.started_at DESC
		LIMIT $2`

// RecentAttempts returns endpoint's latest attempts, the newest first, at
// most limit (EventLimitDefault when 0, at most EventLimitMax).
func RecentAttempts(ctx context.Context, q Querier, endpoint string, limit int) ([]postboxtype.AttemptRow, error) {
	if endpoint == "" {
		return nil, errors.New("recent attempts: no endpoint given")
	}
	if limit <= 0 {
		limit = EventLimitDefault
	}
	limit = min(limit, EventLimitMax)
	rows, err := q.Query(ctx, recentAttemptsSQL, endpoint, limit)
	if err != nil {
		return nil, fmt.Errorf("recent attempts of %s: %w", endpoint, err)
	}
	defer rows.Close()
	out := []postboxtype.AttemptRow{}
	for rows.Next() {
		var a postboxtype.AttemptRow
		if err := rows.Scan(append([]any{&a.DeliveryID, &a.Endpoint, &a.EventID}, attemptScanTargets(&a.AttemptRecord)...)...); err != nil {
			return nil, fmt.Errorf("recent attempts of %s: %w", endpoint, err)
		}
		roundMS(&a.DurationMS)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recent attempts of %s: %w", endpoint, err)
	}
	return out, nil
}

// MinuteCount is one minute's attempts: those that delivered their event
// and those that did not (to be retried, or dead letters).
type MinuteCount struct {
	Minute    time.Time `json:"minute"`
	Delivered int       `json:"delivered"`
	Failed    int       `json:"failed"`
}

// PerMinuteDefault is the range DeliveriesPerMinute covers when asked for
// none; PerMinuteMax the longest it covers.
const (
	PerMinuteDefault = time.Hour
	PerMinuteMax     = 7 * 24 * time.Hour
)

// perMinuteSQL is DeliveriesPerMinute's statement: the attempts since
// $1 seconds ago, rows and kept ones (by delivered_at), per minute.
const perMinuteSQL = `
		WITH r AS (
		  SELECT date_bin('1 minute', now() - $1 * interval '1 second', timestamptz '2000-01-01 00:00:00+00') AS first,
		         date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00') AS last
		),
		c AS (
		  SELECT date_bin('1 minute', a.started_at, timestamptz '2000-01-01 00:00:00+00') AS minute,
		         count(*) FILTER (WHERE a.outcome = 'delivered') AS delivered,
		         count(*) FILTER (WHERE a.outcome <> 'delivered') AS failed
		  FROM ((SELECT started_at, outcome FROM postbox.attempts, r WHERE started_at >= r.first)
		        UNION ALL
		        (SELECT a.started_at, a.outcome FROM (` + attemptsOnDeliveries + ` AND delivered_at >= (SELECT first FROM r)) AS a, r
		         WHERE a.started_at >= r.first)) AS a
		  GROUP BY 1
		)
		SELECT m.minute, coalesce(c.delivered, 0)::int, coalesce(c.failed, 0)::int
		FROM r, generate_series(r.first, r.last, interval '1 minute') AS m(minute)
		LEFT JOIN c ON c.minute = m.minute
		ORDER BY m.minute`

// DeliveriesPerMinute counts the attempts of every minute from since ago
// to now (PerMinuteDefault when 0, at most PerMinuteMax), oldest first,
// every minute present (zero when nothing was attempted in it).
func DeliveriesPerMinute(ctx context.Context, q Querier, since time.Duration) ([]MinuteCount, error) {
	if since <= 0 {
		since = PerMinuteDefault
	}
	since = min(since, PerMinuteMax)
	rows, err := q.Query(ctx, perMinuteSQL, since.Seconds())
	if err != nil {
		return nil, fmt.Errorf("deliveries per minute: %w", err)
	}
	defer rows.Close()
	out := []MinuteCount{}
	for rows.Next() {
		var m MinuteCount
		if err := rows.Scan(&m.Minute, &m.Delivered, &m.Failed); err != nil {
			return nil, fmt.Errorf("deliveries per minute: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deliveries per minute: %w", err)
	}
	return out, nil
}

// LatencyPoint is an endpoint's attempt latency in one five-minute bin.
type LatencyPoint struct {
	Bin   time.Time `json:"bin"` // the start of its five minutes
	P50MS float64   `json:"p50_ms"`
	P95MS float64   `json:"p95_ms"`
	P99MS float64   `json:"p99_ms"`
	Count int64     `json:"count"`
}

// latencySeriesSQL finds, per bin, the first bucket whose cumulative count
// reaches each fraction: the rule of histogramPercentilesSQL, bin by bin.
const latencySeriesSQL = `
WITH c AS (
  SELECT bin, bucket,
         sum(count) OVER (PARTITION BY bin ORDER BY bucket) AS upto,
         sum(count) OVER (PARTITION BY bin) AS total
  FROM postbox.latency_histogram
  WHERE endpoint = $1 AND bin >= postbox.latency_bin(now() - $2 * interval '1 second')
)
SELECT bin, max(total)::int8,
       postbox.latency_bucket_ms(min(bucket) FILTER (WHERE upto >= 0.50 * total))::float8,
       postbox.latency_bucket_ms(min(bucket) FILTER (WHERE upto >= 0.95 * total))::float8,
       postbox.latency_bucket_ms(min(bucket) FILTER (WHERE upto >= 0.99 * total))::float8
FROM c
GROUP BY bin
ORDER BY bin`

// LatencySeries returns endpoint's p50/p95/p99 per five-minute bin over
// the rolling window (Window), oldest first, from the latency histograms
// (each within 2 % of the exact percentile). Bins without attempts are
// absent.
func LatencySeries(ctx context.Context, q Querier, endpoint string) ([]LatencyPoint, error) {
	rows, err := q.Query(ctx, latencySeriesSQL, endpoint, Window.Seconds())
	if err != nil {
		return nil, fmt.Errorf("latency series of %s: %w", endpoint, err)
	}
	defer rows.Close()
	out := []LatencyPoint{}
	for rows.Next() {
		var p LatencyPoint
		if err := rows.Scan(&p.Bin, &p.Count, &p.P50MS, &p.P95MS, &p.P99MS); err != nil {
			return nil, fmt.Errorf("latency series of %s: %w", endpoint, err)
		}
		roundMS(&p.P50MS, &p.P95MS, &p.P99MS)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("latency series of %s: %w", endpoint, err)
	}
	return out, nil
}
