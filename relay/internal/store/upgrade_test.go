package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestUpgradeMergesTheEventIndexesOverRows: a schema at 023 holding an
// event's finished deliveries beside its live one, and another event's
// delivery in flight, upgrades (024, 025) without losing a row; the merged
// index still refuses a second live delivery of an event and takes any
// number of finished ones, and the deliveries in flight from before are
// not marked kept, so an ordered endpoint's head still sees them; an
// attempt row from before 026 is listed once in postbox.all_attempts.
func TestUpgradeMergesTheEventIndexesOverRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE SCHEMA postbox;
		CREATE TABLE postbox.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	for _, m := range store.Migrations() {
		if m.Version > 23 {
			break
		}
		_, err := pool.Exec(ctx, m.SQL)
		require.NoError(t, err, "migration %d", m.Version)
		_, err = pool.Exec(ctx, `INSERT INTO postbox.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		require.NoError(t, err)
	}
	var replayed, inFlight int64
	require.NoError(t, pool.QueryRow(ctx, `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, payload, created_at)
		  VALUES (gen_random_uuid(), 'billing', '{}', now()), (gen_random_uuid(), 'billing', '{}', now())
		  RETURNING id
		), d AS (
		  INSERT INTO postbox.deliveries (event_pk, endpoint, status, lease_owner)
		  SELECT (SELECT min(id) FROM ev), 'billing', s, NULL FROM unnest(ARRAY['replayed', 'delivered', 'pending']) AS s
		  UNION ALL
		  SELECT (SELECT max(id) FROM ev), 'billing', 'in_flight', 'old'
		  RETURNING id, status
		)
		SELECT (SELECT id FROM d WHERE status = 'replayed'), (SELECT id FROM d WHERE status = 'in_flight')`).Scan(&replayed, &inFlight))

	_, err = pool.Exec(ctx, `INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, duration_ms, status_code, outcome)
		SELECT id, endpoint, 1, 3, 200, 'delivered' FROM postbox.deliveries WHERE status = 'delivered'`)
	require.NoError(t, err)

	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	v, err := store.SchemaVersion(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, len(store.Migrations()), v)

	var rows, kept int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE kept) FROM postbox.deliveries`).Scan(&rows, &kept))
	require.Equal(t, 4, rows)
	require.Zero(t, kept, "deliveries from before 025 are not kept")
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM postbox.all_attempts`).Scan(&attempts))
	require.Equal(t, 1, attempts, "an attempt from before 026 is its row, once: its delivery keeps none")

	// A second live delivery of the first event is refused, a finished one
	// is not.
	_, err = pool.Exec(ctx, `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status)
		SELECT event_pk, endpoint, 'failed' FROM postbox.deliveries WHERE id = $1`, replayed)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, "deliveries_event", pgErr.ConstraintName)
	_, err = pool.Exec(ctx, `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status)
		SELECT event_pk, endpoint, 'dead_letter' FROM postbox.deliveries WHERE id = $1`, replayed)
	require.NoError(t, err)

	// The first event's pending delivery is the older; the second's, in
	// flight from before, is still in deliveries_live_order: once the
	// first is delivered, the head is in flight and nothing is claimed.
	s := &store.Store{Pool: pool, Table: table, Slot: "test"}
	_, err = pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'delivered' WHERE status = 'pending'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO postbox.deliveries (event_pk, endpoint, status)
		SELECT id, 'billing', 'pending' FROM postbox.events WHERE NOT EXISTS (
		  SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = events.id AND d.status = 'in_flight')`)
	require.NoError(t, err)
	claimed, err := s.ClaimOrdered(ctx, "me", []string{"billing"})
	require.NoError(t, err)
	require.Empty(t, claimed, "delivery %d, in flight from before the upgrade, heads its endpoint", inFlight)
}
