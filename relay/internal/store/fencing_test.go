package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestStaleFencingTokenIsRefused: once another instance has taken the
// streaming lease over, a checkpoint write under the old fencing token is
// refused with ErrFenced, the whole ingest transaction it closes rolls
// back, and the checkpoint does not move, even to a later LSN.
func TestStaleFencingTokenIsRefused(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()

	old, ok, leader, err := s.AcquireLeadership(ctx, "old", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "old", leader)
	_, ok, leader, err = s.AcquireLeadership(ctx, "new", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a current lease is not taken over")
	require.Equal(t, "old", leader)

	// The old leader writes under its token while it holds the lease.
	oldConn := ingestAs(t, s, old)
	require.NoError(t, oldConn.Commit(ctx, pglogrepl.LSN(0x1000), false))
	requireCheckpoint(t, s, 0x1000)

	// It stops renewing (frozen, cut off): the lease runs out and another
	// instance takes over with a new token.
	renewed, err := s.RenewLeadership(ctx, "old", old, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, renewed)
	var lead store.Leadership
	require.Eventually(t, func() bool {
		l, ok, _, err := s.AcquireLeadership(ctx, "new", time.Minute)
		if err != nil || !ok {
			return false
		}
		lead = l
		return true
	}, 10*time.Second, 10*time.Millisecond, "the lapsed lease is taken over")
	require.Greater(t, lead.Token, old.Token)
	newConn := ingestAs(t, s, lead)
	require.NoError(t, newConn.Commit(ctx, pglogrepl.LSN(0x2000), false))
	requireCheckpoint(t, s, 0x2000)

	// The old leader wakes with an ingest transaction open and commits it
	// with a checkpoint past the new leader's.
	id := outbox.NewEventID()
	_, err = oldConn.Insert(ctx, []store.NewEvent{{
		OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: "ep", Payload: []byte(`{}`), CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
		Status:    postboxtype.DeliveryPending,
	}}, false)
	require.NoError(t, err)
	err = oldConn.Commit(ctx, pglogrepl.LSN(0x3000), true)
	require.ErrorIs(t, err, store.ErrFenced)
	require.True(t, store.IsFenced(err))
	require.False(t, oldConn.InTx(), "the refused transaction is ended")
	requireCheckpoint(t, s, 0x2000)
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events WHERE event_id = $1`, id).Scan(&n))
	require.Zero(t, n, "the events written with the refused checkpoint are rolled back with it")

	// A checkpoint alone (an empty transaction's) is refused as well, and
	// the old leader cannot renew the lease it lost.
	require.ErrorIs(t, oldConn.Commit(ctx, pglogrepl.LSN(0x4000), false), store.ErrFenced)
	requireCheckpoint(t, s, 0x2000)
	renewed, err = s.RenewLeadership(ctx, "old", old, time.Minute)
	require.NoError(t, err)
	require.False(t, renewed)

	// The new leader's writes go on.
	require.NoError(t, newConn.Commit(ctx, pglogrepl.LSN(0x5000), false))
	requireCheckpoint(t, s, 0x5000)
	var token int64
	var holder string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT fencing, leader FROM postbox.checkpoints WHERE slot = $1`, s.Slot).Scan(&token, &holder))
	require.Equal(t, lead.Token, token)
	require.Equal(t, "new", holder)
}

// ingestAs returns an ingest connection writing checkpoints under l.
func ingestAs(t *testing.T, s *store.Store, l store.Leadership) *store.IngestConn {
	t.Helper()
	ic, err := s.AcquireIngest(context.Background(), "me")
	require.NoError(t, err)
	t.Cleanup(ic.Release)
	ic.SetSession(l, "7000000000000000001", 1)
	return ic
}

func requireCheckpoint(t *testing.T, s *store.Store, want pglogrepl.LSN) {
	t.Helper()
	cp, err := s.Checkpoint(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, cp.LSN)
}
