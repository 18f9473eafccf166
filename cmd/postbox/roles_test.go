package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// docSQL returns the SQL blocks of docs/operations.md's "Roles and
// grants" by their first line's label (A1, A2, B1, B2): the test runs
// what the docs tell an operator to run, not a copy of it.
func docSQL(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	out := map[string]string{}
	for _, m := range regexp.MustCompile("(?s)```sql\n-- ([AB][12]),[^\n]*\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		out[m[1]] = m[2]
	}
	require.Len(t, out, 4, "docs/operations.md has the blocks A1, A2, B1, B2")
	return out
}

// roles are one test's names for the docs' roles (roles are the
// cluster's, and tests run side by side) and its database.
type roles struct {
	owner, relay, appOwner, app string
	db, dbURL                   string
	super                       *pgxpool.Pool
}

// newRoles makes a database and names for the docs' roles, dropped with
// it when the test ends.
func newRoles(t *testing.T) *roles {
	t.Helper()
	r := &roles{owner: pgtest.UniqueName("pbowner"), relay: pgtest.UniqueName("pbrelay"),
		appOwner: pgtest.UniqueName("shopowner"), app: pgtest.UniqueName("shop")}
	c, err := pgtest.Shared()
	require.NoError(t, err)
	// Registered before the database's, so it runs after the database
	// (and what the roles own and were granted in it) is gone.
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		for _, role := range []string{r.owner, r.relay, r.appOwner, r.app} {
			_, _ = conn.Exec(ctx, `DROP ROLE IF EXISTS `+role)
		}
	})
	r.dbURL = pgtest.NewDatabase(t)
	u, err := url.Parse(r.dbURL)
	require.NoError(t, err)
	r.db = strings.TrimPrefix(u.Path, "/")
	r.super = newPool(t, r.dbURL)
	return r
}

// sql is a block of the docs with this test's names.
func (r *roles) sql(block string) string {
	for _, sub := range []struct{ from, to string }{
		{`\bpostbox_owner\b`, r.owner}, {`\bpostbox_relay\b`, r.relay}, {`\bshop_owner\b`, r.appOwner}, {`\bshop\b`, r.app},
		{`\bDATABASE app\b`, "DATABASE " + pgx.Identifier{r.db}.Sanitize()},
	} {
		block = regexp.MustCompile(sub.from).ReplaceAllLiteralString(block, sub.to)
	}
	return block
}

// as is the database's URL for role.
func (r *roles) as(role string) string {
	u, _ := url.Parse(r.dbURL)
	u.User = url.User(role)
	return u.String()
}

func (r *roles) exec(t *testing.T, role, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.as(role))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err, "as %s: %s", role, sql)
}

