package maintain

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// outboxRows writes n outbox rows created age ago, and ingests them.
func outboxRows(t *testing.T, s *store.Store, n int, age time.Duration) {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `INSERT INTO postbox.outbox (endpoint, created_at)
		SELECT 'ep', now() - $2 * interval '1 second' FROM generate_series(1, $1) RETURNING event_id::text`, n, age.Seconds())
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	evs := make([]store.NewEvent, len(ids))
	for i, id := range ids {
		evs[i] = store.NewEvent{OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: "ep", Payload: []byte(`{}`)}}, Status: postboxtype.DeliveryPending}
	}
	ingest(t, s, evs)
}

// TestAPurgeGoesOnWhereTheLastStopped: one purge runs up to its number of
// windows, and the next goes on after the last row the first looked at,
// so that an outbox kept for a while and filling faster than one window
// an interval is still kept to its retention.
func TestAPurgeGoesOnWhereTheLastStopped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	outboxRows(t, s, 12, 2*time.Hour)
	left := func() int { return count(t, s, `SELECT count(*) FROM postbox.outbox`) }

	next, err := purgeOutbox(ctx, s, time.Hour, 0, 5, 2, store.OutboxHorizon{})
	require.NoError(t, err)
	require.NotZero(t, next, "two full windows: the next purge goes on from the tenth row")
	require.Equal(t, 2, left())
	next, err = purgeOutbox(ctx, s, time.Hour, next, 5, 2, store.OutboxHorizon{})
	require.NoError(t, err)
	require.Zero(t, next, "the end of the table: the next purge starts over")
	require.Equal(t, 0, left())
}

// TestAPurgeThatDeletesNothingLooksNoFurther: a window of rows not yet
// ingested (a backlog) ends the purge; the next looks at the window after.
func TestAPurgeThatDeletesNothingLooksNoFurther(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	rows, err := s.Pool.Query(ctx, `INSERT INTO postbox.outbox (endpoint) SELECT 'ep' FROM generate_series(1, 12) RETURNING id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)

	next, err := purgeOutbox(ctx, s, 0, 0, 5, 3, store.OutboxHorizon{})
	require.NoError(t, err)
	require.Equal(t, ids[4], next, "one window, then no further")
	next, err = purgeOutbox(ctx, s, 0, next, 5, 3, store.OutboxHorizon{})
	require.NoError(t, err)
	require.Equal(t, ids[9], next)
	next, err = purgeOutbox(ctx, s, 0, next, 5, 3, store.OutboxHorizon{})
	require.NoError(t, err)
	require.Zero(t, next, "the end of the table")
}

// The purger, running, keeps the outbox to outbox_retention, a window of
// windows at a time.
func TestOutboxPurgerKeepsTheOutboxToItsRetention(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(c *config.Config) { c.OutboxRetention = time.Hour })
	outboxRows(t, tb.st, 12, 2*time.Hour)
	outboxRows(t, tb.st, 3, 0)
	p := newOutboxPurger(tb.env, new(sync.Mutex))
	require.Equal(t, OutboxPurgeIntervalDefault, p.interval)
	p.interval, p.window, p.windows = tick, 5, 2
	require.NoError(t, p.Start(context.Background()))
	defer p.Stop()
	require.Eventually(t, func() bool { return count(t, tb.st, `SELECT count(*) FROM postbox.outbox`) == 3 }, wait, tick,
		"the rows past the retention are gone, over two purges; the young ones stay")
}
