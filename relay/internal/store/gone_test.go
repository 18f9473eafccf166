package store_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// goneProcess is a process of this host that ran and was reaped: proven
// gone (proc.Gone) where proof is possible.
func goneProcess(t *testing.T) proc.Process {
	t.Helper()
	me := proc.Self()
	if !me.Provable() {
		t.Skip("no proof of a process's end on this OS")
	}
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	p := me
	p.PID = cmd.Process.Pid
	require.True(t, proc.Gone(p))
	return p
}

// TestAGoneInstanceOfThisHostIsProvenAndExpired: the registrations of this
// host, boot and pid namespace are the neighbours; one whose process is
// gone is expired at once (dead to the heartbeat rule, not a peer), one
// registered from another boot is not a neighbour, and a registration
// without a process (before 029, or not Linux) proves nothing.
func TestAGoneInstanceOfThisHostIsProvenAndExpired(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	me := proc.Self()
	gone := goneProcess(t)
	other := gone
	other.BootID = "00000000-0000-0000-0000-000000000000"
	for id, p := range map[string]proc.Process{"me": me, "gone": gone, "other-boot": other, "alive": me} {
		require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: id, Hostname: p.Host, PID: p.PID, Process: p}, time.Hour, false))
	}
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "unknown", Hostname: me.Host, PID: gone.PID}, time.Hour, false))

	near, err := s.Neighbours(ctx, me, "me")
	require.NoError(t, err)
	require.Equal(t, map[string]proc.Process{"gone": gone, "alive": me}, near)
	p, ok, err := s.InstanceProcess(ctx, "gone")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, gone, p)
	_, ok, err = s.InstanceProcess(ctx, "unknown")
	require.NoError(t, err)
	require.False(t, ok, "no process registered: nothing to prove")

	peers, err := s.Peers(ctx, "me")
	require.NoError(t, err)
	require.Equal(t, 4, peers)
	expired, err := s.ExpireGone(ctx, map[string]proc.Process{"gone": gone})
	require.NoError(t, err)
	require.Equal(t, []string{"gone"}, expired)
	peers, err = s.Peers(ctx, "me")
	require.NoError(t, err)
	require.Equal(t, 3, peers, "the gone one is no peer")
	near, err = s.Neighbours(ctx, me, "me")
	require.NoError(t, err)
	require.NotContains(t, near, "gone")
	recycled := me
	recycled.Start++
	expired, err = s.ExpireGone(ctx, map[string]proc.Process{"alive": recycled})
	require.NoError(t, err)
	require.Empty(t, expired, "only a row naming the process proven gone")
}

// TestLeadershipIsTakenFromAGoneLeaderAtOnce: the lead of an instance
// proven gone is taken before its lease runs out, with a new fencing
// token; a leader named otherwise keeps it.
func TestLeadershipIsTakenFromAGoneLeaderAtOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	old, ok, _, err := s.AcquireLeadership(ctx, "old", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, leader, err := s.TakeLeadershipFrom(ctx, "new", "someone-else", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "the lease of a leader not proven gone stands")
	require.Equal(t, "old", leader)
	lead, ok, leader, err := s.TakeLeadershipFrom(ctx, "new", "old", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "new", leader)
	require.Greater(t, lead.Token, old.Token)
}
