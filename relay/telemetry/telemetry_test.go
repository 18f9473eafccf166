package telemetry_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	return pool
}

func exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// deliveries inserts n events with one delivery each for endpoint, the
// delivery columns set by the SQL expressions in set (column → expr).
func deliveries(t *testing.T, pool *pgxpool.Pool, endpoint string, n int, set string) {
	t.Helper()
	var ids []int64
	rows, err := pool.Query(context.Background(), `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at)
		  SELECT gen_random_uuid(), $1, '{}', now(), now() FROM generate_series(1, $2)
		  RETURNING id
		)
		INSERT INTO postbox.deliveries (event_pk, endpoint, status) SELECT id, $1, 'pending' FROM ev RETURNING id`, endpoint, n)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	if set != "" {
		exec(t, pool, `UPDATE postbox.deliveries SET `+set+` WHERE id = ANY($1)`, ids)
	}
}

func TestPercentilesOverTheWindow(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// 1..100 ms now; ten huge samples 25 hours ago, outside the window.
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome)
		SELECT 'ep', i, 200, 'delivered' FROM generate_series(1, 100) i`)
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
		SELECT 'ep', 99999, 200, 'delivered', now() - interval '25 hours' FROM generate_series(1, 10)`)
	eps, err := telemetry.LoadEndpoints(ctx, pool, "ep")
	require.NoError(t, err)
	require.Len(t, eps, 1)
	e := eps[0]
	require.EqualValues(t, 100, e.SampleCount, "the window excludes older samples")
	require.Equal(t, 50.0, *e.P50MS)
	require.Equal(t, 95.0, *e.P95MS)
	require.Equal(t, 99.0, *e.P99MS)

	require.NoError(t, telemetry.RefreshPercentiles(ctx, pool))
	var p50, p95, p99 float64
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT p50_ms, p95_ms, p99_ms, sample_count FROM postbox.endpoint_health WHERE endpoint = 'ep'`).Scan(&p50, &p95, &p99, &n))
	require.Equal(t, []float64{50, 95, 99}, []float64{p50, p95, p99})
	require.Equal(t, 100, n)

	// A receiver on the same network answers within a millisecond: its
	// percentiles keep their fraction rather than reading 0.
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome)
		VALUES ('lan', 0.25, 200, 'delivered'), ('lan', 0.5, 200, 'delivered'), ('lan', 0.75, 200, 'delivered')`)
	eps, err = telemetry.LoadEndpoints(ctx, pool, "lan")
	require.NoError(t, err)
	require.Equal(t, 0.5, *eps[0].P50MS)

	s := &store.Store{Pool: pool}
	purged, err := s.PurgeAttempts(ctx, telemetry.Window)
	require.NoError(t, err)
	require.EqualValues(t, 10, purged, "samples older than 24 h are purged")
}

