package maintain

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
)

// TestAnInstanceSeenGoneForAGraceLosesItsDeliveries: the sweep returns an
// instance's deliveries to the queue only once it has seen the instance
// gone for store.LifeGraceDefault; one that comes back meanwhile (as after
// a read-only spell whose end cut its connection) keeps them, and is seen
// afresh if it goes again.
func TestAnInstanceSeenGoneForAGraceLosesItsDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	pool := s.Pool

	queue(t, s, 2)
	claimed, err := s.Claim(ctx, "ghost", 2, nil, nil, 2, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	register := func(lease time.Duration) {
		t.Helper()
		require.NoError(t, s.Heartbeat(ctx, pool, store.Instance{ID: "ghost"}, lease, false))
	}
	gone := map[string]time.Time{}
	release := func(at time.Time) int64 {
		t.Helper()
		n, err := releaseAbandoned(ctx, s, gone, at, nil)
		require.NoError(t, err)
		return n
	}

	register(time.Millisecond) // expired at once: gone
	time.Sleep(10 * time.Millisecond)
	t0 := time.Now()
	require.Zero(t, release(t0), "first seen gone")
	require.Contains(t, gone, "ghost")
	require.Zero(t, release(t0.Add(store.LifeGraceDefault-time.Millisecond)), "not yet gone for a grace")

	register(time.Minute) // back
	require.Zero(t, release(t0.Add(2*store.LifeGraceDefault)), "alive again")
	require.NotContains(t, gone, "ghost", "forgotten once seen alive")

	register(time.Millisecond) // gone again: seen afresh
	time.Sleep(10 * time.Millisecond)
	t1 := t0.Add(3 * store.LifeGraceDefault)
	require.Zero(t, release(t1))
	require.EqualValues(t, 2, release(t1.Add(store.LifeGraceDefault)), "gone for a grace: its deliveries return")
}

// The rescuer, running, returns a dead instance's deliveries to the queue
// and says so.
func TestRescuerReturnsADeadInstancesDeliveries(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	ctx := context.Background()
	queue(t, tb.st, 2)
	claimed, err := tb.st.Claim(ctx, "ghost", 2, nil, nil, 2, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	require.NoError(t, tb.st.Heartbeat(ctx, tb.st.Pool, store.Instance{ID: "ghost"}, time.Millisecond, false))

	var queued atomic.Int32
	r := newRescuer(tb.env, new(sync.Mutex), func() { queued.Add(1) })
	require.Equal(t, HeartbeatDefault, r.interval, "the heartbeat's")
	r.interval = tick
	require.NoError(t, r.Start(ctx))
	defer r.Stop()
	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM postbox.deliveries WHERE status = 'pending' AND lease_owner IS NULL`) == 2
	}, store.LifeGraceDefault+wait, tick)
	require.Eventually(t, func() bool { return queued.Load() == 1 }, wait, tick)
}
