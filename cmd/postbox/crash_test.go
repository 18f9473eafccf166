package main

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestKilledBetweenIngestAndDelivery kills postbox (SIGKILL) while most of
// a batch is ingested but not yet delivered. A new process delivers every
// event; only attempts in flight at the kill may arrive twice.
func TestKilledBetweenIngestAndDelivery(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	rc.delay = 20 * time.Millisecond
	cfg := writeConfig(t, dbURL, "endpoints:\n  slow:\n    url: "+rc.URL+"\n    max_in_flight: 2\n")

	first := startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	const n = 200
	_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'slow', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "ingest and a few deliveries", func() bool {
		_, total, _ := rc.snapshot()
		return queryInt(t, pool, `SELECT count(*) FROM postbox.events`) == n && total >= 10
	})
	first.kill(t)
	inFlight := inFlightNow(t, pool)
	deliveredBefore, _, _ := rc.snapshot()
	require.Less(t, deliveredBefore, n, "the kill came before the batch was through")

	second := startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 90*time.Second, "every event delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n
	})
	distinct, total, dups := rc.snapshot()
	require.Equal(t, n, distinct, "nothing lost")
	// In flight at the kill: deliveries the table holds in flight, and first
	// attempts started from the stream before their ingest committed, which
	// the table does not show yet: at most 4 × max_in_flight - 1 for the
	// lane (dispatch's aheadLimit).
	const aheadOfIngest = 4*4 - 1
	require.LessOrEqual(t, len(dups), inFlight+aheadOfIngest, "only attempts in flight at the kill repeat")
	require.Equal(t, n, queryInt(t, pool, `SELECT count(*) FROM postbox.events`), "each event ingested once")
	require.Equal(t, n, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries`), "one delivery per event")
	t.Logf("sent %d, received %d distinct in %d requests, %d duplicated (in flight at kill: %d)", n, distinct, total, len(dups), inFlight)

	second.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, second.wait(t, 30*time.Second))
}

// inFlightNow counts the deliveries in flight or kept as retries (whose
// attempts may be under way) and the events under way (in flight in an
// instance's memory, their deliveries not written yet).
func inFlightNow(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return queryInt(t, pool, `SELECT (SELECT count(*) FROM postbox.deliveries WHERE status IN ('in_flight', 'failed') AND lease_owner IS NOT NULL) +
		(SELECT count(*) FROM postbox.events_under_way)`)
}

// keepABacklog starts postbox alone on cfg (endpoint p, a lane of 2), lets
// its lane deliver, then writes a backlog of 20 transactions of 100 events,
// and returns once all are ingested, 100 have arrived and more than
// underWay are under way. It returns the process and the events sent.
func keepABacklog(t *testing.T, pool *pgxpool.Pool, rc *counter, cfg string, underWay int) (*proc, int) {
	t.Helper()
	p := startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('p', '{}')`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "the lane delivering", func() bool { _, total, _ := rc.snapshot(); return total >= 1 })
	const per, txs = 100, 20
	for range txs {
		_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) SELECT 'p', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, per)
		require.NoError(t, err)
	}
	n := per*txs + 1
	waitForT(t, 30*time.Second, "the backlog ingested and under way", func() bool {
		_, total, _ := rc.snapshot()
		return queryInt(t, pool, `SELECT count(*) FROM postbox.events`) == n && total >= 100 &&
			queryInt(t, pool, `SELECT count(*) FROM postbox.events_under_way`) > underWay
	})
	return p, n
}