// TestBusyEndpointsUseTheHistograms: an endpoint with more samples in the
// window than ExactSamples gets its percentiles from the five-minute
// histograms, within 2 % of the exact ones, and its exact count; old bins
// are purged like the samples.
func TestBusyEndpointsUseTheHistograms(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	n := telemetry.ExactSamples + 20000
	// A long-tailed spread over the last 23 hours, 0.2 ms to about 2 s.
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
		SELECT 'busy', 0.2 * exp(9.2 * (i % 9973) / 9973.0), 200, 'delivered', now() - (i % 1380) * interval '1 minute'
		FROM generate_series(1, $1) i`, n)
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
		SELECT 'busy', 99999, 200, 'delivered', now() - interval '25 hours' FROM generate_series(1, 10)`)
	var exact [3]float64
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT percentile_disc(0.50) WITHIN GROUP (ORDER BY duration_ms)::float8,
		       percentile_disc(0.95) WITHIN GROUP (ORDER BY duration_ms)::float8,
		       percentile_disc(0.99) WITHIN GROUP (ORDER BY duration_ms)::float8
		FROM postbox.attempts WHERE endpoint = 'busy' AND started_at > now() - interval '24 hours'`).
		Scan(&exact[0], &exact[1], &exact[2]))
	// The answer must come from the histograms alone.
	exec(t, pool, `DELETE FROM postbox.attempts WHERE endpoint = 'busy'`)

	eps, err := telemetry.LoadEndpoints(ctx, pool, "busy")
	require.NoError(t, err)
	require.Len(t, eps, 1)
	e := eps[0]
	require.EqualValues(t, n, e.SampleCount, "the window excludes older samples")
	for i, got := range []*float64{e.P50MS, e.P95MS, e.P99MS} {
		require.NotNil(t, got)
		require.InEpsilon(t, exact[i], *got, 0.02, "percentile %d: exact %.3f ms, from histograms %.3f ms", i, exact[i], *got)
	}
	require.NoError(t, telemetry.RefreshPercentiles(ctx, pool))
	var p95 float64
	var count int
	require.NoError(t, pool.QueryRow(ctx, `SELECT p95_ms, sample_count FROM postbox.endpoint_health WHERE endpoint = 'busy'`).Scan(&p95, &count))
	require.InEpsilon(t, exact[1], p95, 0.02)
	require.Equal(t, n, count)

	s := &store.Store{Pool: pool}
	purged, err := s.PurgeHistograms(ctx, telemetry.Window)
	require.NoError(t, err)
	require.EqualValues(t, 1, purged, "the one histogram row of 25 hours ago")
}

func TestAlertsFireAndClear(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	slot := pgtest.UniqueName("slot")
	th := config.DefaultAlerts()
	th.SlotLag = 64 << 10 // 64 KiB for the test
	evaluate := func() map[string]telemetry.Alert {
		s, err := telemetry.LoadSummary(ctx, pool, slot)
		require.NoError(t, err)
		eps, err := telemetry.LoadEndpoints(ctx, pool, "")
		require.NoError(t, err)
		out := map[string]telemetry.Alert{}
		for _, a := range telemetry.Evaluate(s, eps, th) {
			out[a.Name+"/"+a.Subject] = a
		}
		return out
	}
	firing := func(m map[string]telemetry.Alert) []string {
		var out []string
		for k, a := range m {
			if a.Firing {
				out = append(out, k)
			}
		}
		return out
	}
	require.Empty(t, firing(evaluate()), "an empty database fires nothing")

	deliveries(t, pool, "dl", 1, `status = 'dead_letter', last_error = 'http 400', updated_at = now()`)
	deliveries(t, pool, "old", 1, `created_at = now() - interval '31 minutes'`)
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome)
		SELECT 'slow', 3000, 200, 'delivered' FROM generate_series(1, 30)`)
	exec(t, pool, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	exec(t, pool, `CREATE TABLE filler AS SELECT md5(i::text) AS v FROM generate_series(1, 5000) i`)
	got := evaluate()
	require.ElementsMatch(t, []string{"dead_letters_rising/", "oldest_pending/", "endpoint_latency/slow", "slot_lag/"}, firing(got))
	require.Contains(t, got["endpoint_latency/slow"].Detail, "p95 latency of slow over 24 h is 3s")

	changes, err := telemetry.RecordAlerts(ctx, pool, telemetry.Evaluate(mustSummary(t, pool, slot), nil, th))
	require.NoError(t, err)
	require.Len(t, changes, 3, "the first record reports each firing alert (the latency one is not evaluated here)")
	changes, err = telemetry.RecordAlerts(ctx, pool, telemetry.Evaluate(mustSummary(t, pool, slot), nil, th))
	require.NoError(t, err)
	require.Empty(t, changes, "an unchanged state is not reported again")

	// Clear them: the dead letter ages out of the hour, the old event is
	// delivered, the slow samples leave the window, the slot is consumed.
	exec(t, pool, `UPDATE postbox.deliveries SET updated_at = now() - interval '2 hours' WHERE endpoint = 'dl'`)
	exec(t, pool, `UPDATE postbox.deliveries SET status = 'delivered', delivered_at = now() WHERE endpoint = 'old'`)
	exec(t, pool, `UPDATE postbox.attempts SET started_at = now() - interval '2 days' WHERE endpoint = 'slow'`)
	// The slot's retained WAL goes (here: the slot is dropped; when
	// consumed, restart_lsn follows at the next running-transactions
	// record, which other tests' traffic on this cluster makes unreliable
	// to wait for).
	exec(t, pool, `SELECT pg_drop_replication_slot($1)`, slot)
	require.Empty(t, firing(evaluate()))
	changes, err = telemetry.RecordAlerts(ctx, pool, telemetry.Evaluate(mustSummary(t, pool, slot), nil, th))
	require.NoError(t, err)
	require.Len(t, changes, 3, "each clearing is reported once")
	for _, c := range changes {
		require.False(t, c.Alert.Firing)
	}
}

