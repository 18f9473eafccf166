package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	osproc "github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// The fault tests break things under load and count events by id: sent
// (committed by the producer) against received by the test receiver.

// producer commits one-row outbox transactions at a steady pace until
// stopped, remembering the ids whose commit it saw succeed.
type producer struct {
	mu        sync.Mutex
	committed []string
	failed    atomic.Int64 // inserts that errored (the database was down, say)
	stop      chan struct{}
	done      chan struct{}
}

func produce(t *testing.T, pool *pgxpool.Pool, endpoint string, every time.Duration) *producer {
	return produceWith(t, pool, endpoint, every, nil)
}

// produceWith is produce with afterCommit run on each committed insert's
// id (its error counts the insert as failed).
func produceWith(t *testing.T, pool *pgxpool.Pool, endpoint string, every time.Duration, afterCommit func(ctx context.Context, id string) error) *producer {
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var id string
			err := pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ($1, jsonb_build_object('i', $2::int)) RETURNING event_id::text`, endpoint, i).Scan(&id)
			if err == nil && afterCommit != nil {
				err = afterCommit(ctx, id)
			}
			cancel()
			if err != nil {
				p.failed.Add(1)
				continue
			}
			p.mu.Lock()
			p.committed = append(p.committed, id)
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.finish)
	return p
}

func (p *producer) finish() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *producer) ids() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.committed...)
}

// tally compares what was sent with what the receiver got.
type tally struct {
	sent, received, duplicated int
	// extra is the deliveries beyond each id's first, counted by
	// webhook-id at the receiver: what a duplicate bound limits.
	extra   int
	missing []string
}

// laneUnrecorded is the most attempts one instance's lane for an endpoint
// with max_in_flight c can have made whose outcome is not yet recorded: c
// in flight, and dispatch.AheadLimit(c) = 3c finished and waiting for
// their event's ingest to commit. A fault that ends an instance, its
// sessions or its ingest can have those sent again, and no others: the
// bound of a fault test's duplicates, per instance and fault.
func laneUnrecorded(maxInFlight int) int { return 4 * maxInFlight }

// requireDupsWithin fails the test when the receiver got more repeated
// deliveries than bound, the attempts in flight at the faults.
func requireDupsWithin(t *testing.T, res tally, bound int, why string) {
	t.Helper()
	t.Logf("duplicates: %d repeated deliveries of %d ids, bound %d (%s)", res.extra, res.duplicated, bound, why)
	require.LessOrEqual(t, res.extra, bound, "duplicates (%d ids delivered more than once) within the attempts in flight at the faults: %s", res.duplicated, why)
}

func count(sent []string, rc *counter) tally {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t := tally{sent: len(sent), received: len(rc.ids)}
	for _, n := range rc.ids {
		if n > 1 {
			t.duplicated++
			t.extra += n - 1
		}
	}
	for _, id := range sent {
		if rc.ids[id] == 0 {
			t.missing = append(t.missing, id)
		}
	}
	return t
}

// waitAllReceived waits until every sent id arrived.
func waitAllReceived(t *testing.T, sent []string, rc *counter, within time.Duration) tally {
	t.Helper()
	var last tally
	waitForT(t, within, "every sent event received", func() bool {
		last = count(sent, rc)
		return len(last.missing) == 0
	})
	return last
}

// waitAllDelivered waits until every sent id arrived, then every event in
// postbox.events (an insert whose commit the producer never saw
// acknowledged, the server going down meanwhile, may have committed too),
// and until the outbox is empty: nothing left un-ingested.
func waitAllDelivered(t *testing.T, pool *pgxpool.Pool, sent []string, rc *counter) tally {
	t.Helper()
	res := waitAllReceived(t, sent, rc, 120*time.Second)
	var inEvents []string
	rows, err := pool.Query(context.Background(), `SELECT event_id::text FROM postbox.events`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		inEvents = append(inEvents, id)
	}
	require.NoError(t, rows.Err())
	waitAllReceived(t, inEvents, rc, 60*time.Second)
	waitForT(t, 60*time.Second, "nothing left un-ingested", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.outbox`) == 0
	})
	return res
}

// slotPID is the pid of the walsender streaming the test database's slot
// (0 when none).
func slotPID(t *testing.T, pool *pgxpool.Pool) int {
	var pid int
	_ = pool.QueryRow(context.Background(), `SELECT coalesce(max(active_pid), 0) FROM pg_replication_slots WHERE database = current_database()`).Scan(&pid)
	return pid
}

