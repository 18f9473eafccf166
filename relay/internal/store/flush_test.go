package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
)

// An ingest committed unflushed returns a WAL position past its commit
// record, and FlushWAL makes the WAL flushed at least that far.
func TestCommitUnflushedGivesWhereItIsDurable(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	lsn := func(sql string) pglogrepl.LSN {
		var text string
		require.NoError(t, s.Pool.QueryRow(ctx, sql).Scan(&text))
		l, err := pglogrepl.ParseLSN(text)
		require.NoError(t, err)
		return l
	}
	_, ok, _, err := s.AcquireLeadership(ctx, "me", time.Minute) // the checkpoint row
	require.NoError(t, err)
	require.True(t, ok)
	ic := ingestOne(t, s)
	before := lsn(`SELECT pg_current_wal_insert_lsn()::text`)
	by, err := ic.CommitUnflushed(ctx, 0, false)
	require.NoError(t, err)
	require.Greater(t, by, before, "past the commit's record, which came after the insert")
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events`).Scan(&n))
	require.Equal(t, 1, n, "committed, and visible")

	flushed, err := s.FlushWAL(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, flushed, by)
	require.GreaterOrEqual(t, lsn(`SELECT pg_current_wal_flush_lsn()::text`), by)

	// Without an open transaction nothing is written, and nothing waits.
	by, err = ic.CommitUnflushed(ctx, 0, false)
	require.NoError(t, err)
	require.Zero(t, by)
}
