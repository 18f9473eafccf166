package report_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/seed"
	"github.com/postbox-relay/postbox/relay/report"
)

// heapWatch discards a CSV, counting its bytes and lines and sampling the
// heap every 256 KiB written: a CSV held whole before it is written would
// show as a heap the size of the file.
type heapWatch struct {
	bytes, lines, next int64
	peak               uint64
}

func (h *heapWatch) Write(p []byte) (int, error) {
	h.bytes += int64(len(p))
	for _, c := range p {
		if c == '\n' {
			h.lines++
		}
	}
	if h.bytes >= h.next {
		h.next = h.bytes + 256<<10
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		h.peak = max(h.peak, m.HeapInuse)
	}
	return len(p), nil
}

// BenchmarkReport: with 1,000,000 deliveries over the last 30 days across
// 1,000 endpoints (and their events and attempts, seeded set-based, which
// takes a minute or two), the 30-day report of one endpoint (bound: 200
// ms), and a day's CSV of 100,000 deliveries of another (bound: 2 s),
// which streams: the heap stays a fraction of the file.
//
//	go test -run '^$' -bench Report -benchtime 5x ./relay/report
func BenchmarkReport(b *testing.B) {
	ctx := context.Background()
	pool := migrated(b)
	began := time.Now()
	if err := seed.History(ctx, pool, seed.Spec{Events: 1_000_000, Endpoints: 1000, Days: 30}); err != nil {
		b.Fatal(err)
	}
	day := time.Now().UTC().AddDate(0, 0, -1).Truncate(24 * time.Hour)
	if err := seed.Day(ctx, pool, "partner_big", 100_000, 1, day, day.Add(24*time.Hour-time.Millisecond)); err != nil {
		b.Fatal(err)
	}
	if err := seed.Analyze(ctx, pool); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded 1,100,000 deliveries in %s", time.Since(began).Round(time.Second))

	b.Run("30-day report of one endpoint", func(b *testing.B) {
		var worst time.Duration
		for b.Loop() {
			t0 := time.Now()
			days, err := report.Daily(ctx, pool, seed.Endpoint(7), time.Now().AddDate(0, 0, -30), time.Now(), time.UTC)
			worst = max(worst, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			var n int64
			for _, d := range days {
				n += d.Committed
			}
			if n != 1000 {
				b.Fatalf("%d events committed in 30 days, want 1000", n)
			}
		}
		b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
		if worst > 200*time.Millisecond {
			b.Errorf("the slowest report took %s, above 200ms", worst)
		}
	})
	b.Run("day CSV of 100,000 deliveries", func(b *testing.B) {
		var worst time.Duration
		var h heapWatch
		for b.Loop() {
			runtime.GC()
			h = heapWatch{}
			t0 := time.Now()
			err := report.WriteDayCSV(ctx, pool, &h, "partner_big", day.Format(time.DateOnly), time.UTC)
			worst = max(worst, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			if h.lines != 100_001 {
				b.Fatalf("%d lines, want 100,001", h.lines)
			}
		}
		b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
		b.ReportMetric(float64(h.bytes)/(1<<20), "csv-MiB")
		b.ReportMetric(float64(h.peak)/(1<<20), "peak-heap-MiB")
		if worst > 2*time.Second {
			b.Errorf("the slowest CSV took %s, above 2s", worst)
		}
		if h.peak > uint64(h.bytes)/2 {
			b.Errorf("the heap reached %d bytes for a CSV of %d: held, not streamed", h.peak, h.bytes)
		}
	})
}