// holdIngest holds up the streaming instance's ingest: it holds an
// uncommitted postbox.events row with a new event id, commits an outbox
// row with that id, and waits until an ingest waits for the held row (the
// unique key). It returns the event id, the waiting backend's pid, and
// release, which rolls the held row back (and is called at cleanup too).
func holdIngest(t *testing.T, pool *pgxpool.Pool, endpoint string) (id string, waiting int, release func()) {
	t.Helper()
	ctx := context.Background()
	id = outbox.NewEventID()
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	release = func() { _ = hold.Rollback(ctx) }
	t.Cleanup(release)
	var holder int
	require.NoError(t, hold.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder))
	_, err = hold.Exec(ctx, `INSERT INTO postbox.events (event_id, endpoint, payload, created_at) VALUES ($1, $2, '{}', now())`, id, endpoint)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO postbox.outbox (event_id, endpoint) VALUES ($1, $2)`, id, endpoint)
	require.NoError(t, err)
	// The ingest's insert, or its copy of a batch (store's copyEventsMin),
	// not another backend the holder's transaction holds up (a walsender
	// building a snapshot waits for every running transaction).
	waitForT(t, 30*time.Second, "an ingest to wait for the held row", func() bool {
		return pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)) AND backend_type = 'client backend'
			  AND (query LIKE '%INSERT INTO postbox.events%' OR query ILIKE 'copy "postbox"."events"%')`,
			holder).Scan(&waiting) == nil
	})
	return id, waiting, release
}

// waitStopped waits until every thread of process pid is stopped (by
// SIGSTOP): state T in /proc/PID/task/*/stat.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	waitForT(t, 10*time.Second, "every thread of the frozen process to stop", func() bool {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, task := range tasks {
			stat, err := osproc.StatFields(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil || len(stat) == 0 || stat[0] != "T" {
				return false
			}
		}
		return true
	})
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// takeoverMargin is what a standby needs beyond the leader lease and its
// poll for it (a sixth of the lease) before it streams: ending the old
// walsender, a replication connection and START_REPLICATION, and the
// test's own 25 ms poll of pg_replication_slots, with room for a loaded
// machine and the race detector (on an idle one it is under half a
// second).
const takeoverMargin = 2 * time.Second

// defaultLane is laneUnrecorded for an endpoint with the default
// max_in_flight, as the fault tests' endpoint p has.
var defaultLane = laneUnrecorded(config.MaxInFlightDefault)

// takeoverWithin is the longest a standby may take to stream after the
// leader dies or freezes: the lease the leader last renewed runs out
// within leaderLease, the standby asks every leaderLease/6, and then it
// needs takeoverMargin.
func takeoverWithin(leaderLease time.Duration) time.Duration {
	return leaderLease + leaderLease/6 + takeoverMargin
}

