package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// BenchmarkClaimBesideFailingEndpoints claims from ten healthy endpoints
// while failing endpoints, each with a retry due later and its breaker
// still closed (a storm of failing partners), share the queue: a claim's
// database time should not grow with them.
func BenchmarkClaimBesideFailingEndpoints(b *testing.B) {
	benchmarkClaimBeside(b, "failing", queueFailing)
}

// queueFailing gives n endpoints a failed delivery each, retried in a
// minute to an hour, their breakers closed.
func queueFailing(b *testing.B, s *store.Store, n int) {
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		ic, err := s.AcquireIngest(ctx, "me")
		if err != nil {
			b.Fatal(err)
		}
		var evs []store.NewEvent
		for i := start; i < min(n, start+1000); i++ {
			evs = append(evs, store.NewEvent{
				OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: fmt.Sprintf("failing-%05d", i), Payload: []byte(`{}`), CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
				Status:    postboxtype.DeliveryPending,
			})
		}
		if _, err := ic.Insert(ctx, evs, false); err != nil {
			b.Fatal(err)
		}
		if err := ic.Commit(ctx, 0, false); err != nil {
			b.Fatal(err)
		}
		ic.Release()
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'failed', attempt_count = 1,
		next_attempt_at = now() + interval '1 minute' + random() * interval '1 hour' WHERE endpoint LIKE 'failing-%'`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures)
		SELECT DISTINCT endpoint, 'closed', 1 FROM postbox.deliveries WHERE endpoint LIKE 'failing-%'`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `VACUUM ANALYZE postbox.deliveries`); err != nil {
		b.Fatal(err)
	}
}
