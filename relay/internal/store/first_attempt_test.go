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

// TestFirstAttemptThatDeliveredStaysOnItsDelivery: the recorder keeps a
// first attempt that delivered on its delivery's row (migration 026)
// instead of inserting an attempt row; every other attempt gets its row,
// and so does a first attempt whose delivery is no longer the recorder's
// (its lease was taken), so that no attempt goes unrecorded. Each attempt
// is in postbox.all_attempts once, and each is counted in the histograms.
func TestFirstAttemptThatDeliveredStaysOnItsDelivery(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ingested := ingestInFlight(t, s, "ep", 4)
	require.Len(t, ingested, 4)
	kept, failed, taken, second := ingested[0].DeliveryID, ingested[1].DeliveryID, ingested[2].DeliveryID, ingested[3].DeliveryID
	_, err := s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET lease_owner = 'other' WHERE id = $1`, taken)
	require.NoError(t, err)

	at := time.Now().Truncate(time.Microsecond)
	ok := func(id int64, attempt int) state.Result {
		return state.Result{DeliveryID: id, Endpoint: "ep", Attempt: attempt, Status: postboxtype.DeliveryDelivered, Attempted: true,
			Sampled: true, StatusCode: 200, ResponseMS: 2.25, Response: "fine", At: at, CommitToDeliveryMS: 3,
			Target: "http://127.0.0.1/hook"}
	}
	rs := []state.Result{ok(kept, 1), ok(taken, 1), ok(second, 2),
		{DeliveryID: failed, Endpoint: "ep", Attempt: 1, Status: postboxtype.DeliveryFailed, Attempted: true, Sampled: true,
			StatusCode: 503, ResponseMS: 1, At: at, Delay: time.Minute, CommitToDeliveryMS: -1, LastError: "http 503",
			ErrorClass: "http_5xx", Target: "http://127.0.0.1/hook"}}
	hist := store.NewHistograms()
	keep := func(cur store.Health, _ []state.Result) store.Health { return cur }
	_, err = s.RecordResults(ctx, "me", rs, keep, hist)
	require.NoError(t, err)

	var rows []int64
	r, err := s.Pool.Query(ctx, `SELECT delivery_id FROM postbox.attempts ORDER BY delivery_id`)
	require.NoError(t, err)
	for r.Next() {
		var id int64
		require.NoError(t, r.Scan(&id))
		rows = append(rows, id)
	}
	require.NoError(t, r.Err())
	require.Equal(t, []int64{failed, taken, second}, rows, "an attempt row for all but the first that delivered")

	var status, target, by string
	var attempts int
	require.NoError(t, s.Pool.QueryRow(ctx, `
		SELECT status, attempt_count, attempt_target, attempted_by FROM postbox.deliveries WHERE id = $1`, kept).
		Scan(&status, &attempts, &target, &by))
	require.Equal(t, []any{"delivered", 1, "http://127.0.0.1/hook", "me"}, []any{status, attempts, target, by})
	var marked int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE attempted_by IS NOT NULL`).Scan(&marked))
	require.Equal(t, 1, marked, "only the delivery its attempt is kept on is marked")

	var n, code int
	var started time.Time
	var ms float32
	var outcome, response, instance string
	require.NoError(t, s.Pool.QueryRow(ctx, `
		SELECT count(*) OVER (), attempt, started_at, duration_ms, status_code, outcome, response, target, instance
		FROM postbox.all_attempts WHERE delivery_id = $1`, kept).
		Scan(&n, &attempts, &started, &ms, &code, &outcome, &response, &target, &instance))
	require.Equal(t, []any{1, 1, float32(2.25), 200, "delivered", "fine", "http://127.0.0.1/hook", "me"},
		[]any{n, attempts, ms, code, outcome, response, target, instance})
	require.WithinDuration(t, at.Add(-2250*time.Microsecond), started, time.Microsecond, "its start: delivered_at less its response time")
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.all_attempts`).Scan(&n))
	require.Equal(t, 4, n, "each attempt once")

	require.NoError(t, s.FlushHistograms(ctx, hist))
	var counted int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM postbox.latency_histogram WHERE endpoint = 'ep'`).Scan(&counted))
	require.EqualValues(t, 4, counted, "each attempt counted once, wherever it is kept")
}
