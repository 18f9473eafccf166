package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestEndpointsRefreshedMatchLoadEndpoints: after a refresh, the stored
// figures and the per-state queue counts are LoadEndpoints' own, and the
// queue counts never scan the delivered rows.
func TestEndpointsRefreshedMatchLoadEndpoints(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome)
		SELECT 'ep-' || (i % 3), i % 97, 200, 'delivered' FROM generate_series(1, 3000) i`)
	deliveries(t, pool, "ep-0", 5, "")
	deliveries(t, pool, "ep-1", 4, `status = 'failed'`)
	deliveries(t, pool, "ep-1", 3, `status = 'dead_letter', updated_at = now()`)
	deliveries(t, pool, "ep-2", 20000, `status = 'delivered', delivered_at = now()`)
	deliveries(t, pool, "queued-only", 2, `status = 'in_flight', lease_owner = 'x'`)
	exec(t, pool, `ANALYZE postbox.deliveries`)
	require.NoError(t, telemetry.RefreshPercentiles(ctx, pool))

	want, err := telemetry.LoadEndpoints(ctx, pool, "")
	require.NoError(t, err)
	got, err := telemetry.LoadEndpointsRefreshed(ctx, pool, "")
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, "queued-only", got[3].Endpoint)
	require.EqualValues(t, 2, got[3].InFlight)

	one, err := telemetry.LoadEndpointsRefreshed(ctx, pool, "ep-1")
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.EqualValues(t, 4, one[0].AwaitingRetry)
	require.EqualValues(t, 3, one[0].DeadLetter)
	require.EqualValues(t, 1000, one[0].SampleCount)

	rows, err := pool.Query(ctx, `EXPLAIN `+telemetry.EndpointQueuesSQL, "")
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
