package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// eventsWithoutDeliveries writes n events and no deliveries, as an ingest
// that keeps them would, and returns their ids.
func eventsWithoutDeliveries(t *testing.T, s *store.Store, n int) []int64 {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `
		INSERT INTO postbox.events (event_id, endpoint, payload, created_at)
		SELECT gen_random_uuid(), 'ep', '{}', now() FROM generate_series(1, $1) RETURNING id`, n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// deliveriesOf returns the statuses of each event's deliveries.
func deliveriesOf(t *testing.T, s *store.Store, ids []int64) map[int64][]string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(),
		`SELECT event_pk, status FROM postbox.deliveries WHERE event_pk = ANY($1) ORDER BY id`, ids)
	require.NoError(t, err)
	out := map[int64][]string{}
	for rows.Next() {
		var pk int64
		var status string
		require.NoError(t, rows.Scan(&pk, &status))
		out[pk] = append(out[pk], status)
	}
	require.NoError(t, rows.Err())
	return out
}

// recordDelivered writes the listed events of one range delivered, as
// their owner's recorder would, and returns how many it wrote.
func recordDelivered(ctx context.Context, q store.Copier, owner string, rangeID int64, pks ...int64) (int, error) {
	rs := make([]store.UnderWayResult, len(pks))
	for i, pk := range pks {
		rs[i] = store.UnderWayResult{Result: &state.Result{Range: rangeID, EventPK: pk, Endpoint: "ep",
			Status: postboxtype.DeliveryDelivered, Attempted: true, At: time.Now()}}
	}
	got, err := store.RecordUnderWay(ctx, q, owner, rs)
	return len(got), err
}

// waitForLockWait waits until a backend of the test's database waits for a
// lock: the interleaving the test builds has happened.
func waitForLockWait(t *testing.T, s *store.Store) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := s.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 10*time.Millisecond)
}

// TestUnderWayRangesFenceTheRecorderAgainstTheSweep: an owner recording
// its kept events and a sweep that takes its ranges (the owner was
// declared dead) never both write a delivery for one event, whichever
// comes first, and no event is left without one; a sweep never waits for
// a recording (its owner may be frozen in it).
func TestUnderWayRangesFenceTheRecorderAgainstTheSweep(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()

	t.Run("the recorder first: the sweep skips its range, and after the commit skips what it wrote", func(t *testing.T) {
		ids := eventsWithoutDeliveries(t, s, 3)
		r, err := store.AddUnderWay(ctx, s.Pool, "frozen-a", ids[0], ids[2])
		require.NoError(t, err)
		rec, err := s.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = rec.Rollback(context.Background()) })
		n, err := recordDelivered(ctx, rec, "frozen-a", r, ids[0])
		require.NoError(t, err)
		require.EqualValues(t, 1, n)

		sweep := func() int64 {
			tx, err := s.Pool.Begin(ctx)
			require.NoError(t, err)
			n, err := store.SweepUnderWay(ctx, tx, []string{"frozen-a"}, nil)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			return n
		}
		require.Zero(t, sweep(), "a range a recording holds is left for a later sweep, not waited for")
		require.NoError(t, rec.Commit(ctx))
		require.EqualValues(t, 2, sweep(), "the two events not recorded")
		require.Equal(t, map[int64][]string{ids[0]: {"delivered"}, ids[1]: {"pending"}, ids[2]: {"pending"}}, deliveriesOf(t, s, ids))
	})

	t.Run("the sweep first: the recorder waits, then writes nothing", func(t *testing.T) {
		ids := eventsWithoutDeliveries(t, s, 3)
		r, err := store.AddUnderWay(ctx, s.Pool, "frozen-b", ids[0], ids[2])
		require.NoError(t, err)
		sweep, err := s.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sweep.Rollback(context.Background()) })
		n, err := store.SweepUnderWay(ctx, sweep, []string{"frozen-b"}, nil)
		require.NoError(t, err)
		require.EqualValues(t, 3, n)

		recorded := make(chan int, 1)
		go func() {
			n, err := recordDelivered(ctx, s.Pool, "frozen-b", r, ids[0])
			if err != nil {
				n = -1
			}
			recorded <- n
		}()
		waitForLockWait(t, s)
		require.NoError(t, sweep.Commit(ctx))
		require.EqualValues(t, 0, <-recorded, "the range is gone: fenced")
		require.Equal(t, map[int64][]string{ids[0]: {"pending"}, ids[1]: {"pending"}, ids[2]: {"pending"}}, deliveriesOf(t, s, ids))
	})

	t.Run("a live owner's range is not swept", func(t *testing.T) {
		ids := eventsWithoutDeliveries(t, s, 2)
		r, err := store.AddUnderWay(ctx, s.Pool, "alive", ids[0], ids[1])
		require.NoError(t, err)
		tx, err := s.Pool.Begin(ctx)
		require.NoError(t, err)
		n, err := store.SweepUnderWay(ctx, tx, []string{"someone-else"}, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Zero(t, n)
		written, err := recordDelivered(ctx, s.Pool, "alive", r, ids...)
		require.NoError(t, err)
		require.Equal(t, 2, written)
		require.Equal(t, map[int64][]string{ids[0]: {"delivered"}, ids[1]: {"delivered"}}, deliveriesOf(t, s, ids))
	})
}

