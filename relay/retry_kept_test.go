package relay_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestRetriesAreKeptByTheInstanceAlone: an instance alone keeps the
// retries of the attempts it failed and makes them when due without
// claiming them from the queue (failed → in_flight); beside another
// registered instance, which could make them too, they are queued and
// claimed. Every event is delivered once either way, after its failures.
// A clean stop returns the retries kept to the queue at their own times.
func TestRetriesAreKeptByTheInstanceAlone(t *testing.T) {
	t.Parallel()
	aloneAndBeside(t, func(t *testing.T, peer bool) {
		tb := setup(t)
		ctx := context.Background()
		const failures, n = 2, 10
		var mu sync.Mutex
		seen := map[string]int{}
		var refuse atomic.Bool
		rc := newReceiver(t, func(_ int, r received) int {
			mu.Lock()
			defer mu.Unlock()
			seen[r.ID]++
			if seen[r.ID] <= failures || refuse.Load() {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		})
		tb.endpoint(t, "flaky", rc.URL, func(ec *config.EndpointConfig) {
			ec.MaxAttempts = intp(10)
			ec.BackoffBase = durp(200 * time.Millisecond)
			ec.BackoffCap = durp(400 * time.Millisecond)
			ec.FailureThreshold = intp(1000)
		})
		r := tb.start(t, relay.Options{})
		if peer {
			registerPeer(t, tb, r)
		}
		claims := countClaims(t, tb, "failed")
		exec(t, tb.pool, `INSERT INTO postbox.outbox (endpoint, payload) SELECT 'flaky', jsonb_build_object('i', i) FROM generate_series(1, 10) i`)
		tb.waitSettled(t, n, time.Minute)
		require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: n}, tb.deliveries(t))
		require.Equal(t, n*(failures+1), rc.count())
		for id, c := range rc.byID() {
			require.Equal(t, failures+1, c, id)
		}
		claimed := claims()
		if peer {
			require.Equal(t, n*failures, claimed, "every retry claimed from the queue")
			return
		}
		require.Zero(t, claimed, "no retry claimed: each kept by the instance that failed it")

		// A retry kept when the instance stops cleanly is queued at its
		// own time.
		refuse.Store(true)
		exec(t, tb.pool, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('flaky', '{"last": true}')`)
		waitUntil(t, 30*time.Second, "the last event failed and kept", func() bool {
			var kept bool
			_ = tb.pool.QueryRow(ctx, `SELECT lease_owner IS NOT DISTINCT FROM $1 FROM postbox.deliveries
				WHERE status = 'failed' AND attempt_count >= 1`, r.InstanceID()).Scan(&kept)
			return kept
		})
		var due time.Time
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT next_attempt_at FROM postbox.deliveries WHERE status = 'failed'`).Scan(&due))
		require.NoError(t, r.Stop(ctx))
		var owner *string
		var after time.Time
		var status string
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT status, lease_owner, next_attempt_at FROM postbox.deliveries WHERE attempt_count >= 1 AND status <> 'delivered'`).Scan(&status, &owner, &after))
		require.Equal(t, "failed", status)
		require.Nil(t, owner, "returned to the queue")
		require.False(t, after.Before(due), "at its own time, not earlier")
	})
}
