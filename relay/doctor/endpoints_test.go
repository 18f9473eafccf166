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