// TestKilledWhileKeepingABacklog kills postbox (SIGKILL) while it keeps
// most of a backlog in flight by id (a lane that drains, no other
// instance). A new process returns the killed one's deliveries to the
// queue and delivers every event; only attempts that reached the receiver
// unrecorded repeat.
func TestKilledWhileKeepingABacklog(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	rc.delay = 2 * time.Millisecond
	cfg := writeConfig(t, dbURL, "endpoints:\n  p:\n    url: "+rc.URL+"\n    max_in_flight: 2\n")
	first, n := keepABacklog(t, pool, rc, cfg, 0)
	first.kill(t)
	kept := inFlightNow(t, pool)
	pending := queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'pending'`)
	recorded := queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`)
	_, arrived, _ := rc.snapshot()
	require.Less(t, arrived, n, "the kill came before the backlog was through")
	require.Greater(t, kept, pending, "most of what was left was kept in flight, not queued")

	second := startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 90*time.Second, "every event delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n
	})
	distinct, total, dups := rc.snapshot()
	require.Equal(t, n, distinct, "nothing lost")
	require.LessOrEqual(t, len(dups), arrived-recorded, "only attempts that arrived unrecorded repeat")
	require.Equal(t, n, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries`), "one delivery per event")
	t.Logf("sent %d; at the kill %d kept in flight, %d queued, %d arrived, %d recorded; received %d distinct in %d requests, %d duplicated",
		n, kept, pending, arrived, recorded, distinct, total, len(dups))

	second.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, second.wait(t, 30*time.Second))
}

// TestKilledBetweenDeliveryAndRecording kills postbox after the receiver
// has the request but before postbox learns the answer: the event is
// delivered again by the next process (at least once), nothing is lost.
func TestKilledBetweenDeliveryAndRecording(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	var victim *proc
	killed := make(chan struct{})
	rc.onRecv = func(n int) {
		if n == 25 {
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
			<-victim.exited
			close(killed)
		}
	}
	cfg := writeConfig(t, dbURL, "endpoints:\n  p:\n    url: "+rc.URL+"\n    max_in_flight: 4\n")
	victim = startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	const n = 100
	_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'p', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("the receiver never saw 25 requests")
	}
	inFlight := inFlightNow(t, pool)
	rc.mu.Lock()
	rc.onRecv = nil
	rc.mu.Unlock()

	startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 90*time.Second, "every event delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n
	})
	distinct, total, dups := rc.snapshot()
	require.Equal(t, n, distinct, "nothing lost")
	require.GreaterOrEqual(t, len(dups), 1, "the request delivered at the kill was not recorded, so it repeats")
	// In flight at the kill: deliveries the table holds in flight, and first
	// attempts started from the stream before their ingest committed, which
	// the table does not show yet: at most 4 × max_in_flight - 1 for the
	// lane (dispatch's aheadLimit).
	const aheadOfIngest = 4*4 - 1
	require.LessOrEqual(t, len(dups), inFlight+aheadOfIngest, "only attempts in flight at the kill repeat")
	t.Logf("sent %d, received %d distinct in %d requests, %d duplicated (in flight at kill: %d)", n, distinct, total, len(dups), inFlight)
}

// TestRunWithOnlyTheDatabaseURL runs postbox configured by the environment
// alone: rows carry their own URLs.
func TestRunWithOnlyTheDatabaseURL(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	p := startPostbox(t, []string{"POSTBOX_DATABASE_URL=" + dbURL, "POSTBOX_ALLOW_PRIVATE_TARGETS=true", "POSTBOX_CONFIG="}, "run")
	waitStreaming(t, pool)
	_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, url, payload) VALUES ('anyone', $1, '{"x":1}')`, rc.URL+"/hook")
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "delivery", func() bool { d, _, _ := rc.snapshot(); return d == 1 })
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "SIGTERM exits 0")
	require.Contains(t, p.out.String(), "no signing secrets configured")
}

// TestSecondSignalExitsAtOnce: the first SIGTERM waits for the hanging
// attempt (grace 5 s); the second ends the process immediately.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	hang := make(chan struct{})
	rc := newCounter(t)
	rc.onRecv = func(int) { <-hang }
	t.Cleanup(func() { close(hang) })
	p, _ := streamingRelay(t, dbURL, pool, "endpoints:\n  h:\n    url: "+rc.URL+"\n    timeout: 60s\n")
	_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint) VALUES ('h')`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "attempt in flight", func() bool { _, n, _ := rc.snapshot(); return n == 1 })
	p.signal(t, syscall.SIGTERM)
	// The first signal has stopped the stream and waits for the attempt.
	p.waitLog(t, 10*time.Second, "waiting for in-flight attempts")
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "waiting for in-flight attempts") {
			require.Contains(t, line, `"in_flight":1`)
		}
	}
	select {
	case <-p.exited:
		t.Fatal("exited before the grace period with an attempt in flight")
	default:
	}
	start := time.Now()
	p.signal(t, os.Interrupt)
	require.Equal(t, exitInterrupt, p.wait(t, 5*time.Second))
	t.Logf("exited %s after the second signal", time.Since(start).Round(time.Millisecond))
}

func TestConfigErrorExitsTwoNamingTheKey(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "postgres://nowhere/db", "endpoints:\n  p:\n    url: https://x.example\n    timeout: soon\n")
	p := startPostbox(t, nil, "run", "--config", cfg)
	require.Equal(t, exitUsage, p.wait(t, 10*time.Second))
	require.Contains(t, p.out.String(), "endpoints.p.timeout")
}

// TestKilledInstancesClaimsReturnAtOnce kills the instance that holds
// deliveries in flight while another runs beside it. Its lease is a
// minute, but its connection ended with it: the other instance returns
// its claims and delivers them long before the lease could have run out.
func TestKilledInstancesClaimsReturnAtOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	rc.delay = 300 * time.Millisecond // attempts stay in flight a while
	cfg := writeConfig(t, dbURL, "lease: 60s\nendpoints:\n  p:\n    url: "+rc.URL+"\n    max_in_flight: 8\n")
	victim := startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 30*time.Second, "two instances registered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.instances WHERE backend_pid IS NOT NULL`) == 2
	})
	const n = 200
	_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'p', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	victimID := ""
	// What it holds: deliveries in flight, and events under way (their
	// deliveries not written yet).
	heldBy := func(id string) int {
		return queryInt(t, pool, `SELECT (SELECT count(*) FROM postbox.deliveries WHERE status IN ('in_flight', 'failed') AND lease_owner = $1) +
			(SELECT count(*) FROM postbox.events_under_way WHERE owner = $1)`, id)
	}
	waitForT(t, 30*time.Second, "the streaming instance holding claims", func() bool {
		_ = pool.QueryRow(context.Background(), `SELECT id FROM postbox.instances WHERE pid = $1`, victim.cmd.Process.Pid).Scan(&victimID)
		return victimID != "" && heldBy(victimID) > 0
	})
	// Counted just before the kill: just after it, the survivor may have
	// returned them already.
	held := heldBy(victimID)
	victim.kill(t)
	killedAt := time.Now()
	require.Positive(t, held)

	waitForT(t, 30*time.Second, "the killed instance's claims returned (its lease is 60 s)", func() bool {
		return heldBy(victimID) == 0
	})
	returned := time.Since(killedAt)
	waitForT(t, 60*time.Second, "every event delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n
	})
	distinct, total, dups := rc.snapshot()
	require.Equal(t, n, distinct, "nothing lost")
	require.LessOrEqual(t, len(dups), held, "only attempts in flight at the kill repeat")
	t.Logf("%d claims of the killed instance returned %s after the kill; %d delivered in %d requests, %d repeated",
		held, returned.Round(time.Millisecond), distinct, total, len(dups))
}