// TestRecordUnderWayWritesTheDeliveryOnce: a kept event's delivery is
// written in the state its first attempt left it, with the attempt on a
// delivered row, and only for the owner of its range.
func TestRecordUnderWayWritesTheDeliveryOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ids := eventsWithoutDeliveries(t, s, 4)
	mine, err := store.AddUnderWay(ctx, s.Pool, "me", ids[0], ids[2])
	require.NoError(t, err)
	theirs, err := store.AddUnderWay(ctx, s.Pool, "them", ids[3], ids[3])
	require.NoError(t, err)
	at := time.Now().Truncate(time.Millisecond)
	got, err := store.RecordUnderWay(ctx, s.Pool, "me", []store.UnderWayResult{
		{Inline: true, Result: &state.Result{Range: mine, EventPK: ids[0], Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Attempted: true,
			StatusCode: 200, ResponseMS: 3.5, Response: "ok", At: at, CommitToDeliveryMS: 12, Target: "http://r.test/hook"}},
		{Result: &state.Result{Range: mine, EventPK: ids[1], Lane: "ep|r.test", Endpoint: "ep", Status: postboxtype.DeliveryFailed, Attempted: true,
			StatusCode: 503, ResponseMS: 2, LastError: "http 503", At: at, Delay: 30 * time.Second, CommitToDeliveryMS: -1}},
		{Result: &state.Result{Range: mine, EventPK: ids[2], Endpoint: "ep", Status: state.Released, Delay: 5 * time.Second, CommitToDeliveryMS: -1}},
		{Result: &state.Result{Range: theirs, EventPK: ids[3], Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Attempted: true, At: at}},
	})
	require.NoError(t, err)
	require.Len(t, got, 3, "the range of another owner is fenced")
	require.NotContains(t, got, ids[3])

	type row struct {
		Status, Lane, Err, Response, Target, By string
		Attempts, Code                          int
		DueIn                                   float64
		Delivered                               bool
		C2D                                     int
	}
	read := func(id int64) row {
		var r row
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT status, coalesce(lane, ''), coalesce(last_error, ''), coalesce(last_response, ''),
			       coalesce(attempt_target, ''), coalesce(attempted_by, ''), attempt_count, coalesce(last_status_code, 0),
			       round(extract(epoch FROM next_attempt_at - now())), delivered_at IS NOT NULL,
			       coalesce(commit_to_delivery_ms, 0)
			FROM postbox.deliveries WHERE id = $1`, id).
			Scan(&r.Status, &r.Lane, &r.Err, &r.Response, &r.Target, &r.By, &r.Attempts, &r.Code, &r.DueIn, &r.Delivered, &r.C2D))
		return r
	}
	require.Equal(t, row{Status: "delivered", Response: "ok", Target: "http://r.test/hook", By: "me", Attempts: 1, Code: 200,
		Delivered: true, C2D: 12}, read(got[ids[0]]))
	require.Equal(t, row{Status: "failed", Lane: "ep|r.test", Err: "http 503", Attempts: 1, Code: 503, DueIn: 30}, read(got[ids[1]]))
	require.Equal(t, row{Status: "pending", DueIn: 5}, read(got[ids[2]]))

	again, err := store.RecordUnderWay(ctx, s.Pool, "me", []store.UnderWayResult{
		{Result: &state.Result{Range: mine, EventPK: ids[0], Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Attempted: true, At: at}}})
	require.NoError(t, err)
	require.Empty(t, again, "an event with a delivery gets no second")

	fresh := eventsWithoutDeliveries(t, s, 1)
	r, err := store.AddUnderWay(ctx, s.Pool, "me", fresh[0], fresh[0])
	require.NoError(t, err)
	n, err := recordDelivered(ctx, s.Pool, "me", r, fresh[0], fresh[0])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, map[int64][]string{fresh[0]: {"delivered"}}, deliveriesOf(t, s, fresh), "one delivery, named twice in a batch")
}

// TestACopiedIngestWritesEventsUnderWayAlone: events under way get no
// delivery at ingest, and one range of the instance names them; the
// others of the batch are written as before. Their deliveries are then
// written once (RecordUnderWay), and what is left is swept once the
// instance is dead.
func TestACopiedIngestWritesEventsUnderWayAlone(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	defer ic.Release()
	const n = 40
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "ep", Payload: []byte(`{}`), CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
			Status:    postboxtype.DeliveryInFlight,
			UnderWay:  i%4 != 0,
		}
	}
	got, err := ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	require.Len(t, got, n)
	var under, all []int64
	var rangeID int64
	for _, g := range got {
		all = append(all, g.EventPK)
		if evs[g.Index].UnderWay {
			require.Zero(t, g.DeliveryID)
			require.NotZero(t, g.Range)
			rangeID = g.Range
			under = append(under, g.EventPK)
		} else {
			require.NotZero(t, g.DeliveryID)
			require.Zero(t, g.Range)
		}
	}
	require.Len(t, under, 30)
	require.Len(t, deliveriesOf(t, s, all), 10, "only the events not under way have deliveries")
	var ranges int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.under_way WHERE owner = 'me'`).Scan(&ranges))
	require.Equal(t, 1, ranges)

	done, err := store.RecordUnderWay(ctx, s.Pool, "me", []store.UnderWayResult{
		{Result: &state.Result{Range: rangeID, EventPK: under[0], Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Attempted: true, At: time.Now()}}})
	require.NoError(t, err)
	require.Len(t, done, 1)
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	swept, err := store.SweepUnderWay(ctx, tx, []string{"me"}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 29, swept, "the events under way without a delivery")
	byEvent := deliveriesOf(t, s, all)
	require.Len(t, byEvent, n)
	for _, pk := range all {
		require.Len(t, byEvent[pk], 1, "event %d", pk)
	}
}