// TestStreamerKilledStandbyTakesOver kills the streaming instance with
// SIGKILL under load; the standby takes over and nothing is lost.
func TestStreamerKilledStandbyTakesOver(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	const leaderLease = 3 * time.Second
	leader, cfg := streamingRelay(t, dbURL, pool, "leader_lease: "+leaderLease.String()+"\nendpoints:\n  p:\n    url: "+rc.URL+"\n")
	standby := startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 30*time.Second, "the standby to register", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.instances WHERE expires_at > now()`) == 2
	})
	oldPID := slotPID(t, pool)

	prod := produce(t, pool, "p", 10*time.Millisecond) // ~100 events a second
	time.Sleep(2 * time.Second)
	killedAt := time.Now()
	leader.kill(t)
	waitForT(t, 30*time.Second, "the standby to stream", func() bool {
		pid := slotPID(t, pool)
		return pid != 0 && pid != oldPID
	})
	takeover := time.Since(killedAt)
	time.Sleep(2 * time.Second)
	prod.finish()
	sent := prod.ids()
	res := waitAllReceived(t, sent, rc, 90*time.Second)
	standby.waitLog(t, 10*time.Second, `"message":"streaming"`)
	t.Logf("streamer killed: sent %d, received %d distinct, %d duplicated; standby streaming %s after the kill",
		res.sent, res.received, res.duplicated, takeover.Round(time.Millisecond))
	requireDupsWithin(t, res, defaultLane, "one instance killed")
	require.Less(t, takeover, takeoverWithin(leaderLease), "the standby takes over within the leader lease and the stated margin, not after wal_sender_timeout")
}

// ownServer starts a PostgreSQL server of the test's own with settings,
// stopped at cleanup, and returns it with a database named after prefix
// and a pool on it.
func ownServer(t *testing.T, settings map[string]string, prefix string) (*pgtest.Cluster, string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Options{Settings: settings})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	dbURL, err := cluster.CreateDatabase(ctx, prefix)
	require.NoError(t, err)
	return cluster, dbURL, newPool(t, dbURL)
}

// TestPostgresRestart restarts PostgreSQL mid-stream, fast and then
// immediate (a crash), with two instances running: both reconnect with
// backoff and nothing committed is lost.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, dbURL, pool := ownServer(t, nil, "restart")
	rc := newCounter(t)
	a, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	b := startPostbox(t, nil, "run", "--config", cfg)
	prod := produce(t, pool, "p", 10*time.Millisecond)
	for _, mode := range []pgtest.RestartMode{pgtest.Fast, pgtest.Immediate} {
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, cluster.Kill(mode))
		time.Sleep(time.Second) // down for a second: inserts fail, the relays retry
		require.NoError(t, cluster.StartAgain(ctx))
		waitStreaming(t, pool)
	}
	time.Sleep(time.Second)
	prod.finish()
	res := waitAllDelivered(t, pool, prod.ids(), rc)
	t.Logf("PostgreSQL restarted fast and immediate: sent %d (%d inserts failed while it was down), received %d distinct, %d duplicated",
		res.sent, prod.failed.Load(), res.received, res.duplicated)
	requireDupsWithin(t, res, 2*2*defaultLane, "two restarts, each ending both instances' sessions")
	for _, p := range []*proc{a, b} {
		select {
		case <-p.exited:
			t.Fatalf("an instance exited: %s", p.out.String())
		default:
		}
	}
	require.Contains(t, a.out.String()+b.out.String(), "replication session ended")
}

// TestSlotDroppedByAnOperator drops the slot under a running relay: it
// recreates the slot, says so loudly, and reconciles what was written
// while there was none.
func TestSlotDroppedByAnOperator(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	p, _ := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	prod := produce(t, pool, "p", 10*time.Millisecond)
	time.Sleep(time.Second)
	ctx := context.Background()
	waitForT(t, 30*time.Second, "the slot to be dropped", func() bool {
		_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active`)
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		return err == nil && queryInt(t, pool, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`) == 0
	})
	time.Sleep(1500 * time.Millisecond)
	prod.finish()
	res := waitAllReceived(t, prod.ids(), rc, 90*time.Second)
	p.waitLog(t, 10*time.Second, "REPLICATION SLOT LOST")
	t.Logf("slot dropped: sent %d, received %d distinct, %d duplicated", res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, defaultLane, "one instance's stream ended")
}

// TestSlotInvalidated lets the slot exceed max_slot_wal_keep_size while
// postbox is stopped: on start it recreates the slot and reconciles from
// the outbox table; nothing is lost.
func TestSlotInvalidated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL, pool := ownServer(t, map[string]string{"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"}, "invalidated")
	rc := newCounter(t)
	first, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	var sent []string
	insert := func(n int) {
		for range n {
			var id string
			require.NoError(t, pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('p') RETURNING event_id::text`).Scan(&id))
			sent = append(sent, id)
		}
	}
	insert(20)
	waitAllReceived(t, sent, rc, 30*time.Second)
	first.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, first.wait(t, 30*time.Second))

	insert(30) // waiting in the outbox; their WAL is about to go
	waitForT(t, 60*time.Second, "the slot to be invalidated", func() bool {
		_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS filler (v text); INSERT INTO filler SELECT repeat(md5(i::text), 8) FROM generate_series(1, 20000) i; CHECKPOINT`)
		require.NoError(t, err)
		var status string
		_ = pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE database = current_database()`).Scan(&status)
		return status == "lost"
	})
	second := startPostbox(t, nil, "run", "--config", cfg)
	res := waitAllReceived(t, sent, rc, 90*time.Second)
	second.waitLog(t, 10*time.Second, "REPLICATION SLOT INVALIDATED")
	second.waitLog(t, 10*time.Second, "reconciled outbox rows the stream had not delivered")
	t.Logf("slot invalidated: sent %d, received %d distinct, %d duplicated", res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, 0, "the first instance stopped cleanly, its attempts recorded, before the slot was lost")
}

// freezer is a TCP proxy to PostgreSQL that can freeze the replication
// connections it carries: keep them open, stop forwarding, like a proxy
// or NAT box that lost its state.
type freezer struct {
	ln      net.Listener
	mu      sync.Mutex
	target  string
	repl    []chan struct{} // closed to freeze a replication connection
	handled atomic.Int64
	done    chan struct{} // closed at the test's end: frozen connections let go
	conns   sync.WaitGroup
}

// newFreezer proxies the server of dbURL; it returns the proxy and the URL
// that connects through it.
func newFreezer(t *testing.T, dbURL string) (*freezer, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	f := &freezer{ln: ln, target: u.Host, done: make(chan struct{})}
	f.conns.Go(f.serve)
	t.Cleanup(func() {
		ln.Close()
		close(f.done)
		f.conns.Wait()
	})
	u.Host = ln.Addr().String()
	return f, u.String()
}

func (f *freezer) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.conns.Go(func() { f.handle(c) })
	}
}

func (f *freezer) handle(client net.Conn) {
	defer client.Close()
	f.mu.Lock()
	target := f.target
	f.mu.Unlock()
	server, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer server.Close()
	f.handled.Add(1)
	// The startup packet says whether this is a replication connection.
	var hdr [4]byte
	if _, err := io.ReadFull(client, hdr[:]); err != nil {
		return
	}
	n := int(hdr[0])<<24 | int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3])
	if n < 4 || n > 1<<16 {
		return
	}
	startup := make([]byte, n-4)
	if _, err := io.ReadFull(client, startup); err != nil {
		return
	}
	freeze := make(chan struct{})
	if strings.Contains(string(startup), "replication\x00database") {
		f.mu.Lock()
		f.repl = append(f.repl, freeze)
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			for i, c := range f.repl {
				if c == freeze {
					f.repl = append(f.repl[:i], f.repl[i+1:]...)
					break
				}
			}
			f.mu.Unlock()
		}()
	}
	if _, err := server.Write(append(hdr[:], startup...)); err != nil {
		return
	}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-freeze:
				<-f.done // hold the connection open, forward nothing, until the test ends
				return
			default:
			}
			if err != nil {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	// Either side closing closes both, as a proxy does: a server whose
	// client went away must see its connection end.
	var back sync.WaitGroup
	back.Go(func() {
		pipe(server, client)
		server.Close()
		client.Close()
	})
	pipe(client, server)
	server.Close()
	client.Close()
	back.Wait()
}

