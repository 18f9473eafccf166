package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestStartsTheChosenVersion: POSTBOX_TEST_PG's major version is the one
// that runs, as the server itself says.
func TestStartsTheChosenVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want, err := pgtest.EnvMajor()
	require.NoError(t, err)
	c, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var num int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num))
	require.Equal(t, c.Major(), num/10000)
	if want != 0 {
		require.Equal(t, want, c.Major())
	}
}

// TestStandbyFollowsAndPromotes: the standby made by the low-level
// backup calls streams what the primary commits, and a promoted one
// takes writes. From 17 it has the primary's failover slot, synchronised.
func TestStandbyFollowsAndPromotes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop() })
	p, err := pgx.Connect(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	defer p.Close(context.Background())
	_, err = p.Exec(ctx, `CREATE TABLE before_backup (n int); INSERT INTO before_backup VALUES (1)`)
	require.NoError(t, err)
	if primary.Major() >= 17 {
		_, err = p.Exec(ctx, `SELECT pg_create_logical_replication_slot('kept', 'pgoutput', false, false, true)`)
		require.NoError(t, err)
	} else {
		_, err = p.Exec(ctx, `SELECT pg_create_logical_replication_slot('kept', 'pgoutput')`)
		require.NoError(t, err)
	}
	standby, err := primary.StartStandby(ctx, "standby1")
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	_, err = p.Exec(ctx, `INSERT INTO before_backup VALUES (2)`)
	require.NoError(t, err)

	s, err := pgx.Connect(ctx, standby.URL("postgres"))
	require.NoError(t, err)
	defer s.Close(context.Background())
	waitFor(t, "the standby to replay the insert", func() bool {
		var n int
		_ = s.QueryRow(ctx, `SELECT count(*) FROM before_backup`).Scan(&n)
		return n == 2
	})
	var slots int
	waitFor(t, "the failover slot on the standby (from 17)", func() bool {
		require.NoError(t, s.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'kept'`).Scan(&slots))
		if primary.Major() < 17 {
			return true
		}
		// A synchronised slot is kept once the primary's has moved past
		// the standby's own positions: make it move.
		_, _ = p.Exec(ctx, `INSERT INTO before_backup VALUES (3)`)
		_, _ = p.Exec(ctx, `SELECT count(*) FROM pg_logical_slot_get_binary_changes('kept', NULL, NULL, 'proto_version', '1', 'publication_names', 'none')`)
		return slots == 1
	})
	if primary.Major() < 17 {
		require.Zero(t, slots, "before 17 a standby has no logical slot")
	}
	require.NoError(t, primary.Kill(pgtest.Immediate))
	require.NoError(t, standby.Promote(ctx))
	_, err = s.Exec(ctx, `INSERT INTO before_backup VALUES (4)`)
	require.NoError(t, err)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
