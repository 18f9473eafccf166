package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A deduper asked to forget ids within seconds still remembers them for as
// long as their signature verifies: a captured request cannot be replayed
// once its id is forgotten.
func TestMemoryDeduperOutlivesTheTolerance(t *testing.T) {
	d := NewMemoryDeduper(time.Second)
	now := time.Unix(1_800_000_000, 0)
	d.now = func() time.Time { return now }
	first, _ := d.First(context.Background(), "evt_1")
	require.True(t, first)
	now = now.Add(2*DefaultTolerance - time.Second)
	again, _ := d.First(context.Background(), "evt_1")
	require.False(t, again, "still a duplicate while a replay would verify")
	now = now.Add(2 * time.Second)
	later, _ := d.First(context.Background(), "evt_1")
	require.True(t, later)
}
