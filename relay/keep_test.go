package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestBacklogOfADrainingLaneIsKeptNotQueued: a backlog arriving faster
// than a draining lane delivers is written in flight for the one instance
// and kept by id, so no delivery is claimed from the queue; beside another
// registered instance, which could claim it too, it goes to the queue.
// Every event arrives once either way.
func TestBacklogOfADrainingLaneIsKeptNotQueued(t *testing.T) {
	t.Parallel()
	aloneAndBeside(t, func(t *testing.T, peer bool) {
		claimed, n := keptBacklog(t, peer, 0)
		t.Logf("%d of %d deliveries claimed from the queue", claimed, n)
		if peer {
			require.Greater(t, claimed, n/2, "the queue, for any instance to claim")
		} else {
			require.Less(t, claimed, n/4, "kept in flight, not queued and claimed")
		}
	})
}

// TestBacklogIsDeliveredWithoutTheSweep: the claimer's wakes alone (a
// lane freed, deliveries kept or queued) deliver a backlog that outruns
// its lane, kept in flight or queued beside another instance, with the
// sweep, the claimer's safety net, an hour away. A wake the claimer
// misses leaves deliveries waiting for it.
func TestBacklogIsDeliveredWithoutTheSweep(t *testing.T) {
	t.Parallel()
	aloneAndBeside(t, func(t *testing.T, peer bool) {
		claimed, n := keptBacklog(t, peer, time.Hour)
		t.Logf("%d of %d deliveries claimed from the queue", claimed, n)
	})
}

// aloneAndBeside runs f in parallel subtests: the relay alone (peer
// false), and beside another registered instance.
func aloneAndBeside(t *testing.T, f func(t *testing.T, peer bool)) {
	for _, peer := range []bool{false, true} {
		name := "alone"
		if peer {
			name = "beside another instance"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, peer)
		})
	}
}

// keptBacklog delivers a backlog to a lane that drains, and returns how
// many of its deliveries were claimed from the queue (pending → in_flight).
// A sweep interval other than 0 replaces the tests' default.
func keptBacklog(t *testing.T, peer bool, sweep time.Duration) (claimed, n int) {
	tb := setup(t)
	if sweep != 0 {
		tb.cfg.SweepInterval = config.Duration(sweep)
	}
	rc := drainingLane(t, tb)
	r := tb.start(t, relay.Options{})
	if peer {
		registerPeer(t, tb, r)
	}
	claims := countClaims(t, tb, "pending")
	// The lane drains: it has delivered. Then transactions of 100, one
	// after another, which the ingest writes faster than it delivers.
	exec(t, tb.pool, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('bulk', '{}')`)
	waitUntil(t, 30*time.Second, "the first delivery", func() bool { return rc.count() == 1 })
	const txs, per = 20, 100
	insertHundreds(t, tb, txs)
	n = txs*per + 1
	tb.waitSettled(t, n, 2*time.Minute)
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: n}, tb.deliveries(t))
	rc.requireEachOnce(t, n)
	claimed = claims()
	if sweep == 0 {
		// Each range of events under way is deleted once done with, well
		// before a sweep would find it stale (claim.StaleClaimDefault).
		waitUntil(t, 5*time.Second, "the ranges under way deleted", func() bool { return rangesLeft(t, tb) == 0 })
	}
	return claimed, n
}

// TestEventsUnderWayLostTrackOfAreQueued: a range of this instance whose
// events it does not hold (their ingest committed although its answer was
// lost) is swept once stale: its events get pending deliveries, in their
// lanes, and are delivered.
func TestEventsUnderWayLostTrackOfAreQueued(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	rc := newReceiver(t, func(int, received) int { return http.StatusOK })
	tb.endpoint(t, "lost", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	var first, last int64
	require.NoError(t, tb.pool.QueryRow(ctx, `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, payload, created_at)
		  SELECT gen_random_uuid(), 'lost', jsonb_build_object('i', i), now() FROM generate_series(1, 5) i RETURNING id
		)
		SELECT min(id), max(id) FROM ev`).Scan(&first, &last))
	exec(t, tb.pool, fmt.Sprintf(`INSERT INTO postbox.under_way (owner, first_event, last_event, created_at)
		VALUES ('%s', %d, %d, now() - interval '1 minute')`, r.InstanceID(), first, last))
	tb.waitSettled(t, 5, 30*time.Second)
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: 5}, tb.deliveries(t))
	rc.requireEachOnce(t, 5)
	require.Zero(t, rangesLeft(t, tb))
}

// drainingLane configures the endpoint bulk, a lane of 2, at a receiver
// that answers in a millisecond: a backlog outruns it.
func drainingLane(t *testing.T, tb *testBundle) *receiver {
	rc := newReceiver(t, func(int, received) int {
		time.Sleep(time.Millisecond)
		return http.StatusOK
	})
	tb.endpoint(t, "bulk", rc.URL, func(ec *config.EndpointConfig) {
		c := 2
		ec.MaxInFlight = &c
	})
	return rc
}

// insertHundreds commits txs transactions of 100 events for bulk.
func insertHundreds(t *testing.T, tb *testBundle, txs int) {
	for range txs {
		exec(t, tb.pool, `INSERT INTO postbox.outbox (endpoint, payload) SELECT 'bulk', jsonb_build_object('i', i) FROM generate_series(1, 100) i`)
	}
}

// rangesLeft counts the ranges of events under way.
func rangesLeft(t *testing.T, tb *testBundle) int {
	var n int
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT count(*) FROM postbox.under_way`).Scan(&n))
	return n
}

