package telemetry

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/postbox-relay/postbox/relay/store"
)

// Window is the rolling window of the latency percentiles.
const Window = 24 * time.Hour

// EndpointStats is one endpoint's state, latency over the rolling window,
// and queue. Field names follow the seed's columns.
type EndpointStats struct {
	Endpoint            string     `json:"endpoint"`
	State               string     `json:"state"`
	P50MS               *float64   `json:"p50_ms"`
	P95MS               *float64   `json:"p95_ms"`
	P99MS               *float64   `json:"p99_ms"`
	SampleCount         int64      `json:"sample_count"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	Pending             int64      `json:"pending"`
	AwaitingRetry       int64      `json:"awaiting_retry"`
	InFlight            int64      `json:"in_flight"`
	DeadLetter          int64      `json:"dead_letter"`
	LastSuccessAt       *time.Time `json:"last_success_at"`
	LastFailureAt       *time.Time `json:"last_failure_at"`
	LastError           string     `json:"last_error"`
	LastStatusCode      *int       `json:"last_status_code"`
	PausedUntil         *time.Time `json:"paused_until,omitempty"`
}

// percentilesSQL computes exact percentiles per endpoint from the raw
// samples of the window. percentile_disc answers with real samples and
// sorts each endpoint's window once for all three. That is fine up to
// about 100,000 samples an endpoint (a sort of that many integers is a few
// tens of milliseconds); beyond, the cost grows with the window, and the
// refresh (once a minute, by one instance) is where it would show. The
// next step then is a per-minute t-digest (or HDR histogram) stored beside
// the samples and merged over the window.
const percentilesSQL = `
SELECT endpoint, count(*) AS count,
       percentile_disc(0.50) WITHIN GROUP (ORDER BY response_ms)::float8 AS p50,
       percentile_disc(0.95) WITHIN GROUP (ORDER BY response_ms)::float8 AS p95,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY response_ms)::float8 AS p99
FROM postbox.latency_samples
WHERE measured_at >= now() - $1 * interval '1 second' AND ($2 = '' OR endpoint = $2)
GROUP BY endpoint`

// LoadEndpoints returns every endpoint's stats (or only endpoint's),
// computed from the samples now, so the answer is current even when no
// relay runs.
func LoadEndpoints(ctx context.Context, q store.Querier, endpoint string) ([]EndpointStats, error) {
	rows, err := q.Query(ctx, `
		WITH s AS (`+percentilesSQL+`),
		queue AS (
		  SELECT endpoint,
		         count(*) FILTER (WHERE status = 'pending') AS pending,
		         count(*) FILTER (WHERE status = 'failed') AS retry,
		         count(*) FILTER (WHERE status = 'in_flight') AS in_flight,
		         count(*) FILTER (WHERE status = 'dead_letter') AS dead
		  FROM postbox.deliveries
		  WHERE status IN ('pending', 'failed', 'in_flight', 'dead_letter') AND ($2 = '' OR endpoint = $2)
		  GROUP BY endpoint
		),
		names AS (
		  SELECT endpoint FROM postbox.endpoint_health WHERE $2 = '' OR endpoint = $2
		  UNION SELECT endpoint FROM s UNION SELECT endpoint FROM queue
		)
		SELECT n.endpoint, coalesce(h.state, 'closed'), s.p50, s.p95, s.p99, coalesce(s.count, 0),
		       coalesce(h.consecutive_failures, 0),
		       coalesce(queue.pending, 0), coalesce(queue.retry, 0), coalesce(queue.in_flight, 0), coalesce(queue.dead, 0),
		       h.last_success_at, h.last_failure_at, coalesce(h.last_error, ''), h.last_status_code,
		       CASE WHEN h.paused_until > now() THEN h.paused_until END
		FROM names n
		LEFT JOIN postbox.endpoint_health h ON h.endpoint = n.endpoint
		LEFT JOIN s ON s.endpoint = n.endpoint
		LEFT JOIN queue ON queue.endpoint = n.endpoint
		ORDER BY n.endpoint`, Window.Seconds(), endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint stats: %w", err)
	}
	defer rows.Close()
	var out []EndpointStats
	for rows.Next() {
		var e EndpointStats
		if err := rows.Scan(&e.Endpoint, &e.State, &e.P50MS, &e.P95MS, &e.P99MS, &e.SampleCount, &e.ConsecutiveFailures,
			&e.Pending, &e.AwaitingRetry, &e.InFlight, &e.DeadLetter,
			&e.LastSuccessAt, &e.LastFailureAt, &e.LastError, &e.LastStatusCode, &e.PausedUntil); err != nil {
			return nil, fmt.Errorf("endpoint stats: %w", err)
		}
		roundMS(e.P50MS, e.P95MS, e.P99MS)
		out = append(out, e)
	}
	return out, rows.Err()
}

// RefreshPercentiles stores each endpoint's p50/p95/p99 and sample count
// over the window in endpoint_health (where the breaker reads the p95),
// and clears the figures of endpoints without samples in it.
func RefreshPercentiles(ctx context.Context, q store.Querier) error {
	_, err := q.Exec(ctx, `
		WITH s AS (`+percentilesSQL+`),
		upd AS (
		  INSERT INTO postbox.endpoint_health AS h (endpoint, p50_ms, p95_ms, p99_ms, sample_count, stats_at)
		  SELECT endpoint, p50, p95, p99, count, now() FROM s
		  ON CONFLICT (endpoint) DO UPDATE SET p50_ms = excluded.p50_ms, p95_ms = excluded.p95_ms,
		    p99_ms = excluded.p99_ms, sample_count = excluded.sample_count, stats_at = now()
		  RETURNING endpoint
		)
		UPDATE postbox.endpoint_health h
		SET p50_ms = NULL, p95_ms = NULL, p99_ms = NULL, sample_count = 0, stats_at = now()
		WHERE h.sample_count > 0 AND h.endpoint NOT IN (SELECT endpoint FROM upd)`, Window.Seconds(), "")
	if err != nil {
		return fmt.Errorf("refresh percentiles: %w", err)
	}
	return nil
}

// LoadStoredEndpoints returns the endpoints' stats as stored in
// endpoint_health: percentiles as of the last refresh (at most a minute
// old while a relay runs). Cheaper than LoadEndpoints, for metrics.
func LoadStoredEndpoints(ctx context.Context, q store.Querier) ([]EndpointStats, error) {
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
