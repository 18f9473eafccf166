package store

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// HistogramFlushDefault is how long the recorder gathers attempts' latency
// counts in memory before it adds them to postbox.latency_histogram: one
// upsert every ten seconds in place of one with every batch of results
// (each a row per endpoint and bucket touched). The buckets are fine (4 %),
// so at 200 events a second over 10 endpoints a one-second flush still
// wrote about a row per event; over ten seconds an endpoint's attempts
// fall into far fewer buckets than there are attempts. Percentiles over
// hours do not notice ten seconds. A crash loses at most those ten
// seconds of counts; the attempts themselves are written with their
// results.
const HistogramFlushDefault = 10 * time.Second

// histogramMode is the setting under which the histogram trigger on
// postbox.attempts stands aside for the recorder, which counts in memory
// (migration 017). Other writers of attempts are counted by the trigger.
const histogramMode = `SELECT set_config('postbox.histograms', 'in_memory', true)`

// histKey is one row of postbox.latency_histogram.
type histKey struct {
	endpoint string
	bin      time.Time
	bucket   int16
}

// Histograms are latency counts not yet written: see RecordResults. One
// goroutine uses them.
type Histograms struct {
	// Every is how long counts gather before they are due
	// (HistogramFlushDefault when zero).
	Every   time.Duration
	counts  map[histKey]int64
	flushed time.Time
}

// NewHistograms returns empty counts, last written now.
func NewHistograms() *Histograms {
	return &Histograms{counts: map[histKey]int64{}, flushed: time.Now()}
}

// Pending reports whether counts wait to be written, and when they are due.
func (h *Histograms) Pending() (bool, time.Time) {
	every := h.Every
	if every <= 0 {
		every = HistogramFlushDefault
	}
	return len(h.counts) > 0, h.flushed.Add(every)
}

// latencyBucket is postbox.latency_bucket: buckets grow by 4 % from 1 µs.
func latencyBucket(ms float32) int16 {
	v := float64(ms)
	if v <= 0.001 {
		return 0
	}
	return int16(min(math.Ceil(math.Log(v/0.001)/math.Log(1.04)), math.MaxInt16))
}

// latencyBin is postbox.latency_bin: the start of a time's five minutes
// (bins start at multiples of five minutes since 2000-01-01 UTC, as they
// do since year 1).
func latencyBin(t time.Time) time.Time { return t.UTC().Truncate(5 * time.Minute) }

// countAttempts is the histogram counts of a batch's attempts.
func countAttempts(a *attemptRows) map[histKey]int64 {
	out := make(map[histKey]int64, len(a.endpoints))
	for i, ep := range a.endpoints {
		out[histKey{ep, latencyBin(a.started[i]), latencyBucket(a.ms[i])}]++
	}
	return out
}

// queueHistogramUpsert queues the addition of counts to
// postbox.latency_histogram, in key order (so instances lock rows in the
// same order).
func queueHistogramUpsert(b *pgx.Batch, counts map[histKey]int64) {
	keys := slices.SortedFunc(maps.Keys(counts), func(x, y histKey) int {
		return cmp.Or(strings.Compare(x.endpoint, y.endpoint), x.bin.Compare(y.bin), cmp.Compare(x.bucket, y.bucket))
	})
	eps, bins, buckets, ns := make([]string, len(keys)), make([]time.Time, len(keys)), make([]int16, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		eps[i], bins[i], buckets[i], ns[i] = k.endpoint, k.bin, k.bucket, counts[k]
	}
	b.Queue(`
		INSERT INTO postbox.latency_histogram AS h (endpoint, bin, bucket, count)
		SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::int2[], $4::int8[])
		ON CONFLICT (endpoint, bin, bucket) DO UPDATE SET count = h.count + excluded.count`,
		eps, bins, buckets, ns)
}

// FlushHistograms writes the counts h gathered (see RecordResults).
func (s *Store) FlushHistograms(ctx context.Context, h *Histograms) error {
	if len(h.counts) == 0 {
		h.flushed = time.Now()
		return nil
	}
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		queueHistogramUpsert(b, h.counts)
		return tx.SendBatch(ctx, b).Close()
	})
	h.flushed = time.Now() // after a failure too: the next try is a while away
	if err != nil {
		return fmt.Errorf("write latency histograms: %w", err)
	}
	clear(h.counts)
	return nil
}
