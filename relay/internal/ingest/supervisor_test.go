package ingest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// After a failover only a slot that was there before the session and
// confirms nothing past the server's own checkpoint is streamed on: one
// ahead of it confirmed an ingest this server never received, and one
// just made has no past to trust.
func TestSlotCameAlongOnlyAtOrBehindTheCheckpoint(t *testing.T) {
	cp := store.Checkpoint{LSN: 1000, Timeline: 1}
	require.True(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 1000}, cp))
	require.True(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 900}, cp))
	require.False(t, slotCameAlong(wal.SlotState{Exists: true, ConfirmedFlush: 1001}, cp), "ahead of the checkpoint")
	require.False(t, slotCameAlong(wal.SlotState{Exists: true}, cp), "never confirmed")
	require.False(t, slotCameAlong(wal.SlotState{ConfirmedFlush: 900}, cp), "made now")
}
