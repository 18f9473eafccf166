package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// idCounter is a lean receiver for large tests: it keeps only counts.
type idCounter struct {
	*httptest.Server
	mu  sync.Mutex
	ids map[string]int
	n   atomic.Int64
}

func newIDCounter(t *testing.T) *idCounter {
	c := &idCounter{ids: map[string]int{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get(outbox.HeaderID)
		c.mu.Lock()
		c.ids[id]++
		c.mu.Unlock()
		c.n.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(c.Close)
	return c
}

// TestHugeTransactionInBoundedMemory commits 100,000 outbox rows in one
// transaction: the stream hands them over in chunks, the ingester writes
// them in bounded statements inside one database transaction, and the
// heap stays bounded throughout.
func TestHugeTransactionInBoundedMemory(t *testing.T) {
	// Not parallel: the heap is the process's, and it must be this test's
	// alone to mean anything.
	if testing.Short() {
		t.Skip("100,000 deliveries")
	}
	tb := setup(t)
	tb.logLevel = zerolog.InfoLevel // not a line per attempt in memory
	rc := newIDCounter(t)
	tb.endpoint(t, "bulk", rc.URL, func(ec *config.EndpointConfig) {
		n := 32
		ec.MaxInFlight = &n
	})
	tb.start(t, relay.Options{})
	const n = 100000
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	// ~250 bytes of payload a row: 25 MB in the transaction.
	_, err := tb.pool.Exec(context.Background(), `
		INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'bulk', jsonb_build_object('i', i, 'click_id', md5(i::text), 'pad', repeat('x', 200))
		FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	// A bound on being stuck, not a speed: under the race detector this
	// takes about a minute here alone, and over five beside another
	// package's tests on a machine whose two CPUs are also busy.
	waitUntil(t, 12*time.Minute, "100,000 deliveries", func() bool { return rc.n.Load() >= n })
	close(done)
	tb.waitSettled(t, n, time.Minute)
	rc.mu.Lock()
	require.Len(t, rc.ids, n, "every event arrived")
	rc.mu.Unlock()
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: n}, tb.deliveries(t))
	t.Logf("peak heap %.1f MB while ingesting and delivering %d events of one transaction", float64(peak.Load())/(1<<20), n)
	require.Less(t, peak.Load(), uint64(80<<20), "the heap stays bounded (the transaction alone is ~25 MB of payload)")
}

// TestQuietOutboxNeverPinsWAL: with no outbox traffic, writes elsewhere in
// the database still let the slot's confirmed position follow the WAL.
func TestQuietOutboxNeverPinsWAL(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.StatusInterval = config.Duration(200 * time.Millisecond)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	_, err := tb.pool.Exec(ctx, `CREATE TABLE busy (id serial PRIMARY KEY, v text); INSERT INTO busy (v) SELECT md5(i::text) FROM generate_series(1, 10000) i`)
	require.NoError(t, err)
	var target string
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target))
	want, _ := pglogrepl.ParseLSN(target)
	waitUntil(t, 20*time.Second, "the slot to follow the WAL", func() bool {
		var confirmed string
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot).Scan(&confirmed))
		got, _ := pglogrepl.ParseLSN(confirmed)
		return got >= want
	})
}

// TestReconnectsAfterTheConnectionDrops terminates the walsender: the
// relay reconnects with backoff and delivers what was committed meanwhile.
func TestReconnectsAfterTheConnectionDrops(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	first := tb.insert(t, outbox.Event{Endpoint: "p"})
	tb.waitSettled(t, 1, 20*time.Second)
	var killed bool
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot).Scan(&killed))
	require.True(t, killed)
	second := tb.insert(t, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"})
	tb.waitSettled(t, 3, 30*time.Second)
	byID := rc.byID()
	for _, id := range append(first, second...) {
		require.Equal(t, 1, byID[id], "event %s delivered once", id)
	}
	require.Contains(t, tb.logs.String(), "replication session ended")
}

// TestFirstAttemptDoesNotWaitForTheIngestBefore holds one event's ingest
// transaction (its checkpoint row locked) and commits a second event
// meanwhile: the second one's first attempt goes out at once, from the
// stream, not after the ingest before it. Both are recorded once the
// lock is gone, each delivered once.
func TestFirstAttemptDoesNotWaitForTheIngestBefore(t *testing.T) {
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "ep", rc.URL, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()

	lock, err := tb.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `SELECT 1 FROM postbox.checkpoints FOR UPDATE`)
	require.NoError(t, err)

	first := tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":1}`)})
	waitUntil(t, 10*time.Second, "the first event's attempt", func() bool { return rc.byID()[first[0]] == 1 })
	second := tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":2}`)})
	waitUntil(t, 10*time.Second, "the second event's attempt, while the first one's ingest waits", func() bool {
		return rc.byID()[second[0]] == 1
	})
	var n int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries`).Scan(&n))
	require.Zero(t, n, "no ingest has committed while the checkpoint row is locked")

	require.NoError(t, lock.Rollback(ctx))
	tb.waitSettled(t, 2, 20*time.Second)
	require.Equal(t, 2, tb.deliveries(t)[postboxtype.DeliveryDelivered])
	rc.requireEachOnce(t, 2)
	for _, id := range append(first, second...) {
		require.Equal(t, 1, tb.attempts(t, id), "event %s: its attempt is recorded", id)
	}
}

// TestALaneEndsTheIngestLinger: the ingest lingers for the transactions
// that follow a live one, but a lane with max_in_flight first attempts in
// the lingering batch ends the linger, so that its attempts never wait
// for a linger. With a linger of an hour and max_in_flight 2, the second
// event ends it: the first two attempts are recorded without waiting for
// the hour, and the third event is delivered too.
func TestALaneEndsTheIngestLinger(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "ep", rc.URL, func(ec *config.EndpointConfig) { ec.MaxInFlight = intp(2) })
	tb.start(t, relay.Options{}.WithIngestLinger(time.Hour))
	ids := tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":1}`)})
	require.Eventually(t, func() bool { return rc.count() == 1 }, 20*time.Second, 5*time.Millisecond)
	// The ingest of the first now lingers: two more, each its own
	// transaction. The second makes two of the lane's first attempts in
	// the lingering batch, and ends it.
	ids = append(ids, tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":2}`)})...)
	ids = append(ids, tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":3}`)})...)
	require.Eventually(t, func() bool { return rc.count() == 3 }, 20*time.Second, 5*time.Millisecond,
		"all three delivered")
	rc.requireEachOnce(t, 3)
	for _, id := range ids[:2] {
		require.Eventually(t, func() bool { return tb.attempts(t, id) == 1 }, 20*time.Second, 10*time.Millisecond,
			"event %s: ingested and its attempt recorded, without waiting for the hour", id)
	}
}

// TestAQueuedDeliveryEndsTheIngestLinger: a transaction that arrives
// while the ingest lingers, with a delivery that waits for the commit (an
// ordered endpoint's, which goes to the queue), ends the linger, even an
// hour's.
func TestAQueuedDeliveryEndsTheIngestLinger(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "ep", rc.URL, nil)
	tb.endpoint(t, "ord", rc.URL, func(ec *config.EndpointConfig) { ec.Ordered = new(bool); *ec.Ordered = true })
	tb.start(t, relay.Options{}.WithIngestLinger(time.Hour))
	tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":1}`)})
	require.Eventually(t, func() bool { return rc.count() == 1 }, 20*time.Second, 5*time.Millisecond)
	tb.insert(t, outbox.Event{Endpoint: "ord", Payload: []byte(`{"n":2}`)})
	require.Eventually(t, func() bool { return rc.count() == 2 }, 20*time.Second, 5*time.Millisecond,
		"the ordered endpoint's delivery waits in a lingering ingest")
	rc.requireEachOnce(t, 2)
}