// TestFrozenOwnerOfEventsUnderWayIsSwept freezes (SIGSTOP) an instance
// alone that keeps a backlog under way: events whose deliveries it would
// write once their attempts end. Its lease runs out; a second instance
// takes the stream over, sweeps the frozen one's ranges (their events get
// pending deliveries; a range it froze in the middle of recording is left
// until it wakes) and delivers them. When the frozen one wakes, its
// recorder's writes for those events are fenced off by the ranges' being
// gone: every event has exactly one delivery, delivered, and nothing is
// lost. Only attempts the frozen one made before it froze unrecorded, or
// makes on waking from what it held, repeat.
func TestFrozenOwnerOfEventsUnderWayIsSwept(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	rc.delay = 2 * time.Millisecond
	cfg := writeConfig(t, dbURL, "leader_lease: 2s\nlease: 4s\nendpoints:\n  p:\n    url: "+rc.URL+"\n    max_in_flight: 2\n")
	first, n := keepABacklog(t, pool, rc, cfg, 200)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGSTOP))
	waitStopped(t, first.cmd.Process.Pid)
	underWay := queryInt(t, pool, `SELECT count(*) FROM postbox.events_under_way`)
	recorded := queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`)
	_, arrived, _ := rc.snapshot()
	require.Less(t, arrived, n, "frozen before the backlog was through")

	second := startPostbox(t, nil, "run", "--config", cfg)
	// Ranges a recording of the frozen instance holds (it may have frozen
	// in one) are left until it wakes; the others are swept now.
	second.waitLog(t, 60*time.Second, "returned deliveries of a stopped instance to the queue")
	sweptWhileFrozen := underWay - queryInt(t, pool, `SELECT count(*) FROM postbox.events_under_way`)
	require.Positive(t, sweptWhileFrozen)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGCONT))
	waitForT(t, 90*time.Second, "every event delivered, every range swept", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n &&
			queryInt(t, pool, `SELECT count(*) FROM postbox.under_way`) == 0
	})
	// The woken instance finishes what it held and records it (fenced);
	// its clean stop releases what is left.
	first.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, first.wait(t, 30*time.Second))
	distinct, total, dups := rc.snapshot()
	require.Equal(t, n, distinct, "nothing lost")
	require.Equal(t, n, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries`), "one delivery per event")
	require.Equal(t, n, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`))
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM postbox.events_under_way`))
	require.Less(t, len(dups), n/4, "only what the frozen instance had arrive unrecorded or held repeats")
	t.Logf("sent %d; at the freeze %d under way, %d arrived, %d recorded; %d swept while frozen; received %d distinct in %d requests, %d duplicated",
		n, underWay, arrived, recorded, sweptWhileFrozen, distinct, total, len(dups))

	second.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, second.wait(t, 30*time.Second))
}