// doctorChecks runs postbox doctor --json with args and returns its exit
// code and checks.
func doctorChecks(t *testing.T, args ...string) (int, []map[string]string) {
	t.Helper()
	code, out, errOut := postbox(t, append([]string{"doctor", "--json"}, args...)...)
	require.Empty(t, errOut, "the doctor reports what it finds; it does not fail on it")
	var doc struct {
		Checks []map[string]string `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	return code, doc.Checks
}

// findings are the checks of severity sev, as "name: detail → fix".
func findings(checks []map[string]string, sev string) []string {
	var out []string
	for _, c := range checks {
		if c["severity"] == sev {
			out = append(out, c["check"]+": "+c["detail"]+" → "+c["fix"])
		}
	}
	return out
}

// TestRolesAndGrants: both set-ups of docs/operations.md, "Roles and
// grants", with exactly its statements: the owner migrates, the relay's
// role runs with --no-migrate and delivers what the application's role
// inserts; the doctor finds nothing missing and nothing too much, and
// flags the application's role once it is given more.
func TestRolesAndGrants(t *testing.T) {
	t.Parallel()
	blocks := docSQL(t)
	for _, setup := range []string{"A", "B"} {
		t.Run(setup, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := newRoles(t)
			_, err := r.super.Exec(ctx, r.sql(blocks[setup+"1"]))
			require.NoError(t, err)
			if setup == "B" {
				schema, err := os.ReadFile("../../outbox/schema.sql")
				require.NoError(t, err)
				r.exec(t, r.appOwner, string(schema))
				r.exec(t, r.appOwner, r.sql(blocks["B2"]))
			}
			recv := newCounter(t)
			body := fmt.Sprintf("publication: postbox\nendpoints:\n  partner:\n    url: %s/hook\n", recv.URL)
			ownerCfg := writeConfig(t, r.as(r.owner), body)
			code, out, errOut := postbox(t, "migrate", "--config", ownerCfg)
			require.Equal(t, exitOK, code, out+errOut)
			if setup == "A" {
				r.exec(t, r.owner, r.sql(blocks["A2"]))
			}
			relayCfg := writeConfig(t, r.as(r.relay), body+"migrate: false\n")
			if setup == "A" {
				// Left migrating, the relay's role is told why it cannot.
				migrating := writeConfig(t, r.as(r.relay), body)
				code, checks := doctorChecks(t, "--config", migrating)
				require.Equal(t, exitFailure, code)
				require.Contains(t, strings.Join(findings(checks, "error"), "\n"), "may not change schema postbox: postbox run would fail at start → migrate: false")
				p := startPostbox(t, nil, "run", "--config", migrating)
				require.Equal(t, exitFailure, p.wait(t, time.Minute))
				require.Contains(t, p.out.String(), "this role may not change the schema; run postbox migrate as its owner")
			}

			code, checks := doctorChecks(t, "--config", relayCfg, "--app-role", r.app)
			require.Empty(t, findings(checks, "error"))
			require.Equal(t, exitOK, code)
			for _, c := range checks {
				if c["check"] == "privileges" || c["check"] == "app_role" || c["check"] == "publication" {
					require.Equal(t, "ok", c["severity"], "%v", c)
				}
			}

			p := startPostbox(t, nil, "run", "--config", relayCfg)
			waitStreaming(t, r.super)
			r.exec(t, r.app, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('partner', '{"n": 1}')`)
			waitForT(t, time.Minute, "the application's row delivered", func() bool {
				return queryInt(t, r.super, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 1
			})
			_, total, _ := recv.snapshot()
			require.Equal(t, 1, total)
			waitForT(t, 30*time.Second, "the ingested row deleted", func() bool {
				return queryInt(t, r.super, `SELECT count(*) FROM postbox.outbox`) == 0
			})
			require.NotContains(t, p.out.String(), "PRIVILEGE MISSING")
			require.NotContains(t, p.out.String(), "DATABASE FAULT")

			// More than INSERT: each is a warning with what removes it.
			_, err = r.super.Exec(ctx, `GRANT UPDATE ON postbox.endpoint_health TO `+r.app+`; ALTER ROLE `+r.app+` REPLICATION`)
			require.NoError(t, err)
			code, checks = doctorChecks(t, "--config", relayCfg, "--app-role", r.app)
			require.Equal(t, exitOK, code, "warnings")
			warns := strings.Join(findings(checks, "warn"), "\n")
			require.Contains(t, warns, "has UPDATE on postbox.endpoint_health → REVOKE UPDATE ON TABLE postbox.endpoint_health FROM "+r.app)
			require.Contains(t, warns, "may replicate")
			require.Contains(t, warns, "ALTER ROLE "+r.app+" NOREPLICATION")
			require.NotContains(t, warns, "postbox.outbox", "INSERT on the outbox is what it should have")
			// The relay's own role given as the application's.
			_, checks = doctorChecks(t, "--config", relayCfg, "--app-role", r.relay)
			warns = strings.Join(findings(checks, "warn"), "\n")
			require.Contains(t, warns, "is postbox's own role")
			require.Regexp(t, `has SELECT, (UPDATE, )?DELETE on postbox.outbox → REVOKE`, warns)
			if setup == "B" {
				// The application's migrations role owns the table and
				// the publication: no role for the application to run as.
				_, checks = doctorChecks(t, "--config", relayCfg, "--app-role", r.appOwner)
				warns = strings.Join(findings(checks, "warn"), "\n")
				require.Contains(t, warns, "owns table postbox.outbox: it holds every privilege on it → ALTER TABLE postbox.outbox OWNER TO "+r.owner)
				require.Contains(t, warns, "owns publication postbox")
				require.Contains(t, warns, "may create objects in schema postbox → REVOKE CREATE ON SCHEMA postbox FROM "+r.appOwner)
			}
		})
	}
}

