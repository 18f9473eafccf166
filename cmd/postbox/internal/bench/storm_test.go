package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestStorm runs a short storm: 2,000 endpoints whose targets refuse
// connections, an event each and 200 more a second, beside the healthy
// endpoints. Nothing is lost, healthy or failing, and the healthy
// endpoints are served beside it; the latency and CPU figures are
// printed, not asserted.
func TestStorm(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts the relay process twice")
	}
	opts := Options{
		Scenarios:   "storm",
		Rate:        100,
		Endpoints:   5,
		Duration:    10 * time.Second,
		Warmup:      time.Second,
		Storm:       2000,
		StormRate:   200,
		DatabaseURL: pgtest.NewDatabase(t),
		RelayBinary: buildPostbox(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts, t.Output())
	require.NoError(t, err)
	s := res.Storm
	require.NotNil(t, s)
	requireEachOnce(t, "alone", s.Alone)
	requireEachOnce(t, "beside the storm", s.Beside)
	require.Equal(t, 2000, s.Seeded)
	require.Positive(t, s.Sent, "fresh failing events during the run")
	require.Zero(t, s.Lost, "failing events neither in the outbox nor held by the relay")
	require.GreaterOrEqual(t, s.Attempts, int64(s.Seeded), "every seeded event was attempted")

	var out strings.Builder
	res.Print(&out)
	t.Log(out.String())
	require.Contains(t, out.String(), "beside a storm of 2000 endpoints refusing connections")
	require.Contains(t, out.String(), "failing events lost 0")
}
