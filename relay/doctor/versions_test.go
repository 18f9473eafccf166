package doctor

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestDoctorNamesTheVersionAndWhatApplies: the doctor reports the
// server's version and what of postbox's version-specific behaviour it
// gives; from 17 it checks that the slot is a failover slot, and names a
// slot made without failover (an upgrade from 16 keeps the old slot) as a
// warning with its fix.
func TestDoctorNamesTheVersionAndWhatApplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	slot := pgtest.UniqueName("slot")
	cfg, err := config.Parse(fmt.Appendf(nil, "database_url: %s\nslot: %s\n", dbURL, slot))
	require.NoError(t, err)
	var major int
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major))
	find := func(name string) Check {
		t.Helper()
		checks, err := Run(ctx, pool, cfg, time.Now)
		require.NoError(t, err)
		for _, c := range checks {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no %s check: %+v", name, checks)
		return Check{}
	}
	v := find("server_version")
	require.Equal(t, OK, v.Severity)
	require.Contains(t, v.Detail, "PostgreSQL "+strconv.Itoa(major)+":")
	fc := find("failover_slot")
	if major < 17 {
		require.Equal(t, OK, fc.Severity)
		require.Contains(t, fc.Detail, "no failover slots")
		return
	}
	require.Equal(t, OK, fc.Severity, fc.Detail)
	// A slot without failover, as one made on 16 and kept by an upgrade.
	_, err = pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, false)`, slot)
	require.NoError(t, err)
	fc = find("failover_slot")
	require.Equal(t, Warn, fc.Severity, fc.Detail)
	require.Contains(t, fc.Fix, "ALTER_REPLICATION_SLOT "+slot+" (FAILOVER true)")
	// The fix, as it says: over a replication connection.
	repl, err := pgconn.Connect(ctx, dbURL+"&replication=database")
	require.NoError(t, err)
	defer repl.Close(ctx)
	_, err = repl.Exec(ctx, "ALTER_REPLICATION_SLOT "+slot+" (FAILOVER true)").ReadAll()
	require.NoError(t, err)
	fc = find("failover_slot")
	require.Equal(t, OK, fc.Severity, fc.Detail)
}
