package console_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// seedHistorySQL writes n events spread evenly over the window $3 before
// now, to the endpoints $2 in turn, each with one delivery and its
// attempts, as the relay would have recorded them: one in $4 dead-lettered
// after three attempts answered 503, one in $5 of the last ten minutes'
// waiting to retry, the rest delivered at the first attempt. Latencies follow a long-tailed spread
// that swells and ebbs over the day, so the charts have a shape. The
// attempts' insert fills the latency histograms (its trigger).
const seedHistorySQL = `
WITH ev AS (
  INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, committed_at, ingested_at, search)
  SELECT gen_random_uuid(), ($2::text[])[1 + i % cardinality($2::text[])], 'order.created',
         jsonb_build_object('click_id', 'hist-' || i, 'payout', '12.50'), t, t, t + interval '1 ms',
         jsonb_build_object('click_id', 'hist-' || i)
  FROM (SELECT i, now() - (i::float8 / $1) * $3::interval AS t FROM generate_series(1, $1) i) s
  RETURNING id, endpoint, created_at
), d AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, created_at, updated_at, delivered_at,
                                  commit_to_delivery_ms, last_response_ms, last_status_code, last_error, next_attempt_at)
  SELECT id, endpoint, st, CASE WHEN st = 'dead_letter' THEN 3 ELSE 1 END,
         created_at, created_at + interval '5 ms',
         CASE WHEN st = 'delivered' THEN created_at + interval '4 ms' END,
         CASE WHEN st = 'delivered' THEN 2 + 3 * random() END,
         3, CASE WHEN st = 'delivered' THEN 200 ELSE 503 END,
         CASE WHEN st = 'dead_letter' THEN 'max_attempts (3) exhausted: http 503' WHEN st = 'failed' THEN 'http 503' END,
         now() + interval '1 hour'
  FROM (SELECT id, endpoint, created_at,
               CASE WHEN id % $4 = 0 THEN 'dead_letter'
                    WHEN id % $5 = 0 AND created_at > now() - interval '10 minutes' THEN 'failed'
                    ELSE 'delivered' END AS st
        FROM ev) s
  RETURNING id, endpoint, status, created_at, attempt_count
)
INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
                              error_class, error, target, instance)
SELECT d.id, d.endpoint, a, d.created_at + (a - 1) * interval '1 second',
       least(60000, (1.5 + sin(extract(epoch FROM d.created_at) / 7200.0)) * exp(ln(2.5) + 0.7 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())))::real,
       CASE WHEN d.status = 'delivered' THEN 200 ELSE 503 END,
       CASE WHEN d.status = 'delivered' THEN 'delivered' WHEN d.status = 'failed' OR a < d.attempt_count THEN 'failed' ELSE 'dead_letter' END,
       CASE WHEN d.status <> 'delivered' THEN 'http_5xx' END,
       CASE WHEN d.status = 'dead_letter' AND a = d.attempt_count THEN 'max_attempts (3) exhausted: http 503'
            WHEN d.status <> 'delivered' THEN 'http 503' END,
       'https://' || d.endpoint || '.example/hooks', 'seed'
FROM d, generate_series(1, d.attempt_count) a`

// seedHistory writes n events of history over window (see seedHistorySQL).
func seedHistory(t testing.TB, pool *pgxpool.Pool, n int, endpoints []string, window time.Duration, deadEvery, retryEvery int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, seedHistorySQL, n, endpoints, window, deadEvery, retryEvery)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE postbox.events, postbox.deliveries, postbox.attempts, postbox.latency_histogram`)
	require.NoError(t, err)
}