// registerPeer registers another instance, current (its connection is not
// checked), and waits until r's heartbeats have seen it: two of them
// after the registration.
func registerPeer(t *testing.T, tb *testBundle, r *relay.Relay) {
	t.Helper()
	ctx := context.Background()
	var at time.Time
	require.NoError(t, tb.pool.QueryRow(ctx, `INSERT INTO postbox.instances (id, expires_at) VALUES ('peer', now() + interval '1 hour') RETURNING now()`).Scan(&at))
	waitUntil(t, 30*time.Second, "two heartbeats after the peer registered", func() bool {
		var beats int
		_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.instances WHERE id = $1 AND heartbeat_at > $2::timestamptz + interval '1 second'`,
			r.InstanceID(), at).Scan(&beats)
		return beats == 1
	})
}

// countClaims has a trigger count the deliveries claimed from status from
// (their update to in_flight), and returns a reader of the count.
func countClaims(t *testing.T, tb *testBundle, from string) func() int {
	t.Helper()
	exec(t, tb.pool, `
		CREATE TABLE claims_seen (n int NOT NULL);
		INSERT INTO claims_seen VALUES (0);
		CREATE FUNCTION count_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN UPDATE claims_seen SET n = n + 1; RETURN NULL; END $$;
		CREATE TRIGGER count_claim AFTER UPDATE ON postbox.deliveries FOR EACH ROW
		  WHEN (OLD.status = '`+from+`' AND NEW.status = 'in_flight') EXECUTE FUNCTION count_claim();`)
	return func() int {
		var n int
		require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT n FROM claims_seen`).Scan(&n))
		return n
	}
}

// seesPeers waits until r's heartbeats have seen the instances registered
// now: two of them after this call.
func seesPeers(t *testing.T, tb *testBundle, r *relay.Relay) {
	t.Helper()
	ctx := context.Background()
	var at time.Time
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT now()`).Scan(&at))
	waitUntil(t, 30*time.Second, "two heartbeats after the others registered", func() bool {
		var beats int
		_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.instances WHERE id = $1 AND heartbeat_at > $2::timestamptz + interval '1 second'`,
			r.InstanceID(), at).Scan(&beats)
		return beats == 1
	})
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql)
	require.NoError(t, err)
}

