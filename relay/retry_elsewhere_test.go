package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestRetryIsClaimedWhenDueByAFreeInstance: a retry the streaming
// instance scheduled, whose lane that instance has filled when it falls
// due, is claimed by the other instance, which is free, long before its
// sweep (a minute: only the retry's own time can have woken it). Once the
// second instance was listening when the retry was scheduled (told by
// the first one's NOTIFY), once it started after (it finds the retry's
// time in the queue at its first claim).
func TestRetryIsClaimedWhenDueByAFreeInstance(t *testing.T) {
	t.Parallel()
	for _, listening := range []bool{true, false} {
		name := map[bool]string{true: "told", false: "found"}[listening]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			retryIsClaimedByAFreeInstance(t, listening)
		})
	}
}

func retryIsClaimedByAFreeInstance(t *testing.T, listening bool) {
	tb := setup(t)
	ctx := context.Background()
	sweep := time.Minute
	tb.cfg.SweepInterval = config.Duration(sweep)
	release := make(chan struct{})
	rc := newReceiver(t, func(n int, r received) int {
		var p struct{ Hang bool }
		_ = json.Unmarshal(r.Body, &p)
		if p.Hang {
			<-release
			return http.StatusOK
		}
		if n == 1 {
			return http.StatusServiceUnavailable // the first attempt: a retry
		}
		return http.StatusOK
	})
	// Two attempts at a time, ten held a lane (dispatch.LaneLimit): the
	// first instance's lane is full once it holds ten events that hang,
	// and should one of them reach the second instance instead, it still
	// has an attempt free. The retry falls due backoff after the failure
	// (jitter pinned to its top).
	backoff := 4 * time.Second
	tb.endpoint(t, "partner", rc.URL, func(ec *config.EndpointConfig) {
		ec.MaxInFlight = intp(2)
		ec.MaxAttempts = intp(10)
		ec.BackoffBase = durp(backoff)
		ec.BackoffCap = durp(backoff)
		ec.FailureThreshold = intp(100)
		ec.Timeout = durp(30 * time.Second)
	})
	first := tb.start(t, relay.Options{InstanceID: "first"}.WithRand(func() float64 { return 0.999 }))
	var second *relay.Relay
	if listening {
		second = tb.startStandby(t, relay.Options{InstanceID: "second"})
		// The first instance knows it is not alone at its next heartbeat
		// (every second here): only then does it tell the others.
		time.Sleep(2 * time.Second)
	}
	// Hanging attempts end before the relays stop (cleanups run last
	// first).
	t.Cleanup(func() { close(release) })

	id := tb.insert(t, outbox.Event{Endpoint: "partner", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 10*time.Second, "the first attempt failed", func() bool { return tb.status(id) == postboxtype.DeliveryFailed })
	failedAt := time.Now()
	hang := make([]outbox.Event, 10)
	for i := range hang {
		hang[i] = outbox.Event{Endpoint: "partner", Payload: json.RawMessage(`{"Hang": true}`)}
	}
	tb.insert(t, hang...)
	if !listening {
		second = tb.startStandby(t, relay.Options{InstanceID: "second"})
	}
	// The first instance's lane is full by the time the retry is due.
	require.Less(t, time.Since(failedAt), backoff, "set up before the retry fell due")

	waitUntil(t, sweep/2, "the retry delivered", func() bool { return tb.status(id) == postboxtype.DeliveryDelivered })
	var by string
	var at time.Time
	require.NoError(t, tb.pool.QueryRow(ctx, `
		SELECT a.instance, a.started_at FROM postbox.all_attempts a
		JOIN postbox.deliveries d ON d.id = a.delivery_id JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 AND a.attempt = 2`, id).Scan(&by, &at))
	require.Equal(t, second.InstanceID(), by, "the free instance made the retry (the first one's lane was full)")
	require.NotEqual(t, first.InstanceID(), by)
	require.Less(t, at.Sub(failedAt), sweep, "claimed when due, not at the free instance's sweep")
}
