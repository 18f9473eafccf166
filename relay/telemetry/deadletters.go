package telemetry

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// ListDeadLetters returns dead letters since since (newest first), of one
// endpoint when endpoint is set, at most limit.
func ListDeadLetters(ctx context.Context, q Querier, endpoint string, since time.Time, limit int) ([]postboxtype.DeadLetter, error) {
	rows, err := q.Query(ctx, `
		SELECT d.id, e.event_id::text, d.endpoint, e.event_type, d.attempt_count, coalesce(d.last_error, ''),
		       d.last_status_code, d.created_at, d.updated_at, coalesce(e.commit_lsn::text, '')
		FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE d.status = 'dead_letter' AND d.updated_at >= $1 AND ($2 = '' OR d.endpoint = $2)
		ORDER BY d.updated_at DESC, d.id DESC LIMIT $3`, since, endpoint, limit)
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	defer rows.Close()
	var out []postboxtype.DeadLetter
	for rows.Next() {
		var d postboxtype.DeadLetter
		if err := rows.Scan(&d.DeliveryID, &d.EventID, &d.Endpoint, &d.EventType, &d.AttemptCount, &d.LastError,
			&d.LastStatusCode, &d.CreatedAt, &d.DeadAt, &d.CommitLSN); err != nil {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Dead-letter patterns, the seed's and those of bad input.
const (
	PatternOutageCluster = "outage_cluster"
	PatternCredentials   = "credentials_changed"
	PatternRateLimited   = "rate_limited"
	PatternGradual       = "gradual_accumulation"
	PatternBadInput      = "bad_input"
	PatternOther         = "other"
	// PatternTemplateError: the url or body template needs a payload
	// field the events lack; resending the same payloads fails again.
	PatternTemplateError = "template_error"
	// PatternRefused: nothing accepted connections at the url's host and
	// port (the receiver down, or a wrong port).
	PatternRefused = "connection_refused"
)

// Analysis is one endpoint's dead letters, their pattern and what to do.
type Analysis struct {
	Endpoint          string    `json:"endpoint"`
	DeadCount         int64     `json:"dead_count"`
	PrimaryError      string    `json:"primary_error"`
	PrimaryStatusCode *int      `json:"primary_status_code"`
	FirstDead         time.Time `json:"first_dead"`
	LastDead          time.Time `json:"last_dead"`
	AvgAttempts       float64   `json:"avg_attempts"`
	MaxInOneHour      int64     `json:"max_in_one_hour"`
	AuthFailures      int64     `json:"auth_failures"` // 401 and 403
	RateLimited       int64     `json:"rate_limited"`  // 429
	Pattern           string    `json:"pattern"`
	Advice            string    `json:"advice"`
}

// AnalyzeDeadLetters groups the dead letters since since by endpoint (the
// seed's analysis) and names each endpoint's pattern with advice.
func AnalyzeDeadLetters(ctx context.Context, q Querier, endpoint string, since time.Time) ([]Analysis, error) {
	rows, err := q.Query(ctx, `
		WITH dl AS (
		  SELECT endpoint, last_error, last_status_code, attempt_count, updated_at
		  FROM postbox.deliveries
		  WHERE status = 'dead_letter' AND updated_at >= $1 AND ($2 = '' OR endpoint = $2)
		),
		hours AS (
		  SELECT endpoint, max(n) AS max_hour FROM (
		    SELECT endpoint, count(*) AS n FROM dl GROUP BY endpoint, date_trunc('hour', updated_at)) h
		  GROUP BY endpoint
		)
		SELECT dl.endpoint, count(*),
		       mode() WITHIN GROUP (ORDER BY coalesce(dl.last_error, '')),
		       mode() WITHIN GROUP (ORDER BY dl.last_status_code),
		       min(dl.updated_at), max(dl.updated_at), avg(dl.attempt_count)::float8,
		       max(hours.max_hour),
		       count(*) FILTER (WHERE dl.last_status_code IN (401, 403)),
		       count(*) FILTER (WHERE dl.last_status_code = 429)
		FROM dl JOIN hours USING (endpoint)
		GROUP BY dl.endpoint
		ORDER BY count(*) DESC, dl.endpoint
		LIMIT 100`, since, endpoint)
	if err != nil {
		return nil, fmt.Errorf("dead-letter analysis: %w", err)
	}
	defer rows.Close()
	var out []Analysis
	for rows.Next() {
		var a Analysis
		if err := rows.Scan(&a.Endpoint, &a.DeadCount, &a.PrimaryError, &a.PrimaryStatusCode, &a.FirstDead, &a.LastDead,
			&a.AvgAttempts, &a.MaxInOneHour, &a.AuthFailures, &a.RateLimited); err != nil {
			return nil, fmt.Errorf("dead-letter analysis: %w", err)
		}
		a.Pattern, a.Advice = classifyDeadLetters(a)
		out = append(out, a)
	}
	return out, rows.Err()
}

// badInputAdvice is what to do about each dead-letter reason that is about
// the row or the configuration rather than the receiver.
var badInputAdvice = map[string]string{
	"unknown_endpoint": "configure the endpoint (endpoints.{endpoint}.url) or write rows with a url, then replay them: postbox replay --dead-letters --endpoint {endpoint}",
	"invalid_url": "fix the URL (absolute http or https): if it is endpoints.{endpoint}.url, replay once it is fixed; if it is the rows' own, " +
		"a replay sends them to the same URL and fails again: replay with --endpoint-url (the endpoint's url) or --url URL",
	"row_url_not_allowed": "the rows give a url of their own, which the configuration refuses there (the primary error names the key): " +
		"drop the rows' url, or, if they may choose where the endpoint's headers go, set allow_row_url: true on endpoints.{endpoint} " +
		"(on defaults for an endpoint that is not configured), with row_url_hosts naming their hosts, then replay",
	"payload_too_large": "the payloads were above max_body and were not kept, so no replay can send them: the application must write " +
		"these events again, smaller, or after max_body is raised if the receiver accepts them",
	"blocked_target": "the URL resolves to a private or link-local address: if the receiver is internal on purpose, list its network in allowed_cidrs " +
		"(a link-local or metadata address opens only for an entry inside its range, such as 169.254.170.2/32), then replay",
	"invalid_row": "a row broke the outbox contract (a column missing or unreadable, an endpoint name over 200 bytes): a replay resends the row " +
		"as it was and fails again; fix the table or the writer, and have the application write these events again",
	"messages_off": "written with outbox.Emit while outbox_messages is off, never attempted: if the application emits events, set outbox_messages: true, " +
		"restrict pg_logical_emit_message to its role (postbox doctor prints the statements), then replay: postbox replay --dead-letters --endpoint {endpoint}; " +
		"if it does not, a database role forged them: find it (postbox doctor) and do not replay",
}

func classifyDeadLetters(a Analysis) (pattern, advice string) {
	// A retried failure's reason is prefixed by the exhaustion; its cause
	// is what names the pattern.
	cause := a.PrimaryError
	if strings.HasPrefix(cause, "max_attempts (") {
		if _, rest, ok := strings.Cut(cause, "exhausted: "); ok {
			cause = rest
		}
	}
	code, _, _ := strings.Cut(cause, ":")
	// The endpoint's name may come from a row: quoted where it stands in
	// a command to paste, stripped of control characters elsewhere.
	replay := fmt.Sprintf("postbox replay --dead-letters --endpoint %s --since %s", ShellQuote(a.Endpoint), a.FirstDead.UTC().Format(time.RFC3339))
	ep := Printable(a.Endpoint)
	days := max(1, a.LastDead.Sub(a.FirstDead).Hours()/24)
	switch {
	case code == "template_error":
		return PatternTemplateError, fmt.Sprintf("a url or body template of endpoints.%s (or the rows' url) needs a payload field these events lack "+
			"(the primary error names it): a replay resends the same payloads and fails the same way, unless the template first gives the macro "+
			"a default ({payload.x|default}); otherwise the application must write them again with the field. With a default in place: %s", ep, replay)
	case strings.Contains(cause, "connection refused"):
		return PatternRefused, fmt.Sprintf("connection refused: nothing accepts connections at the host and port of the url (the receiver is down, "+
			"or endpoints.%s.url names a wrong port); a replay fails the same way until it listens. Once it does: %s", ep, replay)
	case badInputAdvice[code] != "":
		return PatternBadInput, strings.ReplaceAll(badInputAdvice[code], "{endpoint}", ep)
	case a.AuthFailures*2 >= a.DeadCount:
		return PatternCredentials, fmt.Sprintf("mostly 401/403: the endpoint's credentials changed and its configuration was not updated; fix them (headers or secrets of endpoints.%s), then replay: %s", ep, replay)
	case a.RateLimited*2 >= a.DeadCount:
		return PatternRateLimited, fmt.Sprintf("mostly 429: postbox sends faster than the partner allows; set endpoints.%s.rate_limit below its limit, then replay: %s", ep, replay)
	case a.MaxInOneHour >= 10 && a.MaxInOneHour*2 >= a.DeadCount:
		return PatternOutageCluster, fmt.Sprintf("%d within one hour: the endpoint was down longer than the retry window; widen it (max_attempts, backoff_cap of endpoints.%s) or replay the outage: %s", a.MaxInOneHour, ep, replay)
	case a.DeadCount > 1 && float64(a.DeadCount)/days <= 5 && a.LastDead.Sub(a.FirstDead) >= 12*time.Hour:
		return PatternGradual, fmt.Sprintf("a few a day (%.1f/day): sporadic failures exhaust the retries; raise endpoints.%s.max_attempts or lower its timeout", float64(a.DeadCount)/days, ep)
	}
	return PatternOther, fmt.Sprintf("see last_error; once the cause is fixed, replay: %s", replay)
}