// retarget sends new connections to addr, as a virtual IP or DNS name
// moves to a new primary in a failover.
func (f *freezer) retarget(addr string) {
	f.mu.Lock()
	f.target = addr
	f.mu.Unlock()
}

// freezeReplication freezes every replication connection open now.
func (f *freezer) freezeReplication() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.repl)
	for _, c := range f.repl {
		close(c)
	}
	f.repl = nil
	return n
}

// TestStalledReplicationConnection freezes the replication connection
// without closing it: the relay's read deadline and keepalive timing notice,
// it reconnects (taking its slot back from the orphaned walsender), and
// delivers what was committed meanwhile.
func TestStalledReplicationConnection(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	fz, proxied := newFreezer(t, dbURL)
	p, _ := streamingRelay(t, proxied, pool, "status_interval: 500ms\nstall_timeout: 2s\nendpoints:\n  p:\n    url: "+rc.URL+"\n")
	prod := produce(t, pool, "p", 20*time.Millisecond)
	time.Sleep(time.Second)
	require.Equal(t, 1, fz.freezeReplication(), "the one replication connection open")
	frozenAt := time.Now()
	waitForT(t, 30*time.Second, "the relay to notice the stall", func() bool {
		return strings.Contains(p.out.String(), "replication connection stalled")
	})
	noticed := time.Since(frozenAt)
	time.Sleep(2 * time.Second)
	prod.finish()
	res := waitAllReceived(t, prod.ids(), rc, 90*time.Second)
	t.Logf("replication connection frozen: noticed after %s; sent %d, received %d distinct, %d duplicated",
		noticed.Round(time.Millisecond), res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, defaultLane, "one instance's stream stalled and restarted")
}

// bulkRelay starts a relay process built without the race detector (its
// RSS is the point) with one endpoint, bulk, whose deliveries rc counts;
// extra is more of bulk's settings.
func bulkRelay(t *testing.T, extra string) (*pgxpool.Pool, *counter, *proc) {
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	cfg := writeConfig(t, dbURL, "log_level: info\nendpoints:\n  bulk:\n    url: "+rc.URL+"\n"+extra)
	p := startBuilt(t, "run", "--config", cfg)
	waitStreaming(t, pool)
	return pool, rc, p
}

// TestHugeTransactionRSS commits 200,000 outbox rows in one transaction
// and measures the relay process's peak resident memory.
func TestHugeTransactionRSS(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("200,000 deliveries")
	}
	pool, rc, p := bulkRelay(t, "    max_in_flight: 32\n")
	const n = 200000
	_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'bulk', jsonb_build_object('i', i, 'click_id', md5(i::text), 'pad', repeat('x', 200)) FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	waitForT(t, 10*time.Minute, "200,000 deliveries", func() bool {
		d, _, _ := rc.snapshot()
		return d == n
	})
	rss := peakRSS(p.cmd.Process.Pid)
	distinct, total, _ := rc.snapshot()
	t.Logf("one transaction of %d rows: received %d distinct in %d requests; relay peak RSS %.0f MB", n, distinct, total, rss)
	require.Less(t, rss, 150.0, "bounded memory")
}

// TestOutboxAlteredWhileStreaming adds a column to the outbox between
// inserts: the relation message refreshes the column map, nothing is lost.
func TestOutboxAlteredWhileStreaming(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	prod := produce(t, pool, "p", 10*time.Millisecond)
	time.Sleep(time.Second)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `ALTER TABLE postbox.outbox ADD COLUMN tenant text DEFAULT 'acme'`)
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)
	_, err = pool.Exec(ctx, `ALTER TABLE postbox.outbox ADD COLUMN region text, ALTER COLUMN event_type SET DEFAULT 'altered'`)
	require.NoError(t, err)
	time.Sleep(time.Second)
	prod.finish()
	res := waitAllReceived(t, prod.ids(), rc, 60*time.Second)
	waitForT(t, 30*time.Second, "every result recorded", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status <> 'delivered'`) == 0
	})
	t.Logf("outbox altered while streaming: sent %d, received %d distinct, %d duplicated", res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, 0, "a relation message is no fault: no attempt is lost track of")
}

// TestSIGTERMDuringABurst stops postbox while a burst is being delivered:
// attempts in flight finish, the rest return to the queue, it exits 0, and
// the next instance delivers the rest without repeating any.
func TestSIGTERMDuringABurst(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	rc.delay = 20 * time.Millisecond
	first, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n    max_in_flight: 4\n")
	ctx := context.Background()
	var sent []string
	rows, err := pool.Query(ctx, `INSERT INTO postbox.outbox (endpoint) SELECT 'p' FROM generate_series(1, 300) RETURNING event_id::text`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		sent = append(sent, id)
	}
	require.NoError(t, rows.Err())
	waitForT(t, 30*time.Second, "the burst under way", func() bool { _, n, _ := rc.snapshot(); return n >= 40 })
	first.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, first.wait(t, 30*time.Second), "SIGTERM exits 0")
	delivered := queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`)
	require.Zero(t, inFlightNow(t, pool), "nothing left claimed or under way")
	_, before, _ := rc.snapshot()
	require.Equal(t, before, delivered, "every attempt that reached the receiver was recorded")

	startPostbox(t, nil, "run", "--config", cfg)
	res := waitAllReceived(t, sent, rc, 90*time.Second)
	require.Zero(t, res.duplicated, "no duplicates: the in-flight attempts finished and were recorded before exit")
	t.Logf("SIGTERM during a burst: %d delivered before the stop, sent %d, received %d distinct, %d duplicated", before, res.sent, res.received, res.duplicated)
}

