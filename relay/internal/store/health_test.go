package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// lockHealth begins a transaction that holds endpoint's health row
// locked, as a failing batch of another instance would; it is rolled back
// when the test ends, if not before.
func lockHealth(t *testing.T, s *store.Store, endpoint string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	holder, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, `SELECT 1 FROM postbox.endpoint_health WHERE endpoint = $1 FOR UPDATE`, endpoint)
	require.NoError(t, err)
	return holder
}

// TestQuietHealthTakesNoLock: a batch of successes to a healthy endpoint
// records its deliveries while another transaction holds the endpoint's
// health row locked (it neither locks nor writes the row), and moves
// last_success_at forward only once it is HealthQuietFor behind (with a
// plain update, no read of the row under lock); a failure's write waits
// for the holder's update and, the row's version gone, is recorded again
// under the lock, counting on from the streak the holder committed; the
// success that ends the streak is written once.
func TestQuietHealthTakesNoLock(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	apply := protection(t, s).Apply

	queue(t, s, "ep", 5)
	claimed, err := s.Claim(ctx, "me", 10, nil, nil, 10, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 5)
	result := func(i int, ok bool, at time.Time) state.Result {
		r := state.Result{DeliveryID: claimed[i].DeliveryID, Endpoint: "ep", Attempted: true, Sampled: true, Attempt: 1,
			At: at, CommitToDeliveryMS: -1}
		if ok {
			r.Status, r.Signal, r.StatusCode = postboxtype.DeliveryDelivered, state.SignalSuccess, 200
		} else {
			r.Status, r.Signal, r.StatusCode, r.LastError, r.Delay = postboxtype.DeliveryFailed, state.SignalFailure, 500, "http 500", time.Minute
		}
		return r
	}
	health := func() (xmin string, success time.Time, failures int) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT xmin::text, last_success_at, consecutive_failures
			FROM postbox.endpoint_health WHERE endpoint = 'ep'`).Scan(&xmin, &success, &failures))
		return xmin, success, failures
	}

	// The first success writes the row.
	t0 := time.Now().Truncate(time.Microsecond)
	_, err = s.RecordResults(ctx, "me", []state.Result{result(0, true, t0)}, apply, nil)
	require.NoError(t, err)
	xmin, success, _ := health()
	require.True(t, t0.Equal(success))

	// Another transaction holds the row locked, as a failing batch of
	// another instance would.
	holder := lockHealth(t, s, "ep")

	quiet, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	changes, err := s.RecordResults(quiet, "me", []state.Result{result(1, true, t0.Add(store.HealthQuietFor/2))}, apply, nil)
	require.NoError(t, err, "a quiet batch must not wait for the row's lock")
	require.Len(t, changes, 1)
	require.Equal(t, postboxtype.BreakerClosed, changes[0].New.State)
	var status string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT status FROM postbox.deliveries WHERE id = $1`, claimed[1].DeliveryID).Scan(&status))
	require.Equal(t, "delivered", status)
	now, success, _ := health()
	require.Equal(t, xmin, now, "the row is not written")
	require.True(t, t0.Equal(success))

	// Past HealthQuietFor the latest success is written: a plain update,
	// which waits for the holder like any write of the row.
	require.NoError(t, holder.Rollback(ctx))
	later := t0.Add(2 * store.HealthQuietFor)
	_, err = s.RecordResults(quiet, "me", []state.Result{result(2, true, later)}, apply, nil)
	require.NoError(t, err)
	_, success, _ = health()
	require.True(t, later.Equal(success), "last_success_at moves forward once it is HealthQuietFor behind")

	// A failure changes the streak: its write of the row waits for another
	// instance's update (here, to 5 failures), finds the version it read
	// gone, and records again with the row locked, counting on from it.
	holder, err = s.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `UPDATE postbox.endpoint_health SET consecutive_failures = 5 WHERE endpoint = 'ep'`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.RecordResults(ctx, "me", []state.Result{result(3, false, later.Add(time.Millisecond))}, apply, nil)
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiting int
		err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == 1
	}, 10*time.Second, 10*time.Millisecond, "the failure's batch waits for the row lock")
	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-done)
	_, _, failures := health()
	require.Equal(t, 6, failures, "the other instance's five and this one")

	// A success that ends the streak changes the row: it is written, and
	// resets it.
	_, err = s.RecordResults(ctx, "me", []state.Result{result(4, true, later.Add(2*time.Millisecond))}, apply, nil)
	require.NoError(t, err)
	_, _, failures = health()
	require.Zero(t, failures)
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT status FROM postbox.deliveries WHERE id = $1`, claimed[4].DeliveryID).Scan(&status))
	require.Equal(t, "delivered", status)
	var attempts int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.attempts WHERE delivery_id = $1`, claimed[4].DeliveryID).Scan(&attempts))
	require.Equal(t, 1, attempts, "its attempt is written once")
}

