// Tests of the instance registry: who counts as alive, and the return of a
// gone instance's claims.

package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestReleaseAbandonedReturnsADeadInstancesClaims(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 4)
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "ghost"}, time.Second, false))
	claimed, err := s.Claim(ctx, "ghost", 2, nil, nil, 2, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	_, err = s.Claim(ctx, "me", 2, nil, nil, 2, nil)
	require.NoError(t, err)
	n, err := s.ReleaseAbandoned(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "the ghost's registration is still current")
	require.Eventually(t, func() bool {
		var expired bool
		err := s.Pool.QueryRow(ctx, `SELECT expires_at <= now() FROM postbox.instances WHERE id = 'ghost'`).Scan(&expired)
		return err == nil && expired
	}, 10*time.Second, 20*time.Millisecond, "the ghost's registration to expire")
	n, err = s.ReleaseAbandoned(ctx, 100)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "only the dead instance's claims return")
}

// An instance registered with its connection is dead when that connection
// ends, whatever its lease says; alive while it lasts.
func TestReleaseAbandonedWhenTheLiveConnectionEnds(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 4)
	c, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	live := c.Hijack()
	require.NoError(t, s.Heartbeat(ctx, live, store.Instance{ID: "mortal"}, time.Hour, true))
	claimed, err := s.Claim(ctx, "mortal", 3, nil, nil, 3, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "mortal"}, time.Hour, false),
		"a heartbeat from the pool keeps the registered connection")
	n, err := s.ReleaseAbandoned(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "its connection lives")

	require.NoError(t, live.Close(ctx)) // as a killed process's would
	require.EqualValues(t, 3, releaseFor(t, s, 10*time.Second, 20*time.Millisecond, func(n int64) bool { return n >= 3 }),
		"its claims return with an hour of lease left")
}

