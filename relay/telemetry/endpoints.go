package telemetry

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Window is the rolling window of the latency percentiles.
const Window = 24 * time.Hour

// EndpointStats is one endpoint's state, latency over the rolling window,
// and queue. Field names follow the seed's columns.
type EndpointStats struct {
	Endpoint            string                   `json:"endpoint"`
	State               postboxtype.BreakerState `json:"state"`
	P50MS               *float64                 `json:"p50_ms"`
	P95MS               *float64                 `json:"p95_ms"`
	P99MS               *float64                 `json:"p99_ms"`
	SampleCount         int64                    `json:"sample_count"`
	ConsecutiveFailures int                      `json:"consecutive_failures"`
	Pending             int64                    `json:"pending"`
	AwaitingRetry       int64                    `json:"awaiting_retry"`
	InFlight            int64                    `json:"in_flight"`
	DeadLetter          int64                    `json:"dead_letter"`
	LastSuccessAt       *time.Time               `json:"last_success_at"`
	LastFailureAt       *time.Time               `json:"last_failure_at"`
	LastError           string                   `json:"last_error"`
	LastStatusCode      *int                     `json:"last_status_code"`
	PausedUntil         *time.Time               `json:"paused_until,omitempty"`
}

// ExactSamples is how many samples an endpoint may have in the window and
// still get exact percentiles: percentile_disc over the raw samples, one
// sort of the window for all three, a few tens of milliseconds at this
// size. A busier endpoint (200 attempts a second is 17 million a day,
// seconds of sorting) gets them from the five-minute histograms instead
// (migration 008), which read at most 288 bins times the buckets in use
// and answer within 2 %.
const ExactSamples = 100000

// windowStats are an endpoint's percentiles over the window.
type windowStats struct {
	count         int64
	p50, p95, p99 float64
}

const windowTotalsSQL = `
SELECT endpoint, sum(count)::int8
FROM postbox.latency_histogram
WHERE bin >= postbox.latency_bin(now() - $1 * interval '1 second') AND ($2 = '' OR endpoint = $2)
GROUP BY endpoint`

const exactPercentilesSQL = `
SELECT endpoint, count(*),
       percentile_disc(0.50) WITHIN GROUP (ORDER BY duration_ms)::float8,
       percentile_disc(0.95) WITHIN GROUP (ORDER BY duration_ms)::float8,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY duration_ms)::float8
FROM ((SELECT endpoint, duration_ms FROM postbox.attempts
       WHERE endpoint = ANY($2) AND started_at >= now() - $1 * interval '1 second')
      UNION ALL
      (SELECT a.endpoint, a.duration_ms
       FROM (` + attemptsOnDeliveries + ` AND endpoint = ANY($2) AND delivered_at >= now() - $1 * interval '1 second') AS a
       WHERE a.started_at >= now() - $1 * interval '1 second')) AS a
GROUP BY endpoint`

// histogramPercentilesSQL finds, per endpoint, the first bucket whose
// cumulative count reaches each fraction: percentile_disc's rule, over
// buckets.
const histogramPercentilesSQL = `
WITH h AS (
  SELECT endpoint, bucket, sum(count)::float8 AS n
  FROM postbox.latency_histogram
  WHERE endpoint = ANY($2) AND bin >= postbox.latency_bin(now() - $1 * interval '1 second')
  GROUP BY endpoint, bucket
), c AS (
  SELECT endpoint, bucket,
         sum(n) OVER (PARTITION BY endpoint ORDER BY bucket) AS upto,
         sum(n) OVER (PARTITION BY endpoint) AS total
  FROM h
)
SELECT endpoint, max(total)::int8,
       postbox.latency_bucket_ms(min(bucket) FILTER (WHERE upto >= 0.50 * total))::float8,
       postbox.latency_bucket_ms(min(bucket) FILTER (WHERE upto >= 0.95 * total))::float8,
       postbox.latency_bucket_ms(min(bucket) FILTER (WHERE upto >= 0.99 * total))::float8
FROM c
GROUP BY endpoint`