// TestWrittenResultsOnlyRecordHealth: results the ingest wrote with their
// deliveries (Result.Written) write neither a delivery nor an attempt;
// their latency is counted in memory; a quiet endpoint's row is only read
// (even while another transaction holds it locked), and one whose health
// changes (its first row; another instance's streak to reset) is
// recorded under the lock as for any result.
func TestWrittenResultsOnlyRecordHealth(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	apply := protection(t, s).Apply
	hist := store.NewHistograms()
	hist.Every = time.Hour
	t0 := time.Now().Truncate(time.Microsecond)
	written := func(id int64, at time.Time) []state.Result {
		return []state.Result{{DeliveryID: id, Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Signal: state.SignalSuccess, StatusCode: 200,
			Attempted: true, Sampled: true, Attempt: 1, ResponseMS: 1, At: at, CommitToDeliveryMS: 2, Written: true}}
	}
	health := func() (xmin string, failures int) {
		t.Helper()
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT xmin::text, consecutive_failures
			FROM postbox.endpoint_health WHERE endpoint = 'ep'`).Scan(&xmin, &failures))
		return xmin, failures
	}

	_, err := s.RecordResults(ctx, "me", written(1, t0), apply, hist)
	require.NoError(t, err)
	xmin, _ := health()

	holder := lockHealth(t, s, "ep")
	quiet, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = s.RecordResults(quiet, "me", written(2, t0.Add(store.HealthQuietFor/2)), apply, hist)
	require.NoError(t, err, "a quiet batch must not wait for the row's lock")
	now, _ := health()
	require.Equal(t, xmin, now, "the row is not written")
	require.NoError(t, holder.Rollback(ctx))

	_, err = s.Pool.Exec(ctx, `UPDATE postbox.endpoint_health SET consecutive_failures = 2 WHERE endpoint = 'ep'`)
	require.NoError(t, err)
	_, err = s.RecordResults(ctx, "me", written(3, t0.Add(time.Millisecond)), apply, hist)
	require.NoError(t, err)
	_, failures := health()
	require.Zero(t, failures, "the success resets another instance's streak")

	var rows int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM postbox.deliveries) + (SELECT count(*) FROM postbox.attempts)`).Scan(&rows))
	require.Zero(t, rows, "nothing of the deliveries is written again")
	require.NoError(t, s.FlushHistograms(ctx, hist))
	var counted int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM postbox.latency_histogram WHERE endpoint = 'ep'`).Scan(&counted))
	require.EqualValues(t, 3, counted, "each attempt counted once, in memory")
}

// TestWrittenResultsKeepTheRecordersPlans: a batch whose results the
// ingest all wrote updates no delivery, as most batches at live rates do.
// It reads the endpoints' health under the recorder's kept plans
// (recordPlans) all the same: one plan for the session, not one per
// batch.
func TestWrittenResultsKeepTheRecordersPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupConns(t, 1) // one session: every statement of the recorder's runs on it
	keep := func(cur store.Health, _ []state.Result) store.Health { return cur }
	const batches = 3
	for i := range batches {
		_, err := s.RecordResults(ctx, "me", []state.Result{{DeliveryID: int64(i + 1), Endpoint: "ep",
			Status: postboxtype.DeliveryDelivered, Signal: state.SignalSuccess, StatusCode: 200, Attempted: true, Sampled: true,
			Attempt: 1, ResponseMS: 1, At: time.Now(), CommitToDeliveryMS: 2, Written: true}}, keep, nil)
		require.NoError(t, err)
	}
	var generic, custom int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements
		WHERE statement LIKE '%FROM postbox.endpoint_health%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&generic, &custom))
	require.Zero(t, custom, "planned for each batch")
	require.GreaterOrEqual(t, generic, batches, "each batch read the health")
}

// TestFailureWritesHealthWithoutALock: a failure's batch writes its
// endpoint's health row with an update checked against the version it
// read, which takes no lock before it writes: a transaction holding the
// row FOR KEY SHARE (as a foreign key's check would) does not hold it up,
// where a read FOR UPDATE first waited for it. (A write over a version
// another wrote since is recorded again under the lock:
// TestQuietHealthTakesNoLock.)
func TestFailureWritesHealthWithoutALock(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	apply := protection(t, s).Apply
	queue(t, s, "ep", 3)
	claimed, err := s.Claim(ctx, "me", 10, nil, nil, 10, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	failure := func(i int) state.Result {
		return state.Result{DeliveryID: claimed[i].DeliveryID, Endpoint: "ep", Attempted: true, Sampled: true, Attempt: 1,
			At: time.Now(), CommitToDeliveryMS: -1, Status: postboxtype.DeliveryFailed, Signal: state.SignalFailure,
			StatusCode: 500, LastError: "http 500", Delay: time.Minute}
	}
	failures := func() (n int) {
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT consecutive_failures FROM postbox.endpoint_health WHERE endpoint = 'ep'`).Scan(&n))
		return n
	}
	_, err = s.RecordResults(ctx, "me", []state.Result{failure(0)}, apply, nil)
	require.NoError(t, err)
	require.Equal(t, 1, failures(), "the first row")

	holder, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, `SELECT 1 FROM postbox.endpoint_health WHERE endpoint = 'ep' FOR KEY SHARE`)
	require.NoError(t, err)
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = s.RecordResults(quick, "me", []state.Result{failure(1)}, apply, nil)
	require.NoError(t, err, "the write must not wait for a key-share lock")
	require.Equal(t, 2, failures())
	require.NoError(t, holder.Rollback(ctx))
}
