package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// inTx runs f in one transaction of tb's database.
func (tb *testBundle) inTx(t *testing.T, f func(tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(context.Background(), tb.pool, f))
}

// status is the status of an event's last delivery ("" before it has one).
func (tb *testBundle) status(eventID string) postboxtype.DeliveryState {
	var s postboxtype.DeliveryState
	_ = tb.pool.QueryRow(context.Background(), `
		SELECT d.status FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 ORDER BY d.id DESC LIMIT 1`, eventID).Scan(&s)
	return s
}

// insertIn writes an event in tx, returning its id.
func insertIn(t *testing.T, tx pgx.Tx, e outbox.Event) string {
	t.Helper()
	id, err := outbox.Insert(context.Background(), tx, e)
	require.NoError(t, err)
	return id
}

// TestEndpointRowsSeededBeforeFirstStart: rows of postbox.endpoints
// written before any relay ever streamed (no slot, nothing in the stream)
// are applied: the first leader seeds endpoint_state from the table.
func TestEndpointRowsSeededBeforeFirstStart(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	ctx := context.Background()
	_, err := relay.Migrate(ctx, tb.pool, tb.resolved(t))
	require.NoError(t, err)
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, headers) VALUES ('seeded', $1, '{"X-Partner": "seeded"}')`, rc.URL+"/seeded")
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('gone', $1)`, rc.URL+"/gone")
	tb.exec(t, `DELETE FROM postbox.endpoints WHERE name = 'gone'`)

	tb.start(t, relay.Options{})
	id := tb.insert(t, outbox.Event{Endpoint: "seeded", Payload: json.RawMessage(`{"n":1}`)})[0]
	waitUntil(t, 10*time.Second, "the event delivered", func() bool { return rc.count() == 1 })
	got := rc.requests()[0]
	require.Equal(t, id, got.ID)
	require.Equal(t, "/seeded", got.Path)
	require.Equal(t, "seeded", got.Header.Get("X-Partner"))

	var seeded bool
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT endpoints_seeded FROM postbox.checkpoints`).Scan(&seeded))
	require.True(t, seeded)
	var rows int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE jsonb_typeof(row) = 'object'`).Scan(&rows))
	require.Equal(t, 1, rows, "the deleted row is not applied")
}

// TestEndpointRowsSeededWhole: a seed of thousands of rows (once read a
// chunk at a time, now copied in the server) applies every row, the
// last one's included.
func TestEndpointRowsSeededWhole(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	ctx := context.Background()
	_, err := relay.Migrate(ctx, tb.pool, tb.resolved(t))
	require.NoError(t, err)
	n := 2001
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, headers)
		SELECT 'p-' || i, $1 || '/p-' || i, jsonb_build_object('X-Partner', i::text) FROM generate_series(1, $2) i`, rc.URL, n)

	tb.start(t, relay.Options{})
	last := fmt.Sprintf("p-%d", n)
	tb.insert(t, outbox.Event{Endpoint: last, Payload: json.RawMessage(`{"n":1}`)})
	waitUntil(t, 10*time.Second, "the event delivered", func() bool { return rc.count() == 1 })
	got := rc.requests()[0]
	require.Equal(t, "/"+last, got.Path)
	require.Equal(t, strconv.Itoa(n), got.Header.Get("X-Partner"))
	var rows int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE jsonb_typeof(row) = 'object'`).Scan(&rows))
	require.Equal(t, n, rows)
}

