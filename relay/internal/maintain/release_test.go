package maintain

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// newStore is a store on a fresh, migrated database.
func newStore(t *testing.T) *store.Store {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	return &store.Store{Pool: pool, Table: table, Slot: "test"}
}

// TestAnInstanceSeenGoneForAGraceLosesItsDeliveries: the sweep returns an
// instance's deliveries to the queue only once it has seen the instance
// gone for store.LifeGraceDefault; one that comes back meanwhile (as after
// a read-only spell whose end cut its connection) keeps them, and is seen
// afresh if it goes again.
func TestAnInstanceSeenGoneForAGraceLosesItsDeliveries(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	pool := s.Pool

	ic, err := s.AcquireIngest(ctx, "ingest")
	require.NoError(t, err)
	_, err = ic.Insert(ctx, []store.NewEvent{
		{OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "ep", Payload: []byte(`{}`)}}, Status: state.Pending},
		{OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "ep", Payload: []byte(`{}`)}}, Status: state.Pending},
	}, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	ic.Release()
	claimed, err := s.Claim(ctx, "ghost", 2, nil, nil, 2, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	register := func(lease time.Duration) {
		t.Helper()
		require.NoError(t, s.Heartbeat(ctx, pool, store.Instance{ID: "ghost"}, lease, false))
	}
	gone := map[string]time.Time{}
	release := func(at time.Time) int64 {
		t.Helper()
		n, err := releaseAbandoned(ctx, s, gone, at, nil)
		require.NoError(t, err)
		return n
	}

	register(time.Millisecond) // expired at once: gone
	time.Sleep(10 * time.Millisecond)
	t0 := time.Now()
	require.Zero(t, release(t0), "first seen gone")
	require.Contains(t, gone, "ghost")
	require.Zero(t, release(t0.Add(store.LifeGraceDefault-time.Millisecond)), "not yet gone for a grace")

	register(time.Minute) // back
	require.Zero(t, release(t0.Add(2*store.LifeGraceDefault)), "alive again")
	require.NotContains(t, gone, "ghost", "forgotten once seen alive")

	register(time.Millisecond) // gone again: seen afresh
	time.Sleep(10 * time.Millisecond)
	t1 := t0.Add(3 * store.LifeGraceDefault)
	require.Zero(t, release(t1))
	require.EqualValues(t, 2, release(t1.Add(store.LifeGraceDefault)), "gone for a grace: its deliveries return")
}

// TestAPurgeGoesOnWhereTheLastStopped: one purge runs up to its number of
// windows, and the next goes on after the last row the first looked at,
// so that an outbox kept for a while and filling faster than one window
// an interval is still kept to its retention.
func TestAPurgeGoesOnWhereTheLastStopped(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	pool := s.Pool

	rows, err := pool.Query(ctx, `INSERT INTO postbox.outbox (endpoint, created_at)
		SELECT 'ep', now() - interval '2 hours' FROM generate_series(1, 12) RETURNING event_id::text`)
	require.NoError(t, err)
	evs := []store.NewEvent{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		evs = append(evs, store.NewEvent{OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: "ep", Payload: []byte(`{}`)}}, Status: state.Pending})
	}
	require.NoError(t, rows.Err())
	ic, err := s.AcquireIngest(ctx, "ingest")
	require.NoError(t, err)
	_, err = ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	ic.Release()
	left := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM postbox.outbox`).Scan(&n))
		return n
	}

	next, err := purgeOutbox(ctx, s, time.Hour, 0, 5, 2)
	require.NoError(t, err)
	require.NotZero(t, next, "two full windows: the next purge goes on from the tenth row")
	require.Equal(t, 2, left())
	next, err = purgeOutbox(ctx, s, time.Hour, next, 5, 2)
	require.NoError(t, err)
	require.Zero(t, next, "the end of the table: the next purge starts over")
	require.Equal(t, 0, left())
}

// TestAPurgeThatDeletesNothingLooksNoFurther: a window of rows not yet
// ingested (a backlog) ends the purge; the next looks at the window after.
func TestAPurgeThatDeletesNothingLooksNoFurther(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	rows, err := s.Pool.Query(ctx, `INSERT INTO postbox.outbox (endpoint) SELECT 'ep' FROM generate_series(1, 12) RETURNING id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)

	next, err := purgeOutbox(ctx, s, 0, 0, 5, 3)
	require.NoError(t, err)
	require.Equal(t, ids[4], next, "one window, then no further")
	next, err = purgeOutbox(ctx, s, 0, next, 5, 3)
	require.NoError(t, err)
	require.Equal(t, ids[9], next)
	next, err = purgeOutbox(ctx, s, 0, next, 5, 3)
	require.NoError(t, err)
	require.Zero(t, next, "the end of the table")
}
