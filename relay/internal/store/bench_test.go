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

// BenchmarkIngest writes batches of events and their checkpoint in one
// transaction each, as the ingester does for each group of commits, with
// and without search keys to extract and index.
func BenchmarkIngest(b *testing.B) {
	for _, keys := range [][]string{nil, {"click_id", "payout"}} {
		for _, n := range []int{1, 100, 2000} {
			b.Run(fmt.Sprintf("search_keys=%d/rows=%d", len(keys), n), func(b *testing.B) {
				benchmarkIngest(b, n, keys, true)
			})
		}
	}
}

// BenchmarkReportTriggers is what the report rollups' triggers (migration
// 038) cost the ingest and the recorder: each of their benchmarks with
// the triggers and without.
//
//	go test -run '^$' -bench ReportTriggers ./relay/internal/store
func BenchmarkReportTriggers(b *testing.B) {
	for _, on := range []bool{true, false} {
		for _, n := range []int{100, 2000} {
			b.Run(fmt.Sprintf("ingest/rows=%d/triggers=%t", n, on), func(b *testing.B) { benchmarkIngest(b, n, nil, on) })
		}
		b.Run(fmt.Sprintf("claim_and_record/triggers=%t", on), func(b *testing.B) { benchmarkClaimAndRecord(b, on) })
	}
}

// setupReport is setup, with the report triggers disabled unless on.
func setupReport(b *testing.B, on bool) *store.Store {
	s := setup(b)
	if !on {
		for _, sql := range []string{
			`ALTER TABLE postbox.events DISABLE TRIGGER report_events_add`,
			`ALTER TABLE postbox.deliveries DISABLE TRIGGER report_deliveries_insert`,
			`ALTER TABLE postbox.deliveries DISABLE TRIGGER report_deliveries_update`,
		} {
			if _, err := s.Pool.Exec(context.Background(), sql); err != nil {
				b.Fatal(err)
			}
		}
	}
	return s
}

func benchmarkIngest(b *testing.B, n int, keys []string, reportTriggers bool) {
	benchIngestOn(b, setupReport(b, reportTriggers), n, keys...)
}

func benchIngestOn(b *testing.B, s *store.Store, n int, keys ...string) {
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "me")
	if err != nil {
		b.Fatal(err)
	}
	defer ic.Release()
	ic.SetSearchKeys(keys)
	payload := []byte(`{"click_id":"clk_7Hq2","payout":"12.50","currency":"EUR"}`)
	evs := make([]store.NewEvent, n)
	b.ResetTimer()
	for b.Loop() {
		for i := range evs {
			evs[i] = store.NewEvent{
				OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: fmt.Sprintf("ep-%d", i%10), Payload: payload, CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
				Status:    postboxtype.DeliveryPending,
			}
		}
		if _, err := ic.Insert(ctx, evs, false); err != nil {
			b.Fatal(err)
		}
		if err := ic.Commit(ctx, 0, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkClaimAndRecord claims a batch of 100 queued deliveries across
// ten endpoints and records them delivered: the queue's round trip per
// batch when the relay catches up.
func BenchmarkClaimAndRecord(b *testing.B) { benchmarkClaimAndRecord(b, true) }

func benchmarkClaimAndRecord(b *testing.B, reportTriggers bool) {
	s := setupReport(b, reportTriggers)
	ctx := context.Background()
	apply := func(cur store.Health, _ []state.Result) store.Health { return cur }
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		for i := range 10 {
			queue(b, s, fmt.Sprintf("ep-%d", i), 10)
		}
		b.StartTimer()
		claimed, err := s.Claim(ctx, "me", 10, nil, nil, 100, nil)
		if err != nil || len(claimed) != 100 {
			b.Fatalf("claimed %d: %v", len(claimed), err)
		}
		rs := make([]state.Result, len(claimed))
		for i, c := range claimed {
			rs[i] = state.Result{DeliveryID: c.DeliveryID, Endpoint: c.Endpoint, Status: postboxtype.DeliveryDelivered,
				Attempted: true, Sampled: true, Signal: state.SignalSuccess, StatusCode: 204, ResponseMS: 1.2,
				At: time.Now(), CommitToDeliveryMS: -1}
		}
		if _, err := s.RecordResults(ctx, "me", rs, apply, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(100*b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

// BenchmarkClaimBesideDeadEndpoints claims from ten healthy endpoints while
// dead endpoints, each with an open breaker and deliveries waiting on it,
// share the queue, parked as the claimer's sweep parks them: a claim's
// database time should not grow with them.
func BenchmarkClaimBesideDeadEndpoints(b *testing.B) {
	benchmarkClaimBeside(b, "dead", queueDead)
}

// benchmarkClaimBeside claims 100 deliveries of ten healthy endpoints
// while crowd(n) other endpoints share the queue, for n of 0, 1,000 and
// 10,000.
func benchmarkClaimBeside(b *testing.B, name string, crowd func(*testing.B, *store.Store, int)) {
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("%s=%d", name, n), func(b *testing.B) {
			s := setup(b)
			ctx := context.Background()
			if n > 0 {
				crowd(b, s, n)
			}
			for i := range 10 {
				queue(b, s, fmt.Sprintf("live-%d", i), 10)
			}
			b.ResetTimer()
			for b.Loop() {
				claimed, err := s.Claim(ctx, "me", 10, nil, nil, 100, nil)
				if err != nil || len(claimed) != 100 {
					b.Fatal(len(claimed), err)
				}
				b.StopTimer()
				if _, err := s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'pending', lease_owner = NULL WHERE status = 'in_flight'`); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// queueDead gives n endpoints three failed deliveries each and an open
// breaker with an hour's cooldown.
func queueDead(b *testing.B, s *store.Store, n int) {
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		ic, err := s.AcquireIngest(ctx, "me")
		if err != nil {
			b.Fatal(err)
		}
		var evs []store.NewEvent
		for i := start; i < min(n, start+1000); i++ {
			for range 3 {
				evs = append(evs, store.NewEvent{
					OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: fmt.Sprintf("dead-%05d", i), Payload: []byte(`{}`), CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
					Status:    postboxtype.DeliveryPending,
				})
			}
		}
		if _, err := ic.Insert(ctx, evs, false); err != nil {
			b.Fatal(err)
		}
		if err := ic.Commit(ctx, 0, false); err != nil {
			b.Fatal(err)
		}
		ic.Release()
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'failed', attempt_count = 1 WHERE endpoint LIKE 'dead-%'`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, state, opened_at, cooldown_seconds)
		SELECT DISTINCT endpoint, 'open', now(), 3600 FROM postbox.deliveries WHERE endpoint LIKE 'dead-%'`); err != nil {
		b.Fatal(err)
	}
	// What the claimer's sweep does with them (Claimer.park).
	for {
		n, err := s.Park(ctx, store.ParkBatchDefault)
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if _, err := s.Pool.Exec(ctx, `VACUUM ANALYZE postbox.deliveries`); err != nil {
		b.Fatal(err)
	}
}