// TestServerChangeIsNotTrusted: a checkpoint from another server (a
// restored or rebuilt database) is not trusted; the relay reconciles.
func TestServerChangeIsNotTrusted(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	first, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('p')`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "a delivery", func() bool { d, _, _ := rc.snapshot(); return d == 1 })
	first.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, first.wait(t, 30*time.Second))
	_, err = pool.Exec(ctx, `UPDATE postbox.checkpoints SET system_id = '1234567890'`)
	require.NoError(t, err)
	second := startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	_, err = pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('p')`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "the second delivery", func() bool { d, _, _ := rc.snapshot(); return d == 2 })
	second.waitLog(t, 10*time.Second, "the database server changed")
}

// TestFailoverReconcilesWithoutTheSlot runs the relays and the application
// against a primary with a synchronous physical standby, through an address
// that moves (a proxy standing in for a virtual IP). Under load the
// primary crashes, the standby is promoted (a new timeline, and no
// replication slot: slots are not replicated before PostgreSQL 17) and the
// address moves to it. The relays reconnect, recreate the slot, distrust
// the old checkpoint, reconcile from the outbox table, and deliver every
// event whose commit the application saw. From 17 the slot comes along:
// TestFailoverKeepsTheSyncedSlot.
func TestFailoverReconcilesWithoutTheSlot(t *testing.T) {
	t.Parallel()
	if major := serverMajor(t); major >= 17 {
		t.Skipf("PostgreSQL %d synchronises the failover slot to the standby: TestFailoverKeepsTheSyncedSlot", major)
	}
	primary, standby := primaryWithStandby(t)
	logs, res := failOver(t, primary, standby)
	require.Contains(t, logs, "REPLICATION SLOT LOST")
	require.Contains(t, logs, "not trusting the checkpoint; reconciling the outbox table")
	requireDupsWithin(t, res, 2*defaultLane, "one crash ending both instances' sessions")
}

// TestFailoverKeepsTheSyncedSlot is the failover above on PostgreSQL 17
// and newer, where postbox creates its slot with failover, the standby
// synchronises it (sync_replication_slots) and the primary sends nothing
// the standby lacks (synchronized_standby_slots). The relays carry on
// from the promoted standby's copy of the slot at their checkpoint: no
// slot recreated, no checkpoint distrusted, nothing reconciled from the
// table, nothing lost, and nothing repeated beyond the deliveries in
// flight at the crash.
func TestFailoverKeepsTheSyncedSlot(t *testing.T) {
	t.Parallel()
	if major := serverMajor(t); major < 17 {
		t.Skipf("PostgreSQL %d has no failover slots: TestFailoverReconcilesWithoutTheSlot", major)
	}
	primary, standby := primaryWithStandby(t)
	logs, res := failOver(t, primary, standby)
	require.Contains(t, logs, "the replication slot came along")
	require.NotContains(t, logs, "REPLICATION SLOT LOST")
	require.NotContains(t, logs, "not trusting the checkpoint")
	require.NotContains(t, logs, "reconciled outbox rows the stream had not delivered")
	requireDupsWithin(t, res, 2*defaultLane, "one crash ending both instances' sessions")
}

// serverMajor is the major version the test's servers run.
func serverMajor(t *testing.T) int {
	t.Helper()
	major, err := pgtest.ServerMajor()
	require.NoError(t, err)
	return major
}

// primaryWithStandby starts a primary of POSTBOX_TEST_PG's version and a
// synchronous standby: a commit the application saw is on the standby,
// so a failover loses no committed row.
func primaryWithStandby(t *testing.T) (primary, standby *pgtest.Cluster) {
	t.Helper()
	ctx := context.Background()
	primary, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = primary.Stop() })
	standby, err = primary.StartStandby(ctx, "standby1")
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	admin, err := pgx.Connect(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'standby1'`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "the standby to be synchronous", func() bool {
		var n int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby1' AND sync_state = 'sync'`).Scan(&n)
		return n == 1
	})
	return primary, standby
}

