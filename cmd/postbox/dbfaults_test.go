package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestDatabaseFaults puts the database through faults under load, one
// after another, with a relay running: for each, postbox keeps running,
// logs one line naming the cause, says not ready on /readyz, shows it in
// `postbox status`, and resumes by itself when the cause goes. Then the
// outbox table is truncated and altered under the stream, which carries
// on. At the end every committed event was delivered.
func TestDatabaseFaults(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("puts a relay through a series of database faults")
	}
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	p, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	addr := adminAddr(t, p)
	db := pool.Config().ConnConfig.Database
	quoted := pgx.Identifier{db}.Sanitize()
	// The test's own session, which the faults do not reach.
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(ctx) })
	exec := func(sql string) {
		t.Helper()
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// A database setting reaches sessions that start after it.
	reconnect := func() {
		exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		pool.Reset()
	}
	var lock pgx.Tx
	faults := []struct {
		name   string
		apply  func()
		remove func()
		logs   string // the fault's line names this cause
		ready  string // /readyz says this
		status string // `postbox status` shows this
	}{{
		name:   "read-only database",
		apply:  func() { exec(`ALTER DATABASE ` + quoted + ` SET default_transaction_read_only = on`); reconnect() },
		remove: func() { exec(`ALTER DATABASE ` + quoted + ` SET default_transaction_read_only = off`); reconnect() },
		logs:   "DATABASE FAULT: the database is read-only",
		ready:  "read-only",
		status: "READ-ONLY",
	}, {
		name: "statement_timeout reached",
		apply: func() {
			exec(`ALTER DATABASE ` + quoted + ` SET statement_timeout = '300ms'`)
			reconnect()
			var err error
			lock, err = admin.Begin(ctx)
			require.NoError(t, err)
			_, err = lock.Exec(ctx, `SET LOCAL statement_timeout = 0`)
			require.NoError(t, err)
			_, err = lock.Exec(ctx, `LOCK TABLE postbox.deliveries IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
		},
		remove: func() {
			require.NoError(t, lock.Rollback(ctx))
			exec(`ALTER DATABASE ` + quoted + ` RESET statement_timeout`)
			reconnect()
		},
		logs:  "DATABASE FAULT: a statement was cancelled: statement_timeout",
		ready: "statement_timeout",
		// Its own queries of the locked table time out as well.
		status: "statement timeout",
	}}

	prod := produce(t, pool, "p", 20*time.Millisecond)
	for _, f := range faults {
		time.Sleep(time.Second)
		before := strings.Count(p.out.String(), f.logs)
		f.apply()
		p.waitLog(t, 30*time.Second, f.logs)
		waitForT(t, 30*time.Second, f.name+": /readyz not ready", func() bool {
			code, body := getReadyz(addr)
			return code == http.StatusServiceUnavailable && strings.Contains(body, f.ready)
		})
		waitForT(t, 30*time.Second, f.name+": postbox status shows it", func() bool {
			_, out, errOut := postbox(t, "status", "--config", cfg)
			return strings.Contains(out+errOut, f.status)
		})
		time.Sleep(2 * time.Second) // the loops back off and retry
		lines := strings.Count(p.out.String(), f.logs) - before
		removed := time.Now()
		f.remove()
		waitForT(t, 60*time.Second, f.name+": ready again", func() bool {
			code, _ := getReadyz(addr)
			return code == http.StatusOK
		})
		t.Logf("%s: logged %q (%d line(s)), ready again %s after it was removed", f.name, f.logs, lines,
			time.Since(removed).Round(100*time.Millisecond))
		require.Equal(t, 1, lines, "one line names the cause")
		select {
		case <-p.exited:
			t.Fatalf("the relay exited during %s", f.name)
		default:
		}
	}
	// The outbox table changed under the stream: emptied by an operator,
	// a column added and dropped again. The stream carries on.
	for _, sql := range []string{`TRUNCATE postbox.outbox`, `ALTER TABLE postbox.outbox ADD COLUMN note text`,
		`ALTER TABLE postbox.outbox DROP COLUMN note`} {
		time.Sleep(time.Second)
		exec(sql)
		code, body := getReadyz(addr)
		require.Equal(t, http.StatusOK, code, "%s: %s", sql, body)
	}
	time.Sleep(time.Second)
	prod.finish()
	res := waitAllDelivered(t, pool, prod.ids(), rc)
	t.Logf("database faults: sent %d (%d inserts failed during them), received %d distinct, %d duplicated",
		res.sent, prod.failed.Load(), res.received, res.duplicated)
	// Each fault ends the relay's sessions twice, as it comes and as it
	// goes (reconnect).
	requireDupsWithin(t, res, 2*len(faults)*defaultLane, "the faults' sessions ended")
	p.waitLog(t, 10*time.Second, "database fault cleared")
}

var adminLine = regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)"[^\n]*admin listener`)

// adminAddr is the address a relay process logged for its admin listener.
func adminAddr(t *testing.T, p *proc) string {
	t.Helper()
	var addr string
	waitForT(t, 30*time.Second, "the admin listener's address", func() bool {
		m := adminLine.FindStringSubmatch(p.out.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

func getReadyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
