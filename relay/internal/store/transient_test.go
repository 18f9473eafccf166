package store_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestTransient classifies errors that real failures produce: the ones a
// restart or a read-only spell causes are worth waiting out, mistakes in
// SQL are not.
func TestTransient(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })

	_, err = conn.Exec(ctx, `SELECT FROM no_such_table`)
	require.Error(t, err)
	require.False(t, store.Transient(err), "undefined table: %v", err)

	_, err = conn.Exec(ctx, `SELEKT 1`)
	require.Error(t, err)
	require.False(t, store.Transient(err), "syntax error: %v", err)
	require.Empty(t, store.Cause(err), "a mistake in SQL is not the database's fault")

	_, err = conn.Exec(ctx, `SET default_transaction_read_only = on`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE t (i int)`)
	require.Error(t, err)
	require.True(t, store.Transient(err), "read-only: %v", err)
	require.Contains(t, store.Cause(err), "read-only")

	victim, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = victim.Close(ctx) })
	_, err = conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, victim.PgConn().PID())
	require.NoError(t, err)
	_, err = victim.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.True(t, store.Transient(err), "terminated by an administrator: %v", err)
	_, err = victim.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.True(t, store.Transient(err), "on a closed connection: %v", err)

	// A loopback port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pgx.Connect(cctx, "postgres://postbox@"+addr+"/postbox?sslmode=disable")
	require.Error(t, err)
	require.True(t, store.Transient(err), "unreachable: %v", err)

	require.False(t, store.Transient(nil))
}
