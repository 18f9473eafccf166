package maintain

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// The percentile refresher stores the endpoints' percentiles of the
// window's attempts, as the leader.
func TestPercentilesAreRefreshed(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	ctx := context.Background()
	_, err := tb.st.Pool.Exec(ctx, `INSERT INTO postbox.attempts (endpoint, duration_ms, outcome, started_at)
		SELECT 'ep', 10 + i % 5, 'delivered', now() FROM generate_series(1, 50) i`)
	require.NoError(t, err)
	u := newPercentiles(tb.env, newLeader(tb.env, new(sync.Mutex)))
	require.Equal(t, PercentilesIntervalDefault, u.runEvery)
	u.first, u.interval = 0, tick
	require.NoError(t, u.Start(ctx))
	defer u.Stop()
	require.Eventually(t, func() bool {
		eps, err := telemetry.LoadStoredEndpoints(ctx, tb.st.Pool)
		require.NoError(t, err)
		return len(eps) == 1 && eps[0].P50MS != nil && eps[0].SampleCount == 50
	}, wait, tick)
}
