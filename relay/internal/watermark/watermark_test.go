package watermark_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/watermark"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	w := watermark.New[uint64](10)
	require.True(t, closed(w.WaitFor(5)), "already reached")
	require.True(t, closed(w.WaitFor(10)), "reached exactly")
	at20, at30 := w.WaitFor(20), w.WaitFor(30)
	require.False(t, closed(at20))

	require.False(t, w.Advance(9), "never backwards")
	require.Equal(t, uint64(10), w.Get())
	require.True(t, w.Advance(25))
	require.True(t, closed(at20))
	require.False(t, closed(at30))

	w.Reset(0)
	require.Equal(t, uint64(0), w.Get())
	require.False(t, closed(at30), "a reset below keeps waiters waiting")
	go w.Advance(31)
	select {
	case <-at30:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not released")
	}
}
