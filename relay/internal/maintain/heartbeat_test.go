package maintain

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
)

// The heartbeat registers the instance on its connection for life, notes
// when no other instance is alive, and closes that connection on Stop.
func TestHeartbeatRegistersAndLooksForPeers(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	ctx := context.Background()
	require.NoError(t, tb.st.Heartbeat(ctx, tb.st.Pool, store.Instance{ID: "other"}, time.Minute, false))
	h := newHeartbeat(tb.env, new(sync.Mutex), func() bool { return true })
	require.Equal(t, HeartbeatDefault, h.interval, "the default lease is longer than three seconds")
	h.interval = tick
	require.NoError(t, h.Start(ctx))
	defer h.Stop()

	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM postbox.instances WHERE id = 'me' AND streaming AND backend_pid IS NOT NULL`) == 1
	}, wait, tick, "registered, streaming, on its connection for life")
	require.False(t, tb.env.Alone())
	_, err := tb.st.Pool.Exec(ctx, `DELETE FROM postbox.instances WHERE id = 'other'`)
	require.NoError(t, err)
	require.Eventually(t, tb.env.Alone, wait, tick, "no other instance is alive")
	require.Contains(t, tb.log.String(), "no other instance is alive")

	h.Stop()
	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'postbox liveness' AND datname = current_database()`) == 0
	}, wait, tick, "the connection for life is closed")
}

// The interval is a second, or a third of a shorter lease, never under
// HeartbeatMin.
func TestHeartbeatInterval(t *testing.T) {
	t.Parallel()
	require.Equal(t, HeartbeatDefault, heartbeatInterval(time.Minute))
	require.Equal(t, 500*time.Millisecond, heartbeatInterval(1500*time.Millisecond))
	require.Equal(t, HeartbeatMin, heartbeatInterval(30*time.Millisecond))
}