// TestUnderWayLoadQueueAndRetire: an owner reads its events under way to
// attempt them, returns some to the queue, and retires a range once each
// of its events has a delivery; an owner whose range was swept reads and
// queues nothing.
func TestUnderWayLoadQueueAndRetire(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ids := eventsWithoutDeliveries(t, s, 3)
	r, err := store.AddUnderWay(ctx, s.Pool, "me", ids[0], ids[2])
	require.NoError(t, err)
	ranges := []int64{r, r, r}

	loaded, err := s.LoadUnderWay(ctx, "me", ids, ranges)
	require.NoError(t, err)
	require.Len(t, loaded, 3)
	for i, c := range loaded {
		require.Zero(t, c.DeliveryID)
		require.Equal(t, ids[i], c.EventPK)
		require.Equal(t, r, c.Range)
		require.Equal(t, "ep", c.Endpoint)
		require.JSONEq(t, `{}`, string(c.Payload))
	}
	other, err := s.LoadUnderWay(ctx, "someone-else", ids, ranges)
	require.NoError(t, err)
	require.Empty(t, other, "not the range's owner")

	n, err := s.QueueUnderWay(ctx, "me", ids[1:], ranges[1:], []string{"", "ep|r.test"})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	loaded, err = s.LoadUnderWay(ctx, "me", ids, ranges)
	require.NoError(t, err)
	require.Len(t, loaded, 1, "the queued ones have deliveries")

	_, err = recordDelivered(ctx, s.Pool, "me", r, ids[0])
	require.NoError(t, err)
	n, err = s.SweepOwnUnderWay(ctx, "me", []int64{r}, nil)
	require.NoError(t, err)
	require.Zero(t, n, "each event has its delivery: the range is only deleted")
	require.Equal(t, map[int64][]string{ids[0]: {"delivered"}, ids[1]: {"pending"}, ids[2]: {"pending"}}, deliveriesOf(t, s, ids))

	n, err = s.QueueUnderWay(ctx, "me", ids[:1], ranges[:1], []string{""})
	require.NoError(t, err)
	require.Zero(t, n, "the range is retired")
}

