package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	require.Contains(t, store.Cause(err), "unreachable", "a connection refused: %v", err)

	require.False(t, store.Transient(nil))
}

// TestIdleTransactionsAreBounded: postbox's sessions get an
// idle_in_transaction_session_timeout where none is set, and keep one
// the database sets. A session ended by it is a fault to wait out, named
// for what ended it, and the pool goes on with a new connection.
func TestIdleTransactionsAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	show := func(pool *pgxpool.Pool) string {
		var v string
		require.NoError(t, pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&v))
		return v
	}
	pool, err := store.Open(ctx, dbURL, 2)
	require.NoError(t, err)
	require.Equal(t, "1min", show(pool), "bounded where nothing was set")

	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{cfg.Database}.Sanitize()+` SET idle_in_transaction_session_timeout = '300ms'`)
	require.NoError(t, err)
	pool.Close()

	pool, err = store.Open(ctx, dbURL, 1)
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, "300ms", show(pool), "the database's own is kept")

	// The server ends a session idle in a transaction for 300 ms; a
	// second pool watches for it.
	watch, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer watch.Close()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.Eventually(t, backendEnded(t, watch, tx.Conn().PgConn().PID()), 10*time.Second, 20*time.Millisecond)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.True(t, store.Transient(err), "ended for idling in a transaction: %v", err)
	_ = tx.Rollback(ctx)
	require.Equal(t, "300ms", show(pool), "the pool goes on with a new connection")

	// The server's error itself (where the connection reads it before
	// the reset) names the timeout; either way the cause is the database's.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	require.Eventually(t, backendEnded(t, watch, conn.PgConn().PID()), 10*time.Second, 20*time.Millisecond)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.True(t, store.Transient(err), "%v", err)
	require.NotEmpty(t, store.Cause(err))
	t.Logf("after the timeout: %v (cause: %q)", err, store.Cause(err))
}

// TestCauseOfASessionTheServerEnded: a COPY on a session the server has
// ended writes its data before it reads the server's last word, and the
// write's broken pipe can come first and close the connection. Either
// way the cause names the server's side, not an unreachable database
// (TestTransient: a connection refused).
func TestCauseOfASessionTheServerEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(ctx) })
	_, err = admin.Exec(ctx, `CREATE TABLE copied (i int)`)
	require.NoError(t, err)

	outcomes := map[string]int{}
	for range 20 {
		victim, err := pgx.Connect(ctx, dbURL)
		require.NoError(t, err)
		rows := pgx.CopyFromRows([][]any{{int32(1)}})
		// The first COPY describes the table; the second writes at once.
		_, err = victim.CopyFrom(ctx, pgx.Identifier{"copied"}, []string{"i"}, rows)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, victim.PgConn().PID())
		require.NoError(t, err)
		require.Eventually(t, backendEnded(t, admin, victim.PgConn().PID()), 10*time.Second, 5*time.Millisecond)
		_, err = victim.CopyFrom(ctx, pgx.Identifier{"copied"}, []string{"i"}, pgx.CopyFromRows([][]any{{int32(2)}}))
		require.Error(t, err)
		require.True(t, store.Transient(err), "%v", err)
		cause := store.Cause(err)
		require.NotEmpty(t, cause, "%v", err)
		require.NotContains(t, cause, "unreachable", "%v", err)
		outcomes[cause]++
		_ = victim.Close(ctx)
	}
	t.Logf("COPY on an ended session, 20 times: %v", outcomes)

	// The write that wins that race: the second write to a session the
	// server ended (the first drew the server's reset).
	victim, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer func() { _ = victim.Close(ctx) }()
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, victim.PgConn().PID())
	require.NoError(t, err)
	require.Eventually(t, backendEnded(t, admin, victim.PgConn().PID()), 10*time.Second, 5*time.Millisecond)
	var writeErr error
	for range 100 {
		if _, writeErr = victim.PgConn().Conn().Write([]byte{'S', 0, 0, 0, 4}); writeErr != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Error(t, writeErr)
	require.True(t, errors.Is(writeErr, syscall.EPIPE) || errors.Is(writeErr, syscall.ECONNRESET), "%v", writeErr)
	require.Contains(t, store.Cause(fmt.Errorf("write failed: %w", writeErr)), "ended without a word from the server")
}

// TestRollbackSaysWhatEndedTheTransaction: an ingest's open transaction
// whose session the server ended gives the server's word on rolling back.
func TestRollbackSaysWhatEndedTheTransaction(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ic := ingestOne(t, s)
	var pid uint32
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction' AND backend_xid IS NOT NULL`).Scan(&pid))
	_, err := s.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	require.Eventually(t, backendEnded(t, s.Pool, pid), 10*time.Second, 5*time.Millisecond)

	err = ic.Rollback(ctx)
	require.Error(t, err)
	require.NotEmpty(t, store.Cause(err), "%v", err)
	require.False(t, ic.InTx())
	require.NoError(t, ic.Rollback(ctx), "nothing left to roll back")
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events`).Scan(&n))
	require.Zero(t, n)
}