// A lock on an instance's id in another database of the server (another
// deployment's, whose instance has the same id) keeps nothing alive here.
func TestAnotherDatabasesLockKeepsNoInstanceAlive(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 2)
	other, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	require.NoError(t, err)
	defer other.Close(ctx)
	var locked bool
	require.NoError(t, other.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('twin', 0))`).Scan(&locked))
	require.True(t, locked)

	c, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	live := c.Hijack()
	require.NoError(t, s.Heartbeat(ctx, live, store.Instance{ID: "twin"}, time.Hour, true))
	claimed, err := s.Claim(ctx, "twin", 2, nil, nil, 2, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	require.NoError(t, live.Close(ctx))
	require.EqualValues(t, 2, releaseFor(t, s, store.LifeGraceDefault+10*time.Second, 50*time.Millisecond, func(n int64) bool { return n >= 2 }),
		"its claims return a grace after its connection ended, the other database's lock notwithstanding")
}

// releaseFor calls ReleaseAbandoned every tick for d, or until until holds
// for the deliveries released so far, and returns their number. It calls
// in the test's own goroutine: a call of require.Never's or Eventually's
// may outlive their wait and release what the test's next step expects to.
func releaseFor(t *testing.T, s *store.Store, d, tick time.Duration, until func(int64) bool) int64 {
	t.Helper()
	var total int64
	for deadline := time.Now().Add(d); ; time.Sleep(tick) {
		n, err := s.ReleaseAbandoned(context.Background(), 100)
		require.NoError(t, err)
		total += n
		if until(total) || !time.Now().Before(deadline) {
			return total
		}
	}
}

// An instance whose connection for life was cut, and that holds its lock
// again on a new connection while the database refuses its heartbeat's
// write (read-only), stays alive past the grace; once that connection
// ends as well, its claims return.
func TestAnInstanceThatConnectsAgainStaysAlive(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 4)
	hijack := func() *pgx.Conn {
		c, err := s.Pool.Acquire(ctx)
		require.NoError(t, err)
		return c.Hijack()
	}
	first := hijack()
	require.NoError(t, s.Heartbeat(ctx, first, store.Instance{ID: "cut"}, time.Hour, true))
	claimed, err := s.Claim(ctx, "cut", 3, nil, nil, 3, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	pid := first.PgConn().PID()
	require.NoError(t, first.Close(ctx)) // as an operator's pg_terminate_backend would
	// Until the server has ended the backend it holds the lock, and the new
	// connection's try would find it taken. (A running instance tries
	// again at each heartbeat.)
	require.Eventually(t, backendEnded(t, s.Pool, pid), 10*time.Second, 10*time.Millisecond,
		"the first connection's backend ends")

	again := hijack()
	defer again.Close(ctx)
	_, err = again.Exec(ctx, `SET default_transaction_read_only = on`)
	require.NoError(t, err)
	err = s.Heartbeat(ctx, again, store.Instance{ID: "cut"}, time.Hour, true)
	require.Error(t, err, "the registration is refused")
	require.True(t, store.Answered(err), "by the server, on a connection that still works: %v", err)
	require.Zero(t, releaseFor(t, s, store.LifeGraceDefault+time.Second, 50*time.Millisecond, func(n int64) bool { return n > 0 }),
		"its lock says it lives")

	require.NoError(t, again.Close(ctx))
	require.EqualValues(t, 3, releaseFor(t, s, 10*time.Second, 20*time.Millisecond, func(n int64) bool { return n >= 3 }),
		"its claims return once no connection of it is left")
}

// TestPeersAreTheLiveOthers: Peers counts the other instances alive by
// ReleaseAbandoned's measure: not itself, not an expired registration,
// not one whose registered connection has ended.
func TestPeersAreTheLiveOthers(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	peers := func() int {
		n, err := s.Peers(ctx, "me")
		require.NoError(t, err)
		return n
	}
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "me"}, time.Hour, false))
	require.Zero(t, peers(), "alone")
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "expired"}, -time.Second, false))
	require.Zero(t, peers(), "an expired registration is no one")
	c, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	live := c.Hijack()
	require.NoError(t, s.Heartbeat(ctx, live, store.Instance{ID: "mortal"}, time.Hour, true))
	require.Equal(t, 1, peers())
	require.NoError(t, live.Close(ctx)) // as a killed process's would
	require.Eventually(t, func() bool { return peers() == 0 }, 10*time.Second, 20*time.Millisecond,
		"dead with an hour of lease left")
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "no-connection"}, time.Hour, false))
	require.Equal(t, 1, peers(), "one without a registered connection lives by its lease")
}

// TestSessionSettings: the pool plans every execution afresh and never

// TestHeartbeatStatementsKeepTheirPlans: the statements that judge which
// instances are alive run at every heartbeat of every instance, and their
// views of locks and backends cost milliseconds to plan where running
// them takes a tenth of one. They take no parameter, so a pool session
// keeps one plan for each, despite its plan_cache_mode (see
// TestSessionSettings); one with a parameter is planned at every run,
// which the last statement shows.
func TestHeartbeatStatementsKeepTheirPlans(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	c, err := s.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	// plans prepares sql as name, runs it three times with execute's
	// arguments, and counts the plans the session made for it.
	plans := func(name, sql, arguments string) (generic, custom int64) {
		t.Helper()
		_, err := c.Exec(ctx, "PREPARE "+name+" AS "+sql)
		require.NoError(t, err)
		defer c.Exec(ctx, "DEALLOCATE "+name)
		for range 3 {
			_, err := c.Exec(ctx, "EXECUTE "+name+arguments)
			require.NoError(t, err)
		}
		require.NoError(t, c.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1`, name).Scan(&generic, &custom))
		return generic, custom
	}
	for name, sql := range map[string]string{"dead_owners": store.DeadOwnersSQL, "alive_instances": store.AliveInstancesSQL} {
		generic, custom := plans(name, sql, "")
		require.Zero(t, custom, "%s: planned at each run", name)
		require.Positive(t, generic, "%s: one plan kept", name)
	}
	_, custom := plans("with_parameter", `SELECT count(*) FROM postbox.instances WHERE id <> $1`, "('me')")
	require.EqualValues(t, 3, custom, "a statement with a parameter is planned at each run")

	// The plan kept is made at the first run, perhaps on an empty table
	// (see Configure): it must still read the deliveries by index once
	// they are many.
	_, err = c.Exec(ctx, "PREPARE dead_owners AS "+store.DeadOwnersSQL)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "EXECUTE dead_owners")
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `INSERT INTO postbox.deliveries (event_pk, endpoint, status, lease_owner)
		SELECT g, 'ep', 'in_flight', 'owner-' || g % 3 FROM generate_series(1, 50000) AS g`)
	require.NoError(t, err)
	rows, err := c.Query(ctx, "EXPLAIN EXECUTE dead_owners")
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "Index Only Scan using deliveries_lease_owner", plan)
	require.NotContains(t, plan, "Seq Scan on deliveries", plan)
	owners, err := s.DeadOwners(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"owner-0", "owner-1", "owner-2"}, owners, "owners no instance has registered")
}