// failOver runs two relays and a producer against primary, crashes it
// under load, promotes standby and moves the address to it, and waits for
// every event the application saw committed. It returns the relays' logs.
func failOver(t *testing.T, primary, standby *pgtest.Cluster) (string, tally) {
	t.Helper()
	ctx := context.Background()
	dbURL, err := primary.CreateDatabase(ctx, "failover")
	require.NoError(t, err)
	vip, proxied := newFreezer(t, dbURL)
	pool := newPool(t, proxied)
	rc := newCounter(t)
	a, cfg := streamingRelay(t, proxied, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	b := startPostbox(t, nil, "run", "--config", cfg)
	prod := produce(t, pool, "p", 10*time.Millisecond)
	time.Sleep(2 * time.Second)
	if primary.Major() >= 17 {
		var failover bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_type = 'logical'`).Scan(&failover))
		require.True(t, failover, "postbox made its slot a failover slot")
		// The slot is synchronised some time after it is made: a crash
		// before would leave the standby without it, as before 17.
		sb, err := pgx.Connect(ctx, standby.URL("postgres"))
		require.NoError(t, err)
		waitForT(t, 60*time.Second, "the slot synchronised to the standby", func() bool {
			var n int
			_ = sb.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical' AND synced AND NOT temporary`).Scan(&n)
			return n == 1
		})
		sb.Close(ctx)
	}

	require.NoError(t, primary.Kill(pgtest.Immediate))
	crashed := time.Now()
	require.NoError(t, standby.Promote(ctx))
	sb, err := url.Parse(standby.URL("postgres"))
	require.NoError(t, err)
	vip.retarget(sb.Host)
	waitStreaming(t, pool)
	recovered := time.Since(crashed)
	time.Sleep(2 * time.Second)
	prod.finish()
	res := waitAllDelivered(t, pool, prod.ids(), rc)
	t.Logf("failover to a promoted standby (PostgreSQL %d): streaming again %s after the crash; sent %d (%d inserts failed meanwhile), received %d distinct, %d duplicated",
		primary.Major(), recovered.Round(time.Millisecond), res.sent, prod.failed.Load(), res.received, res.duplicated)
	return a.out.String() + b.out.String(), res
}

// TestFrozenLeaderIsFencedOff freezes the streaming instance (SIGSTOP) in
// the middle of an ingest transaction: its lease runs out, the standby
// takes the slot over and brings the same event again, and when the
// old leader wakes and commits, its checkpoint write is refused under its
// stale fencing token and its whole transaction rolls back. Nothing is
// lost.
//
// To freeze the leader between its insert and its checkpoint write, the
// test holds an uncommitted postbox.events row with the event id of one
// outbox row: the leader's insert of that event waits for it. The test
// freezes the leader, then rolls its row back, so the leader's insert
// completes on the server and its transaction stays open, waiting for a
// COMMIT that the frozen process has not sent yet.
//
// The refused write is asserted in the database: the event's row was not
// written by the old leader's transaction (its xmin is another
// transaction's), and the checkpoint's fencing token is the new leader's.
// Without fencing the old leader's commit would succeed and its
// transaction would be the row's xmin. The old leader's log names the
// refused commit (ErrFenced from IngestConn.Commit), not only the lost
// lease.
func TestFrozenLeaderIsFencedOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	const leaderLease = 2 * time.Second
	leader, cfg := streamingRelay(t, dbURL, pool, "leader_lease: "+leaderLease.String()+"\nlease: 4s\nendpoints:\n  p:\n    url: "+rc.URL+"\n")
	startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 30*time.Second, "the standby to register", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.instances WHERE expires_at > now()`) == 2
	})
	require.Equal(t, leader.cmd.Process.Pid, queryInt(t, pool, `
		SELECT i.pid FROM postbox.checkpoints c JOIN postbox.instances i ON i.id = c.leader`), "the first instance leads")
	oldPID := slotPID(t, pool)
	prod := produce(t, pool, "p", 10*time.Millisecond)
	waitForT(t, 30*time.Second, "deliveries under load", func() bool { d, _, _ := rc.snapshot(); return d >= 50 })

	// Hold the leader's ingest of event x.
	x, ingestPID, release := holdIngest(t, pool, "p")
	require.NoError(t, leader.cmd.Process.Signal(syscall.SIGSTOP))
	frozenAt := time.Now()
	// A stop takes effect on each thread on its own, and on a loaded
	// machine one may still send the commit after the signal was sent:
	// the held row is released only once every thread has stopped.
	waitStopped(t, leader.cmd.Process.Pid)
	release()
	var oldXID string
	// Its transaction stays open: idle, or, when the rest of the ingest's
	// pipeline already reached the server, waiting on a lock (the
	// checkpoint row, once the standby leads).
	var oldState, seen string
	t.Cleanup(func() {
		if t.Failed() {
			// What the held backend was doing, for a failure to explain itself.
			t.Logf("backend %d last seen as: %s", ingestPID, seen)
		}
	})
	waitForT(t, 30*time.Second, "the frozen leader's insert to complete, its transaction open", func() bool {
		var xid, state, wait, query *string
		if err := pool.QueryRow(ctx, `SELECT backend_xid::text, state, wait_event_type || ':' || wait_event, left(query, 80)
			FROM pg_stat_activity WHERE pid = $1`, ingestPID).Scan(&xid, &state, &wait, &query); err != nil {
			seen = err.Error()
			return false
		}
		seen = fmt.Sprintf("xid %v, state %v, waiting on %v, query %v", deref(xid), deref(state), deref(wait), deref(query))
		if xid == nil || state == nil || !(*state == "idle in transaction" || *state == "active" && wait != nil && strings.HasPrefix(*wait, "Lock:")) {
			return false
		}
		oldXID, oldState = *xid, *state
		return true
	})
	// When the frozen transaction itself waits on a lock, the new leader's
	// ingest of the held event and it wait on each other, and PostgreSQL's
	// deadlock check ends one of them: the old commit is refused either
	// way, which is what the assertions below check.
	pipelined := oldState == "active"

	waitForT(t, 30*time.Second, "the standby to take over", func() bool {
		pid := slotPID(t, pool)
		return pid != 0 && pid != oldPID
	})
	takeover := time.Since(frozenAt)
	// The new leader brings the held event again (its stream, or its
	// reconciliation of the outbox) and waits for the old leader's
	// transaction.
	if !pipelined {
		waitForT(t, 30*time.Second, "the new leader to ingest the held event again", func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, ingestPID) > 0
		})
	}
	var newToken int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT fencing FROM postbox.checkpoints`).Scan(&newToken))

	require.NoError(t, leader.cmd.Process.Signal(syscall.SIGCONT))
	waitForT(t, 30*time.Second, "the old leader's transaction to end", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND backend_xid IS NOT NULL`, ingestPID) == 0
	})
	prod.finish()
	res := waitAllReceived(t, append(prod.ids(), x), rc, 90*time.Second)

	var xmin string
	require.NoError(t, pool.QueryRow(ctx, `SELECT xmin::text FROM postbox.events WHERE event_id = $1`, x).Scan(&xmin))
	require.NotEqual(t, oldXID, xmin, "the old leader's ingest transaction did not commit")
	var token int64
	var pid int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT c.fencing, i.pid FROM postbox.checkpoints c JOIN postbox.instances i ON i.id = c.leader`).Scan(&token, &pid))
	require.Equal(t, newToken, token, "no write moved the token back")
	require.NotEqual(t, leader.cmd.Process.Pid, pid, "the old leader did not take the lease back")
	if pipelined {
		leader.waitLog(t, 10*time.Second, `"component":"ingest"`)
	} else {
		leader.waitLog(t, 10*time.Second, "commit ingest: fenced off")
	}
	require.Contains(t, leader.out.String(), "another instance took over streaming")
	t.Logf("streamer frozen mid-ingest: standby streaming %s after SIGSTOP; the old leader's commit (xid %s) refused; sent %d, received %d distinct, %d duplicated",
		takeover.Round(time.Millisecond), oldXID, res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, defaultLane, "one instance frozen, its ingest refused")
	require.Less(t, takeover, takeoverWithin(leaderLease), "the standby takes over within the leader lease and the stated margin")
}