// TestEndpointChangesApplyInOrderOnTwoInstances changes an endpoint's url,
// header and rate limit by SQL while its events flow, on two instances
// (the streaming one and one that only claims), and disables it: every
// attempt of an event is made under the settings committed before it or
// later, never earlier. Each change and the events after it carry one
// version: the url's path, a header and the payload's v. First attempts
// fail half the time, so retries are claimed by both instances, the one
// that does not stream reading the changes it has not applied before it
// attempts (the gate).
func TestEndpointChangesApplyInOrderOnTwoInstances(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	var mu sync.Mutex
	first := map[string]bool{}
	rc := newReceiver(t, func(_ int, r received) int {
		mu.Lock()
		defer mu.Unlock()
		if !first[r.ID] {
			first[r.ID] = true
			if len(r.ID) > 0 && r.ID[len(r.ID)-1]%2 == 0 {
				return http.StatusServiceUnavailable
			}
		}
		return http.StatusOK
	})
	streams := tb.start(t, relay.Options{InstanceID: "streams"})
	tb.startStandby(t, relay.Options{InstanceID: "claims"})
	ctx := context.Background()
	// Until the streaming instance has seen the other, it keeps its
	// retries (it is alone as far as it knows); then they are queued,
	// for either to claim.
	seesPeers(t, tb, streams)

	version := 0
	set := func(tx pgx.Tx) {
		version++
		_, err := tx.Exec(ctx, `
			INSERT INTO postbox.endpoints (name, url, headers, rate_limit, backoff_base, backoff_cap, max_attempts)
			VALUES ('partner', $1, $2, $3, '20 ms', '50 ms', 50)
			ON CONFLICT (name) DO UPDATE SET url = excluded.url, headers = excluded.headers, rate_limit = excluded.rate_limit`,
			fmt.Sprintf("%s/v%d", rc.URL, version), fmt.Sprintf(`{"X-Version": "%d"}`, version), fmt.Sprintf("%d/s", 1000+version))
		require.NoError(t, err)
	}
	event := func(tx pgx.Tx) string {
		return insertIn(t, tx, outbox.Event{Endpoint: "partner", Payload: json.RawMessage(fmt.Sprintf(`{"v": %d}`, version))})
	}
	var ids []string
	for round := range 12 {
		tb.inTx(t, func(tx pgx.Tx) error {
			// The change and an event after it in one transaction, then
			// events in transactions of their own.
			set(tx)
			ids = append(ids, event(tx))
			return nil
		})
		for range 3 {
			tb.inTx(t, func(tx pgx.Tx) error { ids = append(ids, event(tx)); return nil })
		}
		if round%4 == 3 {
			time.Sleep(100 * time.Millisecond) // let retries be claimed between changes
		}
	}

	// Disabled: its events wait, unattempted, until it is enabled (once
	// the others are delivered: their retries would wait too).
	tb.waitSettled(t, len(ids), 30*time.Second)
	tb.inTx(t, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE postbox.endpoints SET enabled = false WHERE name = 'partner'`)
		return err
	})
	before := rc.count()
	var held string
	tb.inTx(t, func(tx pgx.Tx) error { held = event(tx); return nil })
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, before, rc.count(), "a disabled endpoint's event is not attempted")
	d := tb.delivery(t, held)
	require.Equal(t, postboxtype.DeliveryPending, d.Status)
	require.Zero(t, d.Attempts, "no attempt spent while disabled")
	tb.inTx(t, func(tx pgx.Tx) error {
		set(tx)
		_, err := tx.Exec(ctx, `UPDATE postbox.endpoints SET enabled = true WHERE name = 'partner'`)
		return err
	})
	ids = append(ids, held)
	tb.waitSettled(t, len(ids), 30*time.Second)

	byID := map[string]int{}
	for _, r := range rc.requests() {
		var p struct{ V int }
		require.NoError(t, json.Unmarshal(r.Body, &p))
		rev, err := strconv.Atoi(r.Header.Get("X-Version"))
		require.NoError(t, err, "every attempt carries the endpoint's header")
		require.Equal(t, fmt.Sprintf("/v%d", rev), r.Path, "url and header of one version")
		require.GreaterOrEqual(t, rev, p.V, "event %s (after version %d) attempted under version %d", r.ID, p.V, rev)
		byID[r.ID]++
	}
	require.Len(t, byID, len(ids), "every event arrived")
	for _, id := range ids {
		require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, id).Status)
	}
	for _, r := range rc.requests() {
		if r.ID == held {
			require.Equal(t, strconv.Itoa(version), r.Header.Get("X-Version"), "the held event is sent under the row that released it")
		}
	}
	rows, err := tb.pool.Query(ctx, `SELECT DISTINCT instance FROM postbox.all_attempts ORDER BY 1`)
	require.NoError(t, err)
	instances, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"claims", "streams"}, instances, "both instances attempted")
	var unrecorded int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.all_attempts WHERE endpoint_revision IS NULL`).Scan(&unrecorded))
	require.Zero(t, unrecorded, "every attempt records its endpoint's revision")
}

