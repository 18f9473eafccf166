// Package seed fills a migrated database with a month of history for
// benchmarks (the report's, the partner portal's): events with their
// deliveries and attempts, written set-based (INSERT … SELECT over
// generate_series), so a million rows take seconds, not the hours a row
// at a time would. The triggers of the schema run as they do for the
// relay: the report rollups are written as the seeding goes.
package seed

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is a pgx pool or connection.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// EventTypes are the seeded events' types, in turn.
var EventTypes = []string{"click", "registration", "ftd", "deposit"}

// Endpoint is the name of the seeded endpoint i: partner_0000, …
func Endpoint(i int) string { return fmt.Sprintf("partner_%04d", i) }

// Spec is what History writes.
type Spec struct {
	// Events events over Days days up to now, committed at even
	// intervals, event i to Endpoint(i % Endpoints), of type
	// EventTypes[i % 4], with payload {"click_id": "c_<i>", "payout":
	// "<i % 100>"} (click_id searchable).
	Events, Endpoints, Days int
	// Of every 100 deliveries (by event id): 90 delivered at their first
	// attempt (kept on the delivery's row), 5 delivered at the second, 3
	// dead letters and 2 awaiting a retry, those 10 with two attempt rows
	// each.
}

// History writes spec's events, deliveries and attempts, then analyzes.
func History(ctx context.Context, db Execer, spec Spec) error {
	end := time.Now()
	start := end.Add(-time.Duration(spec.Days) * 24 * time.Hour)
	if err := Day(ctx, db, "", spec.Events, spec.Endpoints, start, end); err != nil {
		return err
	}
	return Analyze(ctx, db)
}

// Day writes n events committed between from and to at even intervals,
// to endpoint (to the Endpoint(i % endpoints) when endpoint is empty), with
// their deliveries and attempts as Spec says.
func Day(ctx context.Context, db Execer, endpoint string, n, endpoints int, from, to time.Time) error {
	stmts := []struct {
		what string
		sql  string
		args []any
	}{
		{"events", `
			INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, committed_at, ingested_at, search)
			SELECT gen_random_uuid(), coalesce(nullif($1, ''), 'partner_' || lpad((i % $3)::text, 4, '0')),
			       ($4::text[])[1 + i % 4],
			       jsonb_build_object('click_id', 'c_' || i, 'payout', (i % 100)::text), t, t, t + interval '30 milliseconds',
			       jsonb_build_object('click_id', 'c_' || i)
			FROM generate_series(0, $2 - 1) i
			CROSS JOIN LATERAL (SELECT $5::timestamptz + (i::float8 / $2) * ($6::timestamptz - $5::timestamptz) AS t) x`,
			[]any{endpoint, n, max(endpoints, 1), EventTypes, from, to}},
		// The events just written: those above the ids there were.
		{"deliveries", `
			INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, next_attempt_at, created_at, updated_at,
			                                delivered_at, last_status_code, last_response_ms, last_error, attempt_target, attempted_by)
			SELECT e.id, e.endpoint, s.status, s.attempts,
			       CASE WHEN s.status = 'failed' THEN now() + interval '1 hour' ELSE e.ingested_at END,
			       e.ingested_at, e.ingested_at + s.attempts * interval '1 second',
			       CASE WHEN s.status = 'delivered' THEN e.ingested_at + s.attempts * interval '1 second' END,
			       CASE WHEN s.status = 'delivered' THEN 200 ELSE 503 END, 40,
			       CASE WHEN s.status <> 'delivered' THEN 'http_503: Service Unavailable' END,
			       CASE WHEN s.attempts = 1 THEN 'https://partner.example/pb' END, CASE WHEN s.attempts = 1 THEN 'seed' END
			FROM postbox.events e
			CROSS JOIN LATERAL (SELECT CASE WHEN e.id % 100 < 95 THEN 'delivered' WHEN e.id % 100 < 98 THEN 'dead_letter' ELSE 'failed' END AS status,
			                           CASE WHEN e.id % 100 < 90 THEN 1 ELSE 2 END AS attempts) s
			WHERE e.id > (SELECT coalesce(max(event_pk), 0) FROM postbox.deliveries)`, nil},
		{"attempts", `
			INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome, error_class, error, target, instance)
			SELECT d.id, d.endpoint, a, d.created_at + (a - 1) * interval '1 second', 40,
			       CASE WHEN a = 2 AND d.status = 'delivered' THEN 200 ELSE 503 END,
			       CASE WHEN a = 2 THEN d.status ELSE 'failed' END,
			       CASE WHEN a = 2 AND d.status = 'delivered' THEN NULL ELSE 'http_5xx' END,
			       CASE WHEN a = 2 AND d.status = 'delivered' THEN NULL ELSE 'http_503: Service Unavailable' END,
			       'https://partner.example/pb', 'seed'
			FROM postbox.deliveries d CROSS JOIN generate_series(1, 2) a
			WHERE d.attempt_count = 2 AND d.id > (SELECT coalesce(max(delivery_id), 0) FROM postbox.attempts)`, nil},
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("seed %s: %w", s.what, err)
		}
	}
	return nil
}

// Analyze vacuums and analyzes the seeded tables, as autovacuum would
// have by the time a month had passed.
func Analyze(ctx context.Context, db Execer) error {
	for _, t := range []string{"events", "deliveries", "attempts", "report_buckets"} {
		if _, err := db.Exec(ctx, "VACUUM ANALYZE postbox."+pgx.Identifier{t}.Sanitize()); err != nil {
			return fmt.Errorf("seed: analyze %s: %w", t, err)
		}
	}
	return nil
}