// TestLiveTransactionsShareAnIngestCommit commits ten events a few
// milliseconds apart, each in its own transaction: their deliveries go
// out at once, and their ingest gathers them into a few commits
// (ingest.LingerDefault) rather than one each.
func TestLiveTransactionsShareAnIngestCommit(t *testing.T) {
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "ep", rc.URL, nil)
	tb.start(t, relay.Options{})
	const n = 10
	for i := range n {
		tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		time.Sleep(3 * time.Millisecond)
	}
	tb.waitSettled(t, n, 20*time.Second)
	rc.requireEachOnce(t, n)
	var commits int
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT count(DISTINCT xmin::text) FROM postbox.events`).Scan(&commits))
	t.Logf("%d events ingested in %d transactions", n, commits)
	require.LessOrEqual(t, commits, n/2, "transactions arriving together are ingested together")
}

// TestADeliveryDoneBeforeItsIngestIsWrittenOnce: a live event's first
// attempt finishes within its ingest's linger, so the ingest writes its
// delivery delivered, with the attempt, in the transaction that writes
// the event (the same xmin) and the recorder never updates it; one that
// failed (400: a dead letter at once) is written in flight and updated by
// the recorder as before. The
// recorder still counts both attempts' latency, once each.
func TestADeliveryDoneBeforeItsIngestIsWrittenOnce(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, func(_ int, r received) int {
		if strings.Contains(string(r.Body), "fail") {
			return http.StatusBadRequest // permanent: one attempt
		}
		return http.StatusOK
	})
	tb.endpoint(t, "ep", rc.URL+"/hook", nil)
	r := tb.start(t, relay.Options{}.WithIngestLinger(time.Second))
	// The second transaction arrives while the first's ingest lingers
	// (two arriving together would be a backlog, committed at once).
	ids := tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":"ok"}`)})
	require.Eventually(t, func() bool { return rc.count() == 1 }, 20*time.Second, time.Millisecond)
	ids = append(ids, tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{"n":"fail"}`)})...)
	waitUntil(t, 20*time.Second, "both attempts recorded", func() bool {
		return tb.attempts(t, ids[0]) == 1 && tb.attempts(t, ids[1]) == 1
	})
	ctx := context.Background()
	once := func(id string) (bool, string) {
		var same bool
		var status string
		require.NoError(t, tb.pool.QueryRow(ctx, `
			SELECT d.xmin = e.xmin, d.status FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
			WHERE e.event_id = $1`, id).Scan(&same, &status))
		return same, status
	}
	same, status := once(ids[0])
	require.True(t, same, "the delivered one is written with its event and never again")
	require.Equal(t, "delivered", status)
	same, status = once(ids[1])
	require.False(t, same, "the failed one is recorded after its ingest")
	require.Equal(t, "dead_letter", status)

	d := tb.delivery(t, ids[0])
	require.Equal(t, 1, d.Attempts)
	require.Equal(t, http.StatusOK, d.LastStatus)
	require.NotNil(t, d.DeliveredAt)
	require.NotNil(t, d.C2DMS, "commit-to-delivery time written")
	var owner *string
	var attempt int
	var outcome, target, instance string
	require.NoError(t, tb.pool.QueryRow(ctx, `
		SELECT d.lease_owner, a.attempt, a.outcome, a.target, a.instance
		FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk JOIN postbox.all_attempts a ON a.delivery_id = d.id
		WHERE e.event_id = $1`, ids[0]).Scan(&owner, &attempt, &outcome, &target, &instance))
	require.Nil(t, owner, "no lease on a delivered row")
	require.Equal(t, 1, attempt)
	require.Equal(t, "delivered", outcome)
	require.Equal(t, rc.URL+"/hook", target)
	require.Equal(t, r.InstanceID(), instance)

	// The histograms have each attempt once, once the recorder flushes
	// them (Stop does).
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	var counted int64
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM postbox.latency_histogram WHERE endpoint = 'ep'`).Scan(&counted))
	require.EqualValues(t, 2, counted)
}
