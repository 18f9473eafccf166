package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestReplayRateSpacesDueTimes: a replay at rate r makes its deliveries
// fall due 1/r apart, also for rates above one a second (fractions of a
// second apart).
func TestReplayRateSpacesDueTimes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	evs := ingest(t, s, "ep", "", "", "", "")
	for _, e := range evs {
		set(t, s, e.deliveryID, postboxtype.DeliveryDelivered, 0)
	}
	_, n, err := s.Replay(ctx, postboxtype.ReplayFilter{Endpoint: "ep"}, false, 4)
	require.NoError(t, err)
	require.Equal(t, len(evs), n)
	rows, err := s.Pool.Query(ctx, `SELECT next_attempt_at FROM postbox.deliveries WHERE replay_of IS NOT NULL ORDER BY next_attempt_at`)
	require.NoError(t, err)
	var due []time.Time
	for rows.Next() {
		var at time.Time
		require.NoError(t, rows.Scan(&at))
		due = append(due, at)
	}
	require.NoError(t, rows.Err())
	require.Len(t, due, len(evs))
	for i := 1; i < len(due); i++ {
		require.Equal(t, 250*time.Millisecond, due[i].Sub(due[i-1]), "deliveries %d and %d", i-1, i)
	}
}