// TestFrozenTransactionIsEnded freezes the streaming instance (SIGSTOP)
// in the middle of an ingest transaction, as TestFrozenLeaderIsFencedOff
// does, with no instance beside it. The server ends the frozen
// transaction once it has been idle for idle_in_transaction_session_timeout
// (postbox's sessions get a minute where nothing sets it; the test's relay
// is given 2 s in its database URL, which it keeps): its locks and its
// hold on vacuum's horizon go with it. Woken, the instance finds its
// session gone, logs the fault, and goes on with a new one: the stream
// brings the rolled-back events again, and nothing is lost.
func TestFrozenTransactionIsEnded(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	relayURL := dbURL + sep + "options=-c%20idle_in_transaction_session_timeout%3D2s"
	frozen, _ := streamingRelay(t, relayURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	prod := produce(t, pool, "p", 10*time.Millisecond)
	waitForT(t, 30*time.Second, "deliveries under load", func() bool { d, _, _ := rc.snapshot(); return d >= 50 })

	x, ingestPID, release := holdIngest(t, pool, "p")
	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGSTOP))
	waitStopped(t, frozen.cmd.Process.Pid)
	release()
	waitForT(t, 30*time.Second, "the frozen instance's insert to complete, its transaction open", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE pid = $1 AND state = 'idle in transaction' AND backend_xid IS NOT NULL`, ingestPID) == 1
	})
	idleFrom := time.Now()
	waitForT(t, 30*time.Second, "the server to end the frozen transaction's session", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, ingestPID) == 0
	})
	ended := time.Since(idleFrom)
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM postbox.events WHERE event_id = $1`, x),
		"the frozen transaction's insert rolled back")

	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGCONT))
	frozen.waitLog(t, 30*time.Second, "DATABASE FAULT")
	prod.finish()
	res := waitAllDelivered(t, pool, append(prod.ids(), x), rc)
	select {
	case <-frozen.exited:
		t.Fatal("the instance exited")
	default:
	}
	// The fault names the server's side: its last word on the session,
	// where that was read before the connection closed, or the session's
	// end. (Resumed in the middle of an ingest's COPY, pgx writes the copy
	// data before it reads the server's answer; a write that meets the
	// server's reset first closes the connection, and the word with it.)
	out := frozen.out.String()
	require.True(t, strings.Contains(out, "DATABASE FAULT: a session of postbox's was ended by idle_in_transaction_session_timeout") ||
		strings.Contains(out, "DATABASE FAULT: a connection of postbox's ended without a word from the server"),
		"the fault names the ended session")
	t.Logf("frozen mid-ingest: its session ended %s after its transaction was seen idle; sent %d, received %d distinct, %d duplicated (attempted before the rollback)",
		ended.Round(100*time.Millisecond), res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, defaultLane, "one instance frozen, its ingest rolled back")
}