// TestStaleRangesAreSweptInTheirEventsLanes: an instance's ranges older
// than the age are found, the oldest first; swept, the events without a
// delivery are queued in the lanes the lane function gives them, and the
// range is gone.
func TestStaleRangesAreSweptInTheirEventsLanes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	rows, err := s.Pool.Query(ctx, `
		INSERT INTO postbox.events (event_id, endpoint, url, payload, created_at)
		SELECT gen_random_uuid(), 'ep', CASE WHEN i = 2 THEN 'https://Partner.test/pb' END, '{}', now()
		FROM generate_series(1, 3) AS i RETURNING id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	old, err := store.AddUnderWay(ctx, s.Pool, "me", ids[0], ids[1])
	require.NoError(t, err)
	fresh, err := store.AddUnderWay(ctx, s.Pool, "me", ids[2], ids[2])
	require.NoError(t, err)
	_, err = store.AddUnderWay(ctx, s.Pool, "them", ids[2], ids[2])
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.under_way SET created_at = now() - interval '1 minute' WHERE id <> $1`, fresh)
	require.NoError(t, err)

	stale, err := s.StaleUnderWay(ctx, "me", 30*time.Second, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{old}, stale)

	_, err = recordDelivered(ctx, s.Pool, "me", old, ids[0])
	require.NoError(t, err)
	lane := func(endpoint, rowURL string) string {
		if rowURL == "" {
			return endpoint
		}
		return endpoint + "|partner.test"
	}
	n, err := s.SweepOwnUnderWay(ctx, "me", stale, lane)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var status, gotLane string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT status, coalesce(lane, '') FROM postbox.deliveries WHERE event_pk = $1`, ids[1]).
		Scan(&status, &gotLane))
	require.Equal(t, "pending", status)
	require.Equal(t, "ep|partner.test", gotLane)
	stale, err = s.StaleUnderWay(ctx, "me", 0, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{fresh}, stale, "the swept range is gone, another owner's is not mine")
}

// TestSweepReadsRangesByPrimaryKey: the sweep reads a range's events
// through the primary key and each event's deliveries through its index,
// never every event or delivery, however many there are; the recorder
// reads each event's deliveries through the index.
func TestSweepReadsRangesByPrimaryKey(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, payload, created_at)
		  SELECT gen_random_uuid(), 'ep', '{}', now() FROM generate_series(1, 20000) RETURNING id
		)
		INSERT INTO postbox.deliveries (event_pk, endpoint, status) SELECT id, 'ep', 'delivered' FROM ev;
		ANALYZE postbox.events, postbox.deliveries`)
	require.NoError(t, err)
	explain := func(sql string, args ...any) string {
		rows, err := s.Pool.Query(ctx, "EXPLAIN "+sql, args...)
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(plan, "\n")
	}
	text := explain(store.SweepEventsSQL, []int64{100, 5000}, []int64{400, 5300})
	require.NotContains(t, text, "Seq Scan on events", text)
	require.NotContains(t, text, "Seq Scan on deliveries", text)
	// Each range's deliveries are read in one pass beside its events, not
	// looked up event by event.
	require.Contains(t, text, "Merge Anti Join", text)

	// The recorder's look-up of a batch's events under way, likewise.
	ranges, events := make([]int64, 300), make([]int64, 300)
	for i := range events {
		ranges[i], events[i] = 1, int64(10000+i)
	}
	text = explain(store.PlanUnderWaySQL, "me", ranges, events)
	require.NotContains(t, text, "Seq Scan on deliveries", text)
	require.NotContains(t, text, "Hash Anti Join", text)
}

