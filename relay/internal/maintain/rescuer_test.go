package maintain

import (
	"context"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/internal/proc"
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
		n, err := releaseAbandoned(ctx, s, gone, nil, at, nil)
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

// TestRescuerTakesBackAGoneNeighboursClaimsAtOnce: an instance registered
// from this host, boot and pid namespace whose process is gone loses its
// deliveries at the rescuer's first look, although its registration has
// an hour to run and the heartbeat rule would wait for it; one registered
// from another boot keeps them (no proof: the rule decides).
func TestRescuerTakesBackAGoneNeighboursClaimsAtOnce(t *testing.T) {
	t.Parallel()
	me := proc.Self()
	if !me.Provable() {
		t.Skip("no proof of a process's end on this OS")
	}
	tb := setup(t, nil)
	ctx := context.Background()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	gone := me
	gone.PID = cmd.Process.Pid
	elsewhere := gone
	elsewhere.BootID = "00000000-0000-0000-0000-000000000000"
	queue(t, tb.st, 4)
	for id, p := range map[string]proc.Process{"gone": gone, "elsewhere": elsewhere} {
		claimed, err := tb.st.Claim(ctx, id, 2, nil, nil, 2, nil)
		require.NoError(t, err)
		require.Len(t, claimed, 2)
		require.NoError(t, tb.st.Heartbeat(ctx, tb.st.Pool, store.Instance{ID: id, Hostname: p.Host, PID: p.PID, Process: p}, time.Hour, false))
	}

	var queued atomic.Int32
	r := newRescuer(tb.env, new(sync.Mutex), func() { queued.Add(1) })
	r.rescue(ctx)
	require.Equal(t, 2, count(t, tb.st, `SELECT count(*) FROM postbox.deliveries WHERE status = 'pending' AND lease_owner IS NULL`),
		"the gone one's, at the first look")
	require.Equal(t, 2, count(t, tb.st, `SELECT count(*) FROM postbox.deliveries WHERE status = 'in_flight' AND lease_owner = 'elsewhere'`))
	require.EqualValues(t, 1, queued.Load())
	require.Contains(t, tb.log.String(), "its claims return at once")
	require.Contains(t, tb.log.String(), `"instance":"gone"`)
	require.NotContains(t, tb.log.String(), `"instance":"elsewhere"`)
	r.rescue(ctx)
	require.Equal(t, 2, count(t, tb.st, `SELECT count(*) FROM postbox.deliveries WHERE status = 'in_flight' AND lease_owner = 'elsewhere'`),
		"no proof: its registration stands")
}
