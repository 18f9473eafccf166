package doctor

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestDoctorGuardsLogicalMessages: with outbox_messages on, the doctor
// fails while PUBLIC (or any role not listed in outbox_message_roles) may
// run pg_logical_emit_message, on every signature the server has, and
// prints a REVOKE and a GRANT per signature; once they are run it is
// clean, and the statements did what they say: a LOGIN-only role can no
// longer emit, the listed one can. With messages off it is fine, and
// names the messages_off dead letters waiting for a replay.
func TestDoctorGuardsLogicalMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close) // after the roles' cleanups
	app, other := pgtest.UniqueName("app"), pgtest.UniqueName("other")
	for _, role := range []string{app, other} {
		_, err = pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
		require.NoError(t, err)
		t.Cleanup(func() {
			// Its grants in this database go first, or the role stays.
			_, err := pool.Exec(context.Background(), `DROP OWNED BY `+role)
			require.NoError(t, err)
			_, err = pool.Exec(context.Background(), `DROP ROLE `+role)
			require.NoError(t, err)
		})
	}
	var signatures int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'pg_logical_emit_message'`).Scan(&signatures))
	require.GreaterOrEqual(t, signatures, 1)
	check := func(cfg *config.Config) Check {
		t.Helper()
		checks, err := Run(ctx, pool, cfg, time.Now)
		require.NoError(t, err)
		for _, c := range checks {
			if c.Name == "outbox_messages" {
				return c
			}
		}
		t.Fatalf("no outbox_messages check: %+v", checks)
		return Check{}
	}
	on, err := config.Parse(fmt.Appendf(nil, "database_url: %s\noutbox_messages: true\noutbox_message_roles: [%s]\n", dbURL, app))
	require.NoError(t, err)

	c := check(on)
	require.Equal(t, Error, c.Severity, c.Detail)
	require.Contains(t, c.Detail, "PUBLIC may run pg_logical_emit_message")
	require.Equal(t, signatures, strings.Count(c.Fix, "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message("), c.Fix)
	require.Equal(t, signatures, strings.Count(c.Fix, " FROM PUBLIC"), c.Fix)
	require.Equal(t, signatures, strings.Count(c.Fix, " TO "+pgx.Identifier{app}.Sanitize()), c.Fix)
	require.True(t, Failed([]Check{c}))

	// Run the fix as printed, then grant a role that is not listed.
	stmts := strings.Split(strings.TrimPrefix(c.Fix, "as a superuser: "), "; ")
	for _, s := range stmts {
		_, err := pool.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	c = check(on)
	require.Equal(t, OK, c.Severity, c.Detail+" "+c.Fix)
	require.Contains(t, c.Detail, app)
	emit := func(role string) error {
		u, err := url.Parse(dbURL)
		require.NoError(t, err)
		u.User = url.User(role)
		conn, err := pgx.Connect(ctx, u.String())
		require.NoError(t, err)
		defer func() { _ = conn.Close(context.Background()) }()
		_, err = conn.Exec(ctx, `SELECT pg_logical_emit_message(true, 'postbox', 'x')`)
		return err
	}
	require.ErrorContains(t, emit(other), "permission denied", "a LOGIN-only role may not emit any more")
	require.NoError(t, emit(app), "the listed role may")

	// One signature, whichever the server has (17 added flush to each).
	var sig string
	require.NoError(t, pool.QueryRow(ctx, `SELECT oid::regprocedure::text FROM pg_proc WHERE proname = 'pg_logical_emit_message' LIMIT 1`).Scan(&sig))
	_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION pg_catalog.`+sig+` TO `+other)
	require.NoError(t, err)
	c = check(on)
	require.Equal(t, Error, c.Severity)
	require.Contains(t, c.Detail, other)
	require.Contains(t, c.Fix, "FROM "+pgx.Identifier{other}.Sanitize())

	// Off: fine, and the dead letters it made are named.
	off, err := config.Parse(fmt.Appendf(nil, "database_url: %s\n", dbURL))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, off.Table))
	c = check(off)
	require.Equal(t, OK, c.Severity, c.Detail)
	require.Contains(t, c.Detail, "off")
	_, err = pool.Exec(ctx, `
		WITH e AS (INSERT INTO postbox.events (event_id, endpoint, payload, created_at, message)
		           VALUES (gen_random_uuid(), 'partner', '{}', now(), true) RETURNING id)
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, last_error)
		SELECT id, 'partner', 'dead_letter', 'messages_off: written with outbox.Emit' FROM e`)
	require.NoError(t, err)
	c = check(off)
	require.Equal(t, Warn, c.Severity, c.Detail)
	require.Contains(t, c.Detail, "1 events written with outbox.Emit are dead letters (messages_off)")
	require.Contains(t, c.Fix, "outbox_messages: true")
}