// TestKeptDeliveriesReturnToTheQueueWhenAnotherInstanceRegisters: once
// another instance registers, the deliveries kept in flight go back to
// the queue, where it could claim them; each is still delivered once.
func TestKeptDeliveriesReturnToTheQueueWhenAnotherInstanceRegisters(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	rc := newReceiver(t, func(int, received) int {
		time.Sleep(20 * time.Millisecond)
		return http.StatusOK
	})
	tb.endpoint(t, "slow", rc.URL, func(ec *config.EndpointConfig) {
		c := 1
		ec.MaxInFlight = &c
	})
	tb.start(t, relay.Options{}) // alone, as it finds at boot
	// A backlog is kept for a lane that delivered within the last second:
	// events trickle in, one at a time, so that the lane has delivered
	// just before the backlog comes however slowly this machine runs.
	// The lane has delivered once the second request arrives: with one
	// attempt at a time, the first was answered, and its outcome seen,
	// before the second began (the first request's arrival alone is not
	// enough: a backlog ingested during its answer found a lane that had
	// not delivered yet, and went to the queue).
	trickled := trickle(t, tb.pool, "slow", 50*time.Millisecond)
	waitUntil(t, 30*time.Second, "the first delivery answered", func() bool { return rc.count() >= 2 })
	exec(t, tb.pool, `INSERT INTO postbox.outbox (endpoint, payload) SELECT 'slow', jsonb_build_object('i', i) FROM generate_series(1, 300) i`)
	count := func(status string) int {
		var c int
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE status = $1`, status).Scan(&c))
		if status == "in_flight" {
			// Events under way are in flight without a delivery yet.
			var under int
			require.NoError(t, tb.pool.QueryRow(ctx, `
				SELECT count(*) FROM postbox.events e
				WHERE NOT EXISTS (SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = e.id)`).Scan(&under))
			c += under
		}
		return c
	}
	waitUntil(t, 30*time.Second, "the backlog kept in flight", func() bool { return count("in_flight") > 200 })
	n := 300 + trickled()
	require.Less(t, count("pending"), 10)

	// Registered, and current: its connection is not checked here.
	exec(t, tb.pool, `INSERT INTO postbox.instances (id, expires_at) VALUES ('peer', now() + interval '1 hour')`)
	waitUntil(t, 30*time.Second, "the kept deliveries back in the queue", func() bool {
		return count("in_flight") <= 10 && count("pending") > 100
	})
	tb.waitSettled(t, n, 2*time.Minute)
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: n}, tb.deliveries(t))
	rc.requireEachOnce(t, n)
}

// trickle inserts an event for endpoint every interval until the returned
// stop is called, which returns how many it inserted.
func trickle(t *testing.T, pool *pgxpool.Pool, endpoint string, every time.Duration) (stop func() int) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var n int
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if _, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, payload) VALUES ($1, '{}')`, endpoint); err == nil {
				n++
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(done); wg.Wait() })
		return n
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestSessionEndsWhileEventsAreUnderWay terminates the walsender while the
// relay, alone, holds a backlog under way: the instance lives on, so its
// ranges stay its own, and the next session's ingest goes on beside them.
// Every event gets one delivery, delivered, and every range is deleted.
func TestSessionEndsWhileEventsAreUnderWay(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	rc := drainingLane(t, tb)
	tb.start(t, relay.Options{})
	exec(t, tb.pool, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('bulk', '{}')`)
	waitUntil(t, 30*time.Second, "the first delivery", func() bool { return rc.count() == 1 })
	const txs, per = 20, 100
	insertHundreds(t, tb, txs/2)
	underWay := func() int {
		var n int
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events_under_way`).Scan(&n))
		return n
	}
	waitUntil(t, 30*time.Second, "events under way", func() bool { return underWay() > 200 })
	var killed bool
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot).Scan(&killed))
	require.True(t, killed)
	insertHundreds(t, tb, txs/2)
	n := txs*per + 1
	tb.waitSettled(t, n, 2*time.Minute)
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: n}, tb.deliveries(t), "one delivery per event")
	byID := rc.byID()
	require.Len(t, byID, n, "every event arrived")
	waitUntil(t, 5*time.Second, "the ranges deleted", func() bool { return rangesLeft(t, tb) == 0 })
	require.Contains(t, tb.logs.String(), "replication session ended")
	repeats := 0
	for _, c := range byID {
		repeats += c - 1
	}
	t.Logf("%d events, %d repeated", n, repeats)
	// Only attempts made ahead of an ingest the session's end rolled back
	// repeat (the dispatcher's aheadLimit, 3 × max_in_flight, plus the
	// attempts in flight: at most 4 × max_in_flight - 1), never
	// the events held under way: the new session does not give them to
	// the queue.
	require.LessOrEqual(t, repeats, 4*2-1)
}
