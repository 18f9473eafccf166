package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestHealthUpdatesStayOnTheirPage: an update of endpoints' health rows,
// as a storm's failures make them, keeps every new version on its row's
// page (a heap-only tuple: no index entry, no lock of the old version),
// also when every row of a page is updated in one batch. Pruning then
// frees the old versions for the next updates, unless an older snapshot
// holds them (a slot being created on the same server does: one batch is
// tested).
func TestHealthUpdatesStayOnTheirPage(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	// Rows as a first failure writes them.
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, failure_threshold,
		  cooldown_seconds, last_failure_at, last_error)
		SELECT 'storm-' || i, 'closed', 1, 10, 30, now(), 'dial tcp 127.0.0.1:40403: connect: connection refused'
		FROM generate_series(1, 1000) i`)
	require.NoError(t, err)
	// The counts are the backend's since its statistics were last sent.
	counts := func(tx pgx.Tx) (updated, hot int64) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated('postbox.endpoint_health'::regclass),
			pg_stat_get_xact_tuples_hot_updated('postbox.endpoint_health'::regclass)`).Scan(&updated, &hot))
		return updated, hot
	}
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		updated, hot := counts(tx)
		if _, err := tx.Exec(ctx, `UPDATE postbox.endpoint_health SET consecutive_failures = consecutive_failures + 1,
				last_failure_at = now(), last_error = 'dial tcp 127.0.0.1:40403: connect: connection refused'`); err != nil {
			return err
		}
		updatedAfter, hotAfter := counts(tx)
		require.Equal(t, int64(1000), updatedAfter-updated)
		require.Equal(t, int64(1000), hotAfter-hot, "heap-only tuples")
		return nil
	}))
}
