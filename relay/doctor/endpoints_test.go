package doctor

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestDoctorNamesTheEndpointsPublication: for a role that may not create
// the publication of postbox.endpoints (it neither owns the table nor may
// create in the database), the doctor fails and prints the statement for
// the table's owner; once run, it is fine.
func TestDoctorNamesTheEndpointsPublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pub := pgtest.UniqueName("pub")
	cfg, err := config.Parse(fmt.Appendf(nil, "database_url: %s\npublication: %s\n", dbURL, pub))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, cfg.Table))

	role := pgtest.UniqueName("relay")
	_, err = pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	asRole, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(asRole.Close)
	check := func(q *pgxpool.Pool) Check {
		t.Helper()
		checks, err := Run(ctx, q, cfg, time.Now)
		require.NoError(t, err)
		for _, c := range checks {
			if c.Name == "endpoints_publication" {
				return c
			}
		}
		t.Fatalf("no endpoints_publication check: %+v", checks)
		return Check{}
	}

	c := check(pool)
	require.Equal(t, OK, c.Severity, c.Detail)
	require.Contains(t, c.Detail, "postbox migrate (or run) creates it")

	c = check(asRole)
	require.Equal(t, Error, c.Severity, c.Detail)
	require.Contains(t, c.Fix, "CREATE PUBLICATION "+pub+"_endpoints FOR TABLE postbox.endpoints")
	_, err = pool.Exec(ctx, strings.TrimSuffix(c.Fix[strings.Index(c.Fix, "CREATE PUBLICATION"):], " (or run postbox migrate as that role)"))
	require.NoError(t, err)
	c = check(asRole)
	require.Equal(t, OK, c.Severity, c.Detail)
	require.Contains(t, c.Detail, "publishes postbox.endpoints")
}

// TestAppRoleAcceptsTheEndpointsGrants: the grants docs/integration.md
// gives an application that writes its endpoints (SELECT, INSERT, UPDATE,
// DELETE on postbox.endpoints) are named in the OK, not warned of; a
// grant beyond them on the endpoints or its change log still is.
func TestAppRoleAcceptsTheEndpointsGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg, err := config.Parse(fmt.Appendf(nil, "database_url: %s\n", dbURL))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, cfg.Table))

	app := pgtest.UniqueName("app")
	_, err = pool.Exec(ctx, `CREATE ROLE `+app+`;
		GRANT USAGE ON SCHEMA postbox TO `+app+`;
		GRANT INSERT ON postbox.outbox TO `+app+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON postbox.endpoints TO `+app)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP OWNED BY `+app)
		_, _ = pool.Exec(context.Background(), `DROP ROLE `+app)
	})
	checks, err := AppRole(ctx, pool, cfg, app)
	require.NoError(t, err)
	require.Len(t, checks, 1, "%+v", checks)
	require.Equal(t, OK, checks[0].Severity, "%+v", checks)
	require.Contains(t, checks[0].Detail, "has SELECT, INSERT, UPDATE, DELETE on postbox.endpoints")
	require.Contains(t, checks[0].Detail, "nothing more of postbox's")

	_, err = pool.Exec(ctx, `GRANT TRUNCATE ON postbox.endpoints TO `+app+`; GRANT SELECT ON postbox.endpoint_changes TO `+app)
	require.NoError(t, err)
	checks, err = AppRole(ctx, pool, cfg, app)
	require.NoError(t, err)
	var warns []string
	for _, c := range checks {
		if c.Severity == Warn {
			warns = append(warns, c.Detail+" → "+c.Fix)
		}
	}
	require.ElementsMatch(t, []string{
		"role " + app + " has TRUNCATE on postbox.endpoints → REVOKE TRUNCATE ON TABLE postbox.endpoints FROM " + app,
		"role " + app + " has SELECT on postbox.endpoint_changes → REVOKE SELECT ON TABLE postbox.endpoint_changes FROM " + app,
	}, warns)
}

// TestDoctorWarnsOfConflicts: a name the configuration file and
// postbox.endpoints both define is a warning naming it, with what to do;
// none is an OK.
func TestDoctorWarnsOfConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg, err := config.Parse(fmt.Appendf(nil, "database_url: %s\nendpoints:\n  acme:\n    url: https://acme.example/pb\n  zeta:\n    url: https://zeta.example/pb\n", dbURL))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, cfg.Table))
	check := func() Check {
		t.Helper()
		checks, err := Run(ctx, pool, cfg, time.Now)
		require.NoError(t, err)
		for _, c := range checks {
			if c.Name == "endpoint_conflicts" {
				return c
			}
		}
		t.Fatalf("no endpoint_conflicts check: %+v", checks)
		return Check{}
	}
	_, err = pool.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) VALUES ('rowonly', 'https://row.example/pb')`)
	require.NoError(t, err)
	require.Equal(t, OK, check().Severity)

	_, err = pool.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) VALUES ('zeta', 'https://z.example/'), ('acme', 'https://a.example/')`)
	require.NoError(t, err)
	c := check()
	require.Equal(t, Warn, c.Severity)
	require.Equal(t, "acme, zeta defined both in the configuration file and in postbox.endpoints: the file's settings are used, the row's are not", c.Detail)
	require.Contains(t, c.Fix, "postbox endpoints rm NAME")
}