// windowPercentiles returns the percentiles over the window of every
// endpoint with samples in it (or only endpoint's): exact up to
// ExactSamples, from the histograms above.
func windowPercentiles(ctx context.Context, q Querier, endpoint string) (map[string]windowStats, error) {
	rows, err := q.Query(ctx, windowTotalsSQL, Window.Seconds(), endpoint)
	if err != nil {
		return nil, fmt.Errorf("latency window: %w", err)
	}
	var exact, binned []string
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("latency window: %w", err)
		}
		if n <= ExactSamples {
			exact = append(exact, name)
		} else {
			binned = append(binned, name)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("latency window: %w", err)
	}
	out := map[string]windowStats{}
	for _, part := range []struct {
		sql   string
		names []string
	}{{exactPercentilesSQL, exact}, {histogramPercentilesSQL, binned}} {
		if len(part.names) == 0 {
			continue
		}
		rows, err := q.Query(ctx, part.sql, Window.Seconds(), part.names)
		if err != nil {
			return nil, fmt.Errorf("percentiles: %w", err)
		}
		for rows.Next() {
			var name string
			var w windowStats
			if err := rows.Scan(&name, &w.count, &w.p50, &w.p95, &w.p99); err != nil {
				rows.Close()
				return nil, fmt.Errorf("percentiles: %w", err)
			}
			out[name] = w
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("percentiles: %w", err)
		}
	}
	return out, nil
}

