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

// TestLargeBatchesCopyTheirAttempts: from CopyAttemptsMin results on, a
// batch copies its attempt rows rather than inserting them from arrays.
// The rows are the same either way (NULL where there was no status code,
// error class, error, response or target), and without the recorder's
// in-memory histograms the attempts table's trigger counts copied rows as
// it counts inserted ones.
func TestLargeBatchesCopyTheirAttempts(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	keep := func(cur store.Health, _ []state.Result) store.Health { return cur }
	at := time.Now().Truncate(time.Microsecond)
	batch := func(endpoint string, n int) []state.Result {
		rs := make([]state.Result, n)
		for i := range rs {
			rs[i] = state.Result{DeliveryID: int64(i + 1), Endpoint: endpoint, Attempt: 1 + i%3, Status: postboxtype.DeliveryDelivered,
				Attempted: true, Sampled: true, StatusCode: 200, ResponseMS: 1.5 + float64(i), Response: "ok",
				At: at.Add(time.Duration(i) * time.Millisecond), CommitToDeliveryMS: -1, Target: "http://127.0.0.1/hook"}
			if i%2 == 1 {
				rs[i].Status, rs[i].StatusCode, rs[i].Response, rs[i].Target = postboxtype.DeliveryFailed, 0, "", ""
				rs[i].ErrorClass, rs[i].LastError = "connection", "connection refused"
			}
		}
		return rs
	}
	_, err := s.RecordResults(ctx, "me", batch("inserted", store.CopyAttemptsMin-1), keep, nil)
	require.NoError(t, err)
	_, err = s.RecordResults(ctx, "me", batch("copied", store.CopyAttemptsMin), keep, nil)
	require.NoError(t, err)

	read := func(endpoint string) [][]any {
		t.Helper()
		rows, err := s.Pool.Query(ctx, `
			SELECT delivery_id, attempt, started_at, duration_ms, status_code, outcome, error_class, error, response, target, instance
			FROM postbox.attempts WHERE endpoint = $1 ORDER BY delivery_id`, endpoint)
		require.NoError(t, err)
		defer rows.Close()
		var out [][]any
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			out = append(out, vals)
		}
		require.NoError(t, rows.Err())
		return out
	}
	inserted, copied := read("inserted"), read("copied")
	require.Len(t, inserted, store.CopyAttemptsMin-1)
	require.Len(t, copied, store.CopyAttemptsMin)
	require.Equal(t, inserted, copied[:len(inserted)], "a copied attempt is the row an inserted one is")
	require.Nil(t, copied[1][4], "no response: no status code")
	require.Nil(t, copied[0][6], "no error class on success")
	require.Nil(t, copied[1][8], "no response body")
	require.Nil(t, copied[1][9], "no target")
	require.Equal(t, "me", copied[0][10])

	var counted int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM postbox.latency_histogram WHERE endpoint = 'copied'`).Scan(&counted))
	require.EqualValues(t, store.CopyAttemptsMin, counted, "the trigger counts copied attempts")
}