// TestInvalidEndpointHoldsItsEventsUntilCorrected: a row postbox cannot
// use (a header it sets itself) holds its events, unattempted and not
// dead-lettered, and fires endpoint_invalid; the corrected row releases
// them under it.
func TestInvalidEndpointHoldsItsEventsUntilCorrected(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, headers) VALUES ('broken', $1, '{"Content-Type": "text/plain"}')`, rc.URL+"/broken")
	id := tb.insert(t, outbox.Event{Endpoint: "broken", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 10*time.Second, "endpoint_invalid firing", func() bool {
		var firing bool
		_ = tb.pool.QueryRow(ctx, `SELECT firing FROM postbox.alerts WHERE alert = 'endpoint_invalid'`).Scan(&firing)
		return firing
	})
	// What postbox status evaluates, keeping no table of its own.
	invalid, err := telemetry.LoadInvalidEndpoints(ctx, tb.pool, tb.resolved(t))
	require.NoError(t, err)
	require.Equal(t, []string{"broken"}, invalid)
	d := tb.delivery(t, id)
	require.Equal(t, postboxtype.DeliveryPending, d.Status, "held, not dead-lettered")
	require.Zero(t, d.Attempts)
	require.Zero(t, rc.count())

	tb.exec(t, `UPDATE postbox.endpoints SET headers = '{"X-Fixed": "yes"}' WHERE name = 'broken'`)
	waitUntil(t, 5*time.Second, "the held event delivered", func() bool { return tb.status(id) == postboxtype.DeliveryDelivered })
	require.Equal(t, "yes", rc.requests()[0].Header.Get("X-Fixed"))
	require.Equal(t, 1, tb.delivery(t, id).Attempts)
	var used, current int64
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT endpoint_revision FROM postbox.all_attempts WHERE endpoint = 'broken'`).Scan(&used))
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT revision FROM postbox.endpoints WHERE name = 'broken'`).Scan(&current))
	require.Equal(t, current, used, "the attempt records the revision it was made under")
	invalid, err = telemetry.LoadInvalidEndpoints(ctx, tb.pool, tb.resolved(t))
	require.NoError(t, err)
	require.Empty(t, invalid)
}

// TestDeletedEndpointDeadLettersAndReplaysOnceRecreated: the events of a
// deleted endpoint become unknown_endpoint dead letters; once the row
// exists again, a replay delivers them under it.
func TestDeletedEndpointDeadLettersAndReplaysOnceRecreated(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('partner', $1)`, rc.URL+"/old")
	tb.insert(t, outbox.Event{Endpoint: "partner", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "delivered before the delete", func() bool { return rc.count() == 1 })

	tb.exec(t, `DELETE FROM postbox.endpoints WHERE name = 'partner'`)
	id := tb.insert(t, outbox.Event{Endpoint: "partner", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 10*time.Second, "a dead letter", func() bool { return tb.status(id) == postboxtype.DeliveryDeadLetter })
	require.True(t, strings.HasPrefix(tb.delivery(t, id).LastError, "unknown_endpoint"), tb.delivery(t, id).LastError)

	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('partner', $1)`, rc.URL+"/new")
	// Replayed once every instance has the row again: the replay's
	// attempt waits for nothing else.
	waitUntil(t, 5*time.Second, "the row applied again", func() bool {
		var n int
		_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE name = 'partner' AND jsonb_typeof(row) = 'object'`).Scan(&n)
		return n == 1
	})
	_, n, err := ops.Replay(ctx, tb.pool, tb.resolved(t), postboxtype.ReplayFilter{DeadLetters: true}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitUntil(t, 10*time.Second, "the replay delivered", func() bool { return rc.count() == 2 })
	got := rc.requests()[1]
	require.Equal(t, id, got.ID)
	require.Equal(t, "/new", got.Path)
}