func mustSummary(t *testing.T, pool *pgxpool.Pool, slot string) telemetry.Summary {
	t.Helper()
	s, err := telemetry.LoadSummary(context.Background(), pool, slot)
	require.NoError(t, err)
	return s
}

func TestSlotNotReservedFires(t *testing.T) {
	t.Parallel()
	s := telemetry.Summary{Slot: telemetry.Slot{Name: "postbox", Exists: true, WALStatus: "unreserved"}}
	alerts := telemetry.Firing(telemetry.Evaluate(s, nil, config.DefaultAlerts()))
	require.Len(t, alerts, 1)
	require.Equal(t, telemetry.AlertSlotLag, alerts[0].Name)
	require.Contains(t, alerts[0].Detail, "wal_status is unreserved")
}

func TestDeadLetterPatterns(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	deliveries(t, pool, "creds", 20, `status = 'dead_letter', last_status_code = 401, last_error = 'http 401', attempt_count = 1`)
	deliveries(t, pool, "limited", 15, `status = 'dead_letter', last_status_code = 429, last_error = 'max_attempts (5) exhausted: http 429', attempt_count = 5`)
	deliveries(t, pool, "outage", 30, `status = 'dead_letter', last_status_code = 503, last_error = 'max_attempts (5) exhausted: http 503', attempt_count = 5, updated_at = date_trunc('hour', now()) - interval '2 hours' + interval '10 minutes'`)
	deliveries(t, pool, "drip", 6, `status = 'dead_letter', last_error = 'max_attempts (5) exhausted: timeout after 15s', attempt_count = 5, updated_at = now() - (id % 6) * interval '12 hours'`)
	deliveries(t, pool, "ghost", 3, `status = 'dead_letter', last_error = 'unknown_endpoint: no endpoint "ghost" is configured and the row has no url'`)
	deliveries(t, pool, "tpl", 12, `status = 'dead_letter', last_error = 'template_error: {payload.click_id} has no value (give it a default: {payload.click_id|…})', updated_at = date_trunc('hour', now()) - interval '50 minutes'`)
	deliveries(t, pool, "refused", 12, `status = 'dead_letter', last_error = 'max_attempts (5) exhausted: dial tcp 127.0.0.1:9: connect: connection refused', attempt_count = 5, updated_at = date_trunc('hour', now()) - interval '50 minutes'`)
	deliveries(t, pool, "big", 2, `status = 'dead_letter', last_error = 'payload_too_large: 2000000 bytes is above max_body (1048576)'`)
	an, err := telemetry.AnalyzeDeadLetters(ctx, pool, "", time.Now().Add(-7*24*time.Hour))
	require.NoError(t, err)
	got := map[string]telemetry.Analysis{}
	for _, a := range an {
		got[a.Endpoint] = a
	}
	require.Equal(t, telemetry.PatternCredentials, got["creds"].Pattern)
	require.Contains(t, got["creds"].Advice, "credentials changed")
	require.EqualValues(t, 20, got["creds"].DeadCount)
	require.Equal(t, 401, *got["creds"].PrimaryStatusCode)
	require.Equal(t, telemetry.PatternRateLimited, got["limited"].Pattern)
	require.Contains(t, got["limited"].Advice, "rate_limit")
	require.Equal(t, telemetry.PatternOutageCluster, got["outage"].Pattern)
	require.EqualValues(t, 30, got["outage"].MaxInOneHour)
	require.Contains(t, got["outage"].Advice, "postbox replay --dead-letters --endpoint outage")
	require.Equal(t, telemetry.PatternGradual, got["drip"].Pattern)
	require.Contains(t, got["drip"].Advice, "max_attempts")
	require.Equal(t, 5.0, got["drip"].AvgAttempts)
	require.Equal(t, telemetry.PatternBadInput, got["ghost"].Pattern)
	require.Contains(t, got["ghost"].Advice, "endpoints.ghost.url")
	// Named as what they are, even clustered in one hour, and a replay
	// advised only where one can succeed.
	require.Equal(t, telemetry.PatternTemplateError, got["tpl"].Pattern)
	require.Contains(t, got["tpl"].Advice, "fails the same way, unless the template first gives the macro a default")
	require.Equal(t, telemetry.PatternRefused, got["refused"].Pattern)
	require.Contains(t, got["refused"].Advice, "until it listens")
	require.Equal(t, telemetry.PatternBadInput, got["big"].Pattern)
	require.NotContains(t, got["big"].Advice, "postbox replay")
	require.Contains(t, got["big"].Advice, "no replay can send them")

	list, err := telemetry.ListDeadLetters(ctx, pool, "creds", time.Now().Add(-time.Hour), 5)
	require.NoError(t, err)
	require.Len(t, list, 5)
	require.Equal(t, "http 401", list[0].LastError)
}

