package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestHistogramsCountedInMemoryMatchTheTrigger: the recorder's latency
// counts, gathered in memory and written once due, land in the same bins
// and buckets as the trigger puts the same attempts written by anyone
// else; and they are not counted twice.
func TestHistogramsCountedInMemoryMatchTheTrigger(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	keep := func(cur store.Health, _ []state.Result) store.Health { return cur }
	bin := time.Now().UTC().Truncate(5 * time.Minute)
	durations := []float64{0.0004, 0.001, 0.0011, 0.37, 1, 1.04, 12.5, 250, 3000, 29999.9}
	var rs []state.Result
	for i, ms := range durations {
		for _, at := range []time.Time{bin.Add(time.Second), bin.Add(-time.Second)} { // two bins
			rs = append(rs, state.Result{DeliveryID: int64(i + 1), Endpoint: "mem", Status: postboxtype.DeliveryDelivered, Attempted: true,
				Sampled: true, Attempt: 1, ResponseMS: ms, StatusCode: 200, At: at.Add(time.Duration(ms * float64(time.Millisecond))),
				CommitToDeliveryMS: -1})
		}
	}
	hist := store.NewHistograms()
	hist.Every = 200 * time.Millisecond
	_, err := s.RecordResults(ctx, "me", rs[:10], keep, hist)
	require.NoError(t, err)
	histogram := func(endpoint string) map[[2]int64]int64 {
		rows, err := s.Pool.Query(ctx, `SELECT extract(epoch FROM bin)::int8, bucket, count FROM postbox.latency_histogram WHERE endpoint = $1`, endpoint)
		require.NoError(t, err)
		defer rows.Close()
		out := map[[2]int64]int64{}
		for rows.Next() {
			var b, bucket, n int64
			require.NoError(t, rows.Scan(&b, &bucket, &n))
			out[[2]int64{b, bucket}] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Empty(t, histogram("mem"), "counted in memory, not yet due")
	pending, due := hist.Pending()
	require.True(t, pending)
	require.WithinDuration(t, time.Now().Add(hist.Every), due, hist.Every)

	time.Sleep(hist.Every) // the next batch writes them all
	_, err = s.RecordResults(ctx, "me", rs[10:], keep, hist)
	require.NoError(t, err)
	pending, _ = hist.Pending()
	require.False(t, pending)
	require.NoError(t, s.FlushHistograms(ctx, hist), "nothing left: writes nothing")

	// The same attempts written by another writer: the trigger counts them.
	for _, r := range rs {
		_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.attempts (endpoint, started_at, duration_ms, outcome) VALUES ('trigger', $1, $2, 'delivered')`,
			r.At.Add(-time.Duration(r.ResponseMS*float64(time.Millisecond))), float32(r.ResponseMS))
		require.NoError(t, err)
	}
	want := histogram("trigger")
	require.Len(t, want, 2*len(durations), "each duration in a bucket of its own, in each bin")
	require.Equal(t, want, histogram("mem"))
	var attempts int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.attempts WHERE endpoint = 'mem'`).Scan(&attempts))
	require.Equal(t, len(rs), attempts)

	// Counts still in memory are written on their own.
	_, err = s.RecordResults(ctx, "me", rs[:1], keep, hist)
	require.NoError(t, err)
	require.NoError(t, s.FlushHistograms(ctx, hist))
	got := histogram("mem")
	var total, wantTotal int64
	for _, n := range got {
		total += n
	}
	for _, n := range histogram("trigger") {
		wantTotal += n
	}
	require.Equal(t, wantTotal+1, total, "one more attempt counted once")
}