// TestUpdateLeavingATOASTedBodyKeepsIt: an update of an endpoint's url
// streams without its body when the body is TOASTed and unchanged; the
// applied endpoint keeps it, in memory and in endpoint_state, and the
// next event is sent to the new url with it.
func TestUpdateLeavingATOASTedBodyKeepsIt(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, body)
		VALUES ('big', $1, '{"pad": "' || (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i) || '"}')`, rc.URL+"/one")
	var body string
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT body FROM postbox.endpoints WHERE name = 'big'`).Scan(&body))
	tb.insert(t, outbox.Event{Endpoint: "big", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "the first event", func() bool { return rc.count() == 1 })

	tb.exec(t, `UPDATE postbox.endpoints SET url = $1 WHERE name = 'big'`, rc.URL+"/two")
	tb.insert(t, outbox.Event{Endpoint: "big", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "the second event", func() bool { return rc.count() == 2 })
	got := rc.requests()[1]
	require.Equal(t, "/two", got.Path)
	require.Equal(t, body, string(got.Body), "the body the update left out")
	// Written by the ingest, which may commit after the attempt.
	waitUntil(t, 10*time.Second, "the update in endpoint_state, the body kept", func() bool {
		var url, applied string
		_ = tb.pool.QueryRow(ctx, `SELECT row->>'url', row->>'body' FROM postbox.endpoint_state WHERE name = 'big'`).Scan(&url, &applied)
		return url == rc.URL+"/two" && applied == body
	})
}

// TestEndpointCreatedWithItsEventsInOneTransaction: a transaction that
// creates an endpoint and writes a batch of events for it (copied into
// the tables, not inserted by the statement) delivers every one to it,
// and writes the endpoint's row in the same ingest.
func TestEndpointCreatedWithItsEventsInOneTransaction(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	const n = 200
	tb.inTx(t, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) VALUES ('bulk', $1)`, rc.URL+"/bulk"); err != nil {
			return err
		}
		for i := range n {
			insertIn(t, tx, outbox.Event{Endpoint: "bulk", Payload: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))})
		}
		return nil
	})
	tb.waitSettled(t, n, 30*time.Second)
	require.Equal(t, n, tb.deliveries(t)[postboxtype.DeliveryDelivered])
	for _, r := range rc.requests() {
		require.Equal(t, "/bulk", r.Path)
	}
	var rows int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE name = 'bulk'`).Scan(&rows))
	require.Equal(t, 1, rows)
}