// TestAnUnderWayAttemptIsCountedOnce: the attempt of an event under way
// whose first attempt failed gets its row, and is counted in the latency
// histograms once, by the recorder in memory: the trigger stands aside for
// its row as for the recorder's others.
func TestAnUnderWayAttemptIsCountedOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ids := eventsWithoutDeliveries(t, s, 2)
	rng, err := store.AddUnderWay(ctx, s.Pool, "me", ids[0], ids[1])
	require.NoError(t, err)
	keep := func(cur store.Health, _ []state.Result) store.Health { return cur }
	hist := store.NewHistograms()
	at := time.Now()
	_, err = s.RecordResults(ctx, "me", []state.Result{
		{Range: rng, EventPK: ids[0], Endpoint: "ep", Status: postboxtype.DeliveryFailed, Attempted: true, Sampled: true, Attempt: 1,
			StatusCode: 503, ResponseMS: 2, LastError: "http 503", At: at, Delay: time.Minute, CommitToDeliveryMS: -1},
		{Range: rng, EventPK: ids[1], Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Attempted: true, Sampled: true, Attempt: 1,
			StatusCode: 200, ResponseMS: 3, At: at, CommitToDeliveryMS: -1},
	}, keep, hist)
	require.NoError(t, err)
	require.NoError(t, s.FlushHistograms(ctx, hist))
	var attempts, counted int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.attempts WHERE endpoint = 'ep'`).Scan(&attempts))
	require.EqualValues(t, 1, attempts, "the failed attempt's row; the delivered one is kept on its delivery")
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM postbox.latency_histogram WHERE endpoint = 'ep'`).Scan(&counted))
	require.EqualValues(t, 2, counted, "each attempt counted once")
}

// TestKeyPlansAreKeptAndProbeByKey: the recorder's look-up of events under
// way and the load of kept events are planned once per session (keyPlans)
// where the session plans every other statement at each run, and the plan
// kept, made perhaps while the tables were empty, reaches every table
// through an index from the statement's arrays, whatever their size later.
func TestKeyPlansAreKeptAndProbeByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupConns(t, 1) // one session: the statements' plans are its
	func() {
		c, err := s.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, store.KeyPlans)
		require.NoError(t, err)
		for name, sql := range map[string]string{"plan_under_way": store.PlanUnderWaySQL, "load_under_way": store.LoadUnderWaySQL} {
			_, err = tx.Exec(ctx, "PREPARE "+name+" AS "+sql)
			require.NoError(t, err)
		}
		explain := func(sql string) string {
			rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) "+sql)
			require.NoError(t, err)
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return strings.Join(plan, "\n")
		}
		for _, sql := range []string{`EXECUTE plan_under_way('me', '{1,1,2}', '{10,11,12}')`, `EXECUTE load_under_way('{10,11,12}', '{1,1,2}', 'me')`} {
			plan := explain(sql) // on empty tables
			for _, scan := range []string{"Seq Scan", "Hash Join", "Hash Semi Join", "Hash Anti Join", "Hash Right", "Merge", "under_way_owner"} {
				require.NotContains(t, plan, scan, plan)
			}
			require.Contains(t, plan, "deliveries_event", plan)
			require.Contains(t, plan, "under_way_pkey", plan)
		}
		require.Contains(t, explain(`EXECUTE load_under_way('{10}', '{1}', 'me')`), "events_pkey")
		require.NoError(t, tx.Rollback(ctx))
		_, err = c.Exec(ctx, "DEALLOCATE plan_under_way; DEALLOCATE load_under_way")
		require.NoError(t, err)
	}()

	// Called as the relay calls them, three times each: planned once.
	ids := eventsWithoutDeliveries(t, s, 6)
	rng, err := store.AddUnderWay(ctx, s.Pool, "me", ids[0], ids[5])
	require.NoError(t, err)
	for i := range 3 {
		loaded, err := s.LoadUnderWay(ctx, "me", []int64{ids[2*i], ids[2*i+1]}, []int64{rng, rng})
		require.NoError(t, err)
		require.Len(t, loaded, 2)
		n, err := recordDelivered(ctx, s.Pool, "me", rng, ids[2*i], ids[2*i+1])
		require.NoError(t, err)
		require.Equal(t, 2, n)
	}
	rows, err := s.Pool.Query(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = ANY($1)`,
		[]string{store.PlanUnderWaySQL, store.LoadUnderWaySQL})
	require.NoError(t, err)
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var c [2]int64
		return c, r.Scan(&c[0], &c[1])
	})
	require.NoError(t, err)
	require.Len(t, counts, 2, "the look-up and the load")
	for _, c := range counts {
		require.EqualValues(t, 3, c[0], "one plan, run three times")
		require.Zero(t, c[1], "planned at each run")
	}
	require.Equal(t, map[int64][]string{ids[0]: {"delivered"}, ids[1]: {"delivered"}, ids[2]: {"delivered"},
		ids[3]: {"delivered"}, ids[4]: {"delivered"}, ids[5]: {"delivered"}}, deliveriesOf(t, s, ids))
}
