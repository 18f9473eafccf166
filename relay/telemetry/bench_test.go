package telemetry_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// BenchmarkEndpointPercentiles answers `postbox endpoints` and the
// per-minute refresh for two endpoints with n samples each in the window:
// exact up to telemetry.ExactSamples, from the histograms above.
func BenchmarkEndpointPercentiles(b *testing.B) {
	for _, n := range []int{50000, 1000000} {
		b.Run(fmt.Sprintf("samples=%d", 2*n), func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			exec(b, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
				SELECT 'ep-' || (i % 2), random() * 100, 200, 'delivered', now() - (i::float8 / $1) * interval '23 hours'
				FROM generate_series(1, $1) i`, 2*n)
			exec(b, pool, `VACUUM ANALYZE postbox.attempts`)
			b.Run("endpoints", func(b *testing.B) {
				for b.Loop() {
					if _, err := telemetry.LoadEndpoints(ctx, pool, "ep-1"); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("refresh", func(b *testing.B) {
				for b.Loop() {
					if err := telemetry.RefreshPercentiles(ctx, pool); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkSummary reads the health summary with 720,000 deliveries in the
// last hour (200 a second): whole, as `postbox status` does, and the queue
// half the relays' gauges read every 15 seconds.
func BenchmarkSummary(b *testing.B) {
	pool := setup(b)
	ctx := context.Background()
	exec(b, pool, `INSERT INTO postbox.deliveries (event_pk, endpoint, status, delivered_at, commit_to_delivery_ms, last_response_ms, attempt_count)
		SELECT i, 'ep-' || (i % 10), 'delivered', now() - (i::float8 / 720000) * interval '59 minutes', random() * 50, random() * 10, 1
		FROM generate_series(1, 720000) i`)
	exec(b, pool, `VACUUM ANALYZE postbox.deliveries`)
	for name, load := range map[string]func(context.Context, telemetry.Querier, string) (telemetry.Summary, error){
		"status": telemetry.LoadSummary, "gauges": telemetry.LoadQueueSummary,
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := load(ctx, pool, "postbox"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