// TestEndpointsSeededAgainAfterTheSlotWasLost: changes made while no slot
// existed (dropped) never stream; the leader that recreates the slot owes
// a reconciliation and seeds endpoint_state again: a row inserted then is
// applied, one deleted then is gone, on the next start.
func TestEndpointsSeededAgainAfterTheSlotWasLost(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	r := tb.start(t, relay.Options{})
	ctx := context.Background()
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('old', $1)`, rc.URL+"/old")
	tb.insert(t, outbox.Event{Endpoint: "old", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "delivered to old", func() bool { return rc.count() == 1 })
	waitUntil(t, 10*time.Second, "old applied", func() bool {
		var n int
		_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE name = 'old'`).Scan(&n)
		return n == 1
	})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	tb.dropSlot(t)
	tb.exec(t, `DELETE FROM postbox.endpoints WHERE name = 'old'`)
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('new', $1)`, rc.URL+"/new")

	tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "new", Payload: json.RawMessage(`{}`)}, outbox.Event{Endpoint: "old", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "both settled", func() bool {
		return tb.status(ids[0]) == postboxtype.DeliveryDelivered && tb.status(ids[1]) == postboxtype.DeliveryDeadLetter
	})
	require.Equal(t, "/new", rc.requests()[1].Path)
	require.True(t, strings.HasPrefix(tb.delivery(t, ids[1]).LastError, "unknown_endpoint"))
}

// TestGateAloneKeepsAnInstanceCurrent: an instance that does not stream,
// hears no NOTIFY and polls nothing, started before the endpoint existed,
// still attempts every event it claims under the settings committed
// before it: before an attempt of an event committed after what it has
// applied, it reads the changes (the gate). Without the gate it would
// dead-letter them as unknown_endpoint. The streaming instance ingests
// every event and its attempts fail; then it stops, a lease held by no
// live instance keeps the other from streaming, and the receiver
// recovers: every delivery is the other's.
func TestGateAloneKeepsAnInstanceCurrent(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	var open atomic.Bool
	rc := newReceiver(t, func(int, received) int {
		if open.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	streams := tb.start(t, relay.Options{InstanceID: "streams"})
	tb.startStandby(t, relay.Options{InstanceID: "gate"}.WithEndpointsGateOnly())
	ctx := context.Background()

	var ids []string
	for version := 1; version <= 5; version++ {
		tb.inTx(t, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `
				INSERT INTO postbox.endpoints (name, url, headers, backoff_base, backoff_cap, max_attempts, failure_threshold)
				VALUES ('partner', $1, $2, '200 ms', '300 ms', 1000, 1000)
				ON CONFLICT (name) DO UPDATE SET url = excluded.url, headers = excluded.headers`,
				fmt.Sprintf("%s/v%d", rc.URL, version), fmt.Sprintf(`{"X-Version": "%d"}`, version))
			require.NoError(t, err)
			for range 3 {
				ids = append(ids, insertIn(t, tx, outbox.Event{Endpoint: "partner", Payload: json.RawMessage(fmt.Sprintf(`{"v": %d}`, version))}))
			}
			return nil
		})
	}
	waitUntil(t, 20*time.Second, "every event ingested and attempted", func() bool {
		var n int
		_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE attempt_count > 0`).Scan(&n)
		return n == len(ids)
	})
	// The lease goes to an instance that is gone: neither streams now.
	tb.exec(t, `UPDATE postbox.checkpoints SET leader = 'gone', fencing = fencing + 1, lease_expires_at = now() + interval '1 minute'`)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, streams.Stop(stopCtx))
	before := rc.count()
	open.Store(true)
	tb.waitSettled(t, len(ids), 30*time.Second)

	for _, id := range ids {
		d := tb.delivery(t, id)
		require.Equal(t, postboxtype.DeliveryDelivered, d.Status, "%s: %s", id, d.LastError)
	}
	for _, r := range rc.requests() {
		var p struct{ V int }
		require.NoError(t, json.Unmarshal(r.Body, &p))
		rev, err := strconv.Atoi(r.Header.Get("X-Version"))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("/v%d", rev), r.Path)
		require.GreaterOrEqual(t, rev, p.V, "event %s (after version %d) attempted under version %d", r.ID, p.V, rev)
	}
	require.Len(t, rc.requests()[before:], len(ids), "each delivered once, after the streaming instance stopped")
	var byGate int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.all_attempts WHERE instance = 'gate' AND outcome = 'delivered'`).Scan(&byGate))
	require.Equal(t, len(ids), byGate, "delivered by the instance that only the gate kept current")
}

// TestRunWarnsOfConflicts: the relay logs a warning for a name the file
// and postbox.endpoints both define when it becomes one: a row inserted
// while it runs, and a reload that adds a row's name to the file.
func TestRunWarnsOfConflicts(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "dup", rc.URL+"/file", nil)
	r := tb.start(t, relay.Options{})
	conflicts := func(name string) int {
		n := 0
		for _, line := range strings.Split(tb.logs.String(), "\n") {
			if strings.Contains(line, `"endpoint":"`+name+`"`) && strings.Contains(line, "endpoint defined both in the configuration file and in postbox.endpoints") {
				n++
			}
		}
		return n
	}
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('dup', $1), ('later', $1)`, rc.URL+"/row")
	waitUntil(t, 5*time.Second, "dup warned of", func() bool { return conflicts("dup") == 1 })
	tb.waitApplied(t, "later")
	require.Zero(t, conflicts("later"))

	tb.endpoint(t, "later", rc.URL+"/file", nil)
	require.NoError(t, r.Reload(tb.resolved(t)))
	require.Equal(t, 1, conflicts("later"))
	require.Equal(t, 1, conflicts("dup"), "once while it lasts")
}
