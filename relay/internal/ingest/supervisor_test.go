package ingest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// After a failover only a slot that was there before the session is
// streamed on, and only if it confirms nothing past the server's own
// checkpoint or the old primary was guarded: ahead of the checkpoint on an
// unguarded primary it may have confirmed an ingest this server never
// received; one just made has no past to trust.
func TestSlotCameAlongOnlyWhenItSkippedNothing(t *testing.T) {
	cp := store.Checkpoint{LSN: 1000, Timeline: 1}
	for _, guarded := range []bool{false, true} {
		require.True(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 1000}, cp, guarded))
		require.True(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 900}, cp, guarded))
		require.False(t, slotCameAlong(wal.SlotState{Exists: true}, cp, guarded), "never confirmed")
		require.False(t, slotCameAlong(wal.SlotState{ConfirmedFlush: 900}, cp, guarded), "made now")
	}
	require.False(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 1001}, cp, false), "ahead of the checkpoint, unguarded")
	require.True(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 1001}, cp, true), "ahead of the checkpoint over no outbox change")
}