// TestDoctor explains the test server: all required settings in place,
// an unlimited max_slot_wal_keep_size warned about; a role without
// REPLICATION is an error (exit 1).
func TestDoctor(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	cfg := writeConfig(t, dbURL, "")
	code, out, errOut := postbox(t, "doctor", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "OK    wal_level")
	require.Contains(t, out, "WARN  max_slot_wal_keep_size")
	require.Contains(t, out, "clock_skew")
	require.Contains(t, out, "outbox_mode")
	require.Contains(t, out, "OK    synchronous_commit")

	// A database whose commits do not wait for their flush: the relay's
	// records could be undone by a crash of the server.
	ctx := context.Background()
	var db string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db))
	_, err := pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET synchronous_commit = off`)
	require.NoError(t, err)
	code, out, errOut = postbox(t, "doctor", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "WARN  synchronous_commit")
	require.Contains(t, out, "SET synchronous_commit = on")
	_, err = pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` RESET synchronous_commit`)
	require.NoError(t, err)

	role := pgtest.UniqueName("norepl")
	_, err = pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP ROLE `+role) })
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	cfg2 := writeConfig(t, u.String(), "")
	code, out, errOut = postbox(t, "doctor", "--config", cfg2, "--json")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, `"severity": "error"`, errOut)
	require.Contains(t, out, "WITH REPLICATION")

	// Events written with outbox.Emit (no outbox row) are named, and with
	// a bounded max_slot_wal_keep_size their risk is a warning.
	code, out, errOut = postbox(t, "migrate", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	_, err = pool.Exec(ctx, `INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at)
		VALUES (gen_random_uuid(), 'e', '', '{}', now())`)
	require.NoError(t, err)
	code, out, errOut = postbox(t, "doctor", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "outbox_mode")
	require.Contains(t, out, "messages: 1 events written with outbox.Emit")
	_, err = pool.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `ALTER SYSTEM RESET max_slot_wal_keep_size`)
		_, _ = pool.Exec(context.Background(), `SELECT pg_reload_conf()`)
	})
	_, err = pool.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	waitForT(t, 10*time.Second, "the reload", func() bool {
		code, out, _ = postbox(t, "doctor", "--config", cfg)
		return strings.Contains(out, "WARN  outbox_mode")
	})
	require.Contains(t, out, "exist only in WAL")
}

// TestHugePayloadIsRefusedUnread commits a 100 MB payload between small
// events: it becomes a payload_too_large dead letter without being stored,
// the events after it arrive, and the relay's memory rises by the one
// copy it cannot avoid (the replication message as pgconn reads it), not
// by the copies decoding and storing it would make.
func TestHugePayloadIsRefusedUnread(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 100 MB row")
	}
	pool, rc, p := bulkRelay(t, "")
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) SELECT 'bulk', jsonb_build_object('i', i) FROM generate_series(1, 100) i`)
	require.NoError(t, err)
	waitForT(t, time.Minute, "the first 100 deliveries", func() bool { d, _, _ := rc.snapshot(); return d == 100 })
	before := peakRSS(p.cmd.Process.Pid)

	const size = 100 << 20
	var huge string
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, payload)
		VALUES ('bulk', jsonb_build_object('pad', repeat('x', $1))) RETURNING event_id::text`, size).Scan(&huge))
	_, err = pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('bulk', '{"after": 1}')`)
	require.NoError(t, err)
	waitForT(t, 2*time.Minute, "the event after the huge one", func() bool { d, _, _ := rc.snapshot(); return d == 101 })

	var status, reason string
	var stored, dropped int
	// The event after it can reach the receiver before the ingest that
	// writes both commits: the first attempt starts as the row arrives.
	waitForT(t, 30*time.Second, "the huge event's dead letter, committed", func() bool {
		return pool.QueryRow(ctx, `
			SELECT d.status, d.last_error, octet_length(e.payload::text), e.payload_dropped
			FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id WHERE e.event_id = $1`, huge).
			Scan(&status, &reason, &stored, &dropped) == nil
	})
	require.Equal(t, "dead_letter", status)
	require.Contains(t, reason, "payload_too_large: ")
	require.Greater(t, dropped, size, "its size is kept")
	require.Less(t, stored, 10, "its payload is not")
	after := peakRSS(p.cmd.Process.Pid)
	t.Logf("a %d MB payload: relay peak RSS %.0f MB before, %.0f MB after", size>>20, before, after)
	require.Less(t, after-before, 1.5*float64(size>>20), "one copy of the payload at most")
}