// LoadEndpoints returns every endpoint's stats (or only endpoint's),
// computed from the samples now, so the answer is current even when no
// relay runs.
func LoadEndpoints(ctx context.Context, q Querier, endpoint string) ([]EndpointStats, error) {
	stats, err := windowPercentiles(ctx, q, endpoint)
	if err != nil {
		return nil, err
	}
	sampled := make([]string, 0, len(stats))
	for name := range stats {
		sampled = append(sampled, name)
	}
	rows, err := q.Query(ctx, `
		WITH queue AS (
		  SELECT endpoint,
		         count(*) FILTER (WHERE status = 'pending') AS pending,
		         count(*) FILTER (WHERE status = 'failed') AS retry,
		         count(*) FILTER (WHERE status = 'in_flight') AS in_flight,
		         count(*) FILTER (WHERE status = 'dead_letter') AS dead
		  FROM (SELECT endpoint, status FROM postbox.deliveries
		        WHERE status IN ('pending', 'failed', 'in_flight', 'dead_letter') AND ($1 = '' OR endpoint = $1)
		        UNION ALL -- events under way are in flight
		        SELECT endpoint, 'in_flight' FROM postbox.events_under_way WHERE $1 = '' OR endpoint = $1) d
		  GROUP BY endpoint
		),
		names AS (
		  SELECT endpoint FROM postbox.endpoint_health WHERE $1 = '' OR endpoint = $1
		  UNION SELECT unnest($2::text[]) UNION SELECT endpoint FROM queue
		)
		SELECT n.endpoint, coalesce(h.state, 'closed'), coalesce(h.consecutive_failures, 0),
		       coalesce(queue.pending, 0), coalesce(queue.retry, 0), coalesce(queue.in_flight, 0), coalesce(queue.dead, 0),
		       h.last_success_at, h.last_failure_at, coalesce(h.last_error, ''), h.last_status_code,
		       CASE WHEN h.paused_until > now() THEN h.paused_until END
		FROM names n
		LEFT JOIN postbox.endpoint_health h ON h.endpoint = n.endpoint
		LEFT JOIN queue ON queue.endpoint = n.endpoint
		ORDER BY n.endpoint`, endpoint, sampled)
	if err != nil {
		return nil, fmt.Errorf("endpoint stats: %w", err)
	}
	defer rows.Close()
	var out []EndpointStats
	for rows.Next() {
		var e EndpointStats
		if err := rows.Scan(&e.Endpoint, &e.State, &e.ConsecutiveFailures,
			&e.Pending, &e.AwaitingRetry, &e.InFlight, &e.DeadLetter,
			&e.LastSuccessAt, &e.LastFailureAt, &e.LastError, &e.LastStatusCode, &e.PausedUntil); err != nil {
			return nil, fmt.Errorf("endpoint stats: %w", err)
		}
		if w, ok := stats[e.Endpoint]; ok {
			e.SampleCount = w.count
			e.P50MS, e.P95MS, e.P99MS = &w.p50, &w.p95, &w.p99
			roundMS(e.P50MS, e.P95MS, e.P99MS)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// RefreshPercentiles stores each endpoint's p50/p95/p99 and sample count
// over the window in endpoint_health (where the breaker reads the p95),
// and clears the figures of endpoints without samples in it.
func RefreshPercentiles(ctx context.Context, q Querier) error {
	stats, err := windowPercentiles(ctx, q, "")
	if err != nil {
		return fmt.Errorf("refresh percentiles: %w", err)
	}
	// In name order, the order RecordResults locks health rows in.
	names := slices.Sorted(maps.Keys(stats))
	n := len(names)
	counts := make([]int64, 0, n)
	p50, p95, p99 := make([]float64, 0, n), make([]float64, 0, n), make([]float64, 0, n)
	for _, name := range names {
		w := stats[name]
		counts = append(counts, w.count)
		p50, p95, p99 = append(p50, w.p50), append(p95, w.p95), append(p99, w.p99)
	}
	_, err = q.Exec(ctx, `
		WITH s AS (
		  SELECT * FROM unnest($1::text[], $2::int8[], $3::float8[], $4::float8[], $5::float8[])
		    AS s(endpoint, count, p50, p95, p99)
		),
		upd AS (
		  INSERT INTO postbox.endpoint_health AS h (endpoint, p50_ms, p95_ms, p99_ms, sample_count, stats_at)
		  SELECT endpoint, p50, p95, p99, count, now() FROM s
		  ON CONFLICT (endpoint) DO UPDATE SET p50_ms = excluded.p50_ms, p95_ms = excluded.p95_ms,
		    p99_ms = excluded.p99_ms, sample_count = excluded.sample_count, stats_at = now()
		  RETURNING endpoint
		)
		UPDATE postbox.endpoint_health h
		SET p50_ms = NULL, p95_ms = NULL, p99_ms = NULL, sample_count = 0, stats_at = now()
		WHERE h.sample_count > 0 AND h.endpoint NOT IN (SELECT endpoint FROM upd)`, names, counts, p50, p95, p99)
	if err != nil {
		return fmt.Errorf("refresh percentiles: %w", err)
	}
	return nil
}

// LoadStoredEndpoints returns the endpoints' stats as stored in
// endpoint_health: percentiles as of the last refresh (at most a minute
// old while a relay runs). Cheaper than LoadEndpoints, for metrics.
func LoadStoredEndpoints(ctx context.Context, q Querier) ([]EndpointStats, error) {
	rows, err := q.Query(ctx, `
		SELECT endpoint, state, p50_ms::float8, p95_ms::float8, p99_ms::float8, sample_count, consecutive_failures,
		       last_success_at, last_failure_at, coalesce(last_error, ''), last_status_code,
		       CASE WHEN paused_until > now() THEN paused_until END
		FROM postbox.endpoint_health ORDER BY endpoint`)
	if err != nil {
		return nil, fmt.Errorf("endpoint health: %w", err)
	}
	defer rows.Close()
	var out []EndpointStats
	for rows.Next() {
		var e EndpointStats
		if err := rows.Scan(&e.Endpoint, &e.State, &e.P50MS, &e.P95MS, &e.P99MS, &e.SampleCount, &e.ConsecutiveFailures,
			&e.LastSuccessAt, &e.LastFailureAt, &e.LastError, &e.LastStatusCode, &e.PausedUntil); err != nil {
			return nil, fmt.Errorf("endpoint health: %w", err)
		}
		roundMS(e.P50MS, e.P95MS, e.P99MS)
		out = append(out, e)
	}
	return out, rows.Err()
}

// roundMS rounds durations to the microsecond: stored as real, they come
// back with digits of float noise that no reader wants.
func roundMS(vs ...*float64) {
	for _, v := range vs {
		if v != nil {
			*v = math.Round(*v*1000) / 1000
		}
	}
}