// TestDoctorNamesWhatTheRelayRoleLacks: a relay role with REPLICATION
// and nothing else gets, from the doctor, each grant it lacks and the
// publication it cannot make, as errors with their statements (not
// "permission denied"); run names what it lacks at start, says "lacks"
// (not "lost") when a statement is refused, and resumes once granted.
func TestDoctorNamesWhatTheRelayRoleLacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRoles(t)
	_, err := r.super.Exec(ctx, `CREATE ROLE `+r.relay+` LOGIN REPLICATION`)
	require.NoError(t, err)
	recv := newCounter(t)
	body := fmt.Sprintf("publication: postbox\nendpoints:\n  partner:\n    url: %s/hook\n", recv.URL)
	code, out, errOut := postbox(t, "migrate", "--config", writeConfig(t, r.dbURL, body))
	require.Equal(t, exitOK, code, out+errOut)
	_, err = r.super.Exec(ctx, `DROP PUBLICATION postbox`)
	require.NoError(t, err)
	relayCfg := writeConfig(t, r.as(r.relay), body+"migrate: false\n")

	code, checks := doctorChecks(t, "--config", relayCfg)
	require.Equal(t, exitFailure, code)
	errs := strings.Join(findings(checks, "error"), "\n")
	for _, want := range []string{
		"GRANT USAGE ON SCHEMA postbox TO " + r.relay,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA postbox TO " + r.relay,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA postbox TO " + r.relay,
		"GRANT SELECT, DELETE ON postbox.outbox TO " + r.relay,
		"as postgres (in the application's migrations): CREATE PUBLICATION postbox FOR TABLE postbox.outbox WITH (publish = 'insert')",
	} {
		require.Contains(t, errs, want)
	}

	// Granted all but the outbox's SELECT and DELETE, and no publication:
	// only those are named.
	_, err = r.super.Exec(ctx, `GRANT USAGE ON SCHEMA postbox TO `+r.relay+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA postbox TO `+r.relay+`;
		GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA postbox TO `+r.relay+`;
		REVOKE ALL ON postbox.outbox FROM `+r.relay)
	require.NoError(t, err)
	code, checks = doctorChecks(t, "--config", relayCfg)
	require.Equal(t, exitFailure, code)
	require.Equal(t, []string{
		"privileges: role " + r.relay + " lacks SELECT, DELETE on postbox.outbox, which reconciliation " +
			"(after a lost slot, and at the first start); the outbox purge (and the ingest, with outbox_retention 0) needs → " +
			"as postgres (its owner): GRANT SELECT, DELETE ON postbox.outbox TO " + r.relay,
		"publication: postbox does not exist, and postbox's role may not create it: CREATE PUBLICATION takes the owner of postbox.outbox, which is postgres → " +
			"as postgres (in the application's migrations): CREATE PUBLICATION postbox FOR TABLE postbox.outbox WITH (publish = 'insert')",
	}, findings(checks, "error"))

	// run names each at start, and each refused statement with its fix.
	p := startPostbox(t, nil, "run", "--no-migrate", "--config", relayCfg)
	p.waitLog(t, 30*time.Second, "PRIVILEGE MISSING: the role lacks SELECT, DELETE on postbox.outbox; as postgres (its owner): GRANT SELECT, DELETE ON postbox.outbox TO "+r.relay)
	p.waitLog(t, 30*time.Second, "DATABASE FAULT: permission denied: the role lacks ownership of postbox.outbox (or the publication made by its owner), "+
		"which creating publication postbox needs: as the table's owner: CREATE PUBLICATION postbox FOR TABLE postbox.outbox WITH (publish = 'insert')")
	_, err = r.super.Exec(ctx, `CREATE PUBLICATION postbox FOR TABLE postbox.outbox WITH (publish = 'insert');
		INSERT INTO postbox.outbox (endpoint, payload) VALUES ('partner', '{}')`)
	require.NoError(t, err)
	p.waitLog(t, 3*time.Minute, "role lacks SELECT on postbox.outbox, which reconciliation needs (as the table's owner: GRANT SELECT ON postbox.outbox TO "+r.relay+")")
	require.NotContains(t, p.out.String(), "lost a privilege")
	_, err = r.super.Exec(ctx, `GRANT SELECT, DELETE ON postbox.outbox TO `+r.relay)
	require.NoError(t, err)
	waitForT(t, 2*time.Minute, "the row delivered once granted", func() bool {
		return queryInt(t, r.super, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 1
	})
	_, total, _ := recv.snapshot()
	require.Equal(t, 1, total)
}

// TestRunNoMigrate: with --no-migrate, run changes nothing and exits,
// naming postbox migrate, on a schema that is missing or behind.
func TestRunNoMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	cfg := writeConfig(t, dbURL, "")
	p := startPostbox(t, nil, "run", "--no-migrate", "--config", cfg)
	require.Equal(t, exitFailure, p.wait(t, time.Minute))
	require.Contains(t, p.out.String(), "schema postbox does not exist")
	require.Contains(t, p.out.String(), "run postbox migrate")
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname = 'postbox'`), "nothing created")

	code, out, errOut := postbox(t, "migrate", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	last := queryInt(t, pool, `SELECT max(version) FROM postbox.schema_migrations`)
	_, err := pool.Exec(ctx, `DELETE FROM postbox.schema_migrations WHERE version = $1`, last)
	require.NoError(t, err)
	cfgOff := writeConfig(t, dbURL, "migrate: false\n")
	p = startPostbox(t, nil, "run", "--config", cfgOff)
	require.Equal(t, exitFailure, p.wait(t, time.Minute))
	require.Contains(t, p.out.String(), fmt.Sprintf("schema postbox is at version %d, this postbox needs %d", last-1, last))
	code, checks := doctorChecks(t, "--config", cfgOff)
	require.Equal(t, exitFailure, code)
	require.Contains(t, strings.Join(findings(checks, "error"), "\n"), "this postbox needs")
}

// TestSlotOfAnotherDatabase: a slot of the configured name that belongs
// to another database of the cluster is the doctor's error, and run exits
// with it rather than retrying for ever.
func TestSlotOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first, second := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	slot := pgtest.UniqueName("slot")
	_, err := newPool(t, first).Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	require.NoError(t, err)
	dbName := func(u string) string { p, _ := url.Parse(u); return strings.TrimPrefix(p.Path, "/") }
	cfg := writeConfig(t, second, "slot: "+slot+"\n")
	want := fmt.Sprintf("%s belongs to database %s, not %s", slot, dbName(first), dbName(second))

	code, checks := doctorChecks(t, "--config", cfg)
	require.Equal(t, exitFailure, code)
	require.Contains(t, strings.Join(findings(checks, "error"), "\n"), "slot: "+want)

	p := startPostbox(t, nil, "run", "--config", cfg)
	require.Equal(t, exitFailure, p.wait(t, 2*time.Minute))
	require.Contains(t, p.out.String(), "postbox: replication slot "+want)
}
