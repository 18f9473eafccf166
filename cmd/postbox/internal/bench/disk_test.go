package bench

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDiskFlushTimesEachFlush: the probe times every flush it was asked
// for, orders its quantiles and leaves nothing behind; a cancelled probe
// fails rather than report a part.
func TestDiskFlushTimesEachFlush(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d, err := diskFlush(context.Background(), dir, 30, 1000)
	require.NoError(t, err)
	require.Equal(t, 30, d.Samples)
	require.Equal(t, 1000, d.PerS)
	require.Positive(t, d.P50ms)
	require.LessOrEqual(t, d.P50ms, d.P99ms)
	require.LessOrEqual(t, d.P99ms, d.Maxms)
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, left, "the probe's file is removed")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = diskFlush(ctx, dir, 30, 1000)
	require.ErrorIs(t, err, context.Canceled)
	left, err = os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, left)
}