// TestSummaryNeverScansDeliveredRows: with many delivered rows, every
// figure of the summary comes from an index (the plan has no sequential
// scan of deliveries), so it stays fast with millions of them.
func TestSummaryNeverScansDeliveredRows(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	deliveries(t, pool, "big", 100000, `status = 'delivered', delivered_at = now() - interval '2 days', last_response_ms = 5`)
	deliveries(t, pool, "big", 100, `status = 'delivered', delivered_at = now(), last_response_ms = 5, commit_to_delivery_ms = 2`)
	deliveries(t, pool, "big", 10, "")
	exec(t, pool, `ANALYZE postbox.deliveries`)
	for _, sql := range []string{telemetry.SummarySQL, telemetry.DeliveryHourSQL} {
		rows, err := pool.Query(ctx, `EXPLAIN `+sql)
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		require.NotContains(t, strings.Join(plan, "\n"), "Seq Scan on deliveries", strings.Join(plan, "\n"))
	}
	queue, err := telemetry.LoadQueueSummary(ctx, pool, "none")
	require.NoError(t, err)
	require.EqualValues(t, 10, queue.Pending)
	require.Zero(t, queue.DeliveredLastHour, "the gauges' summary leaves the hour's deliveries out")
	require.Nil(t, queue.CommitToDeliveryP50MS)
	s := mustSummary(t, pool, "none")
	require.EqualValues(t, 100, s.DeliveredLastHour)
	require.EqualValues(t, 10, s.Pending)
	require.Equal(t, 2.0, *s.CommitToDeliveryP50MS)
}

// TestOldestPendingCountsDeliveriesInFlight: a delivery in flight is
// undelivered too (an instance alone keeps a backlog in flight), so the
// oldest_pending alert sees an old one.
func TestOldestPendingCountsDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	deliveries(t, pool, "new", 1, "")
	deliveries(t, pool, "kept", 1, `status = 'in_flight', lease_owner = 'me', created_at = now() - interval '31 minutes'`)
	s := mustSummary(t, pool, "none")
	require.NotNil(t, s.OldestPendingAgeSeconds)
	require.Greater(t, *s.OldestPendingAgeSeconds, (30 * time.Minute).Seconds())
	var fired bool
	for _, a := range telemetry.Evaluate(s, nil, config.DefaultAlerts()) {
		fired = fired || a.Name == telemetry.AlertOldestPending && a.Firing
	}
	require.True(t, fired)
}
