package relay_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestEmittedEventsAreDelivered: with outbox_messages on, events written
// with outbox.Emit (WAL messages, no table row) are delivered like rows, in the same
// transaction as rows, and only when it commits; a message another
// program wrote under another prefix is not postbox's; a message that
// breaks the format and a payload above max_body become dead letters
// with a reason, and the stream goes on.
func TestEmittedEventsAreDelivered(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.MaxBody = 1000
	tb.cfg.OutboxMessages = true
	rc := newReceiver(t, nil)
	tb.endpoint(t, "hooks", rc.URL, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()

	var emitted, inserted string
	require.NoError(t, pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error {
		var err error
		if emitted, err = outbox.Emit(ctx, tx, outbox.Event{Endpoint: "hooks", Type: "order.paid",
			Payload: []byte(`{"order": 1, "note": "two\nlines"}`), Headers: map[string]string{"X-Tenant": "t1"}}); err != nil {
			return err
		}
		inserted, err = outbox.Insert(ctx, tx, outbox.Event{Endpoint: "hooks", Payload: []byte(`{"order": 2}`)})
		return err
	}))
	tx, err := tb.pool.Begin(ctx)
	require.NoError(t, err)
	rolledBack, err := outbox.Emit(ctx, tx, outbox.Event{Endpoint: "hooks"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = tb.pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'someone-else', 'not an event')`)
	require.NoError(t, err)
	_, err = tb.pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'postbox', 'no header line')`)
	require.NoError(t, err)
	var big string
	require.NoError(t, pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error {
		big, err = outbox.Emit(ctx, tx, outbox.Event{Endpoint: "hooks", Payload: []byte(`"` + strings.Repeat("x", 5000) + `"`)})
		return err
	}))
	after := tb.insert(t, outbox.Event{Endpoint: "hooks"})

	tb.waitSettled(t, 5, 30*time.Second)
	got := rc.byID()
	require.Equal(t, 1, got[emitted])
	require.Equal(t, 1, got[inserted])
	require.Equal(t, 1, got[after[0]])
	require.Zero(t, got[rolledBack], "a rolled-back emit is never delivered")
	require.Len(t, got, 3)
	for _, r := range rc.requests() {
		if r.ID == emitted {
			require.JSONEq(t, `{"order": 1, "note": "two\nlines"}`, string(r.Body))
			require.Equal(t, "t1", r.Header.Get("X-Tenant"))
		}
	}
	require.Equal(t, postboxtype.DeliveryDeadLetter, tb.delivery(t, big).Status)
	require.Contains(t, tb.delivery(t, big).LastError, "payload_too_large")
	rows, err := tb.pool.Query(ctx, `SELECT last_error FROM postbox.deliveries WHERE status = 'dead_letter' ORDER BY id`)
	require.NoError(t, err)
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, reasons, 2)
	require.Contains(t, reasons[0], "invalid_row: message has no header line")
	var tableRows int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events WHERE outbox_id IS NULL`).Scan(&tableRows))
	require.Equal(t, 3, tableRows, "the emitted events (and the poison message) had no outbox row")
	// PUBLIC may emit in this database, as by default: the start says so,
	// with the statements that fix it (postbox doctor fails on it).
	require.Contains(t, tb.logs.String(), "outbox_messages is on and PUBLIC may run pg_logical_emit_message")
	require.Contains(t, tb.logs.String(), "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, ")
}

// TestRepeatedEventIDIsDeliveredOnce: an application that inserts the
// same event_id again (its own idempotency) gets one delivery. The fast
// path starts an event's first attempt while the event is written, so the
// repeat may be attempted once more before the insert finds it; that
// attempt carries the same webhook-id, is not recorded, and leaves
// nothing in flight.
func TestRepeatedEventIDIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "hooks", rc.URL, nil)
	tb.start(t, relay.Options{})
	id := outbox.NewEventID()
	tb.insert(t, outbox.Event{ID: id, Endpoint: "hooks"})
	tb.waitSettled(t, 1, 30*time.Second)
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, id).Status)
	tb.insert(t, outbox.Event{ID: id, Endpoint: "hooks"})
	after := tb.insert(t, outbox.Event{Endpoint: "hooks"})
	waitUntil(t, 30*time.Second, "the event after the repeat", func() bool { return rc.byID()[after[0]] == 1 })
	tb.waitSettled(t, 2, 30*time.Second)

	var deliveries, inFlight int
	require.NoError(t, tb.pool.QueryRow(context.Background(), `
		SELECT count(*), count(*) FILTER (WHERE d.status = 'in_flight')
		FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, id).Scan(&deliveries, &inFlight))
	require.Equal(t, 1, deliveries, "one delivery for the event")
	require.Zero(t, inFlight)
	d := tb.delivery(t, id)
	require.Equal(t, postboxtype.DeliveryDelivered, d.Status)
	require.Equal(t, 1, d.Attempts, "the repeat's attempt is not recorded")
	require.Contains(t, []int{1, 2}, rc.byID()[id], "at most one more request, with the same webhook-id")
	require.Contains(t, tb.logs.String(), "event ingested before")
}

// TestForgedMessageIsNeverAttempted: with outbox_messages off (the
// default), a role created with nothing but LOGIN writes a well-formed
// outbox.Emit message for a configured endpoint. It is never attempted: it
// becomes a messages_off dead letter, the refusal is counted and the
// messages_off alert fires. A replay under a configuration with messages
// off leaves it out; one made under a configuration with messages on
// while the relay has them off is dead-lettered again at its attempt.
// Once the relay has messages on, a replay delivers it.
func TestForgedMessageIsNeverAttempted(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "partner", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	ctx := context.Background()

	role := pgtest.UniqueName("forger")
	_, err := tb.pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = tb.pool.Exec(context.Background(), `DROP ROLE `+role) })
	u, err := url.Parse(tb.dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	forger, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	defer func() { _ = forger.Close(context.Background()) }()
	msg, forged, err := outbox.EncodeMessage(outbox.Event{Endpoint: "partner", Type: "payout", Payload: []byte(`{"amount": 987654321}`)}, time.Now())
	require.NoError(t, err)
	_, err = forger.Exec(ctx, `SELECT pg_logical_emit_message(true, 'postbox', $1::bytea)`, msg)
	require.NoError(t, err, "PUBLIC may run pg_logical_emit_message: the role needs nothing more")

	// A row committed after the message: once it is delivered, the
	// message has been through the stream.
	after := tb.insert(t, outbox.Event{Endpoint: "partner"})
	waitUntil(t, 30*time.Second, "the row after the message", func() bool { return rc.byID()[after[0]] == 1 })
	tb.waitSettled(t, 2, 30*time.Second)
	d := tb.delivery(t, forged)
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.Zero(t, d.Attempts, "never attempted")
	require.True(t, strings.HasPrefix(d.LastError, "messages_off: "), d.LastError)
	require.Contains(t, d.LastError, "outbox_messages: true")
	require.Zero(t, rc.byID()[forged], "the receiver never got the forged event")
	require.Equal(t, 1.0, refusedMessages(t, r), "postbox_messages_refused_total")
	requireMessagesOffAlert(t, tb, true)
	an, err := telemetry.AnalyzeDeadLetters(ctx, tb.pool, "partner", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Len(t, an, 1)
	require.Equal(t, telemetry.PatternBadInput, an[0].Pattern)
	require.Contains(t, an[0].Advice, "set outbox_messages: true")
	require.Contains(t, tb.logs.String(), `"reason":"messages_off: `)
	require.NotContains(t, tb.logs.String(), "987654321", "no payload in the logs")

	// A replay under a configuration with messages off leaves it out.
	items, n, err := ops.Replay(ctx, tb.pool, tb.resolved(t), postboxtype.ReplayFilter{DeadLetters: true}, false, 0)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Len(t, items, 1)
	require.True(t, items[0].MessagesOff)
	require.Equal(t, postboxtype.DeliveryDeadLetter, tb.delivery(t, forged).Status)

	// A replay from a configuration with messages on (another tool's, an
	// operator's edit not yet loaded): the relay, with them off, refuses
	// it at its attempt.
	tb.cfg.OutboxMessages = true
	on := tb.resolved(t)
	_, n, err = ops.Replay(ctx, tb.pool, on, postboxtype.ReplayFilter{EventIDs: []string{forged}}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitUntil(t, 30*time.Second, "the replay refused", func() bool {
		d := tb.delivery(t, forged)
		return d.Status == postboxtype.DeliveryDeadLetter && strings.HasPrefix(d.LastError, "messages_off")
	})
	require.Zero(t, rc.byID()[forged], "still never sent")
	require.Equal(t, 2.0, refusedMessages(t, r))

	// With messages on in the relay, the replay delivers it, signed.
	require.NoError(t, r.Reload(on))
	_, n, err = ops.Replay(ctx, tb.pool, on, postboxtype.ReplayFilter{DeadLetters: true, Endpoint: "partner"}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitUntil(t, 30*time.Second, "the replayed message delivered", func() bool { return tb.delivery(t, forged).Status == postboxtype.DeliveryDelivered })
	require.Equal(t, 1, rc.byID()[forged])
	requireMessagesOffAlert(t, tb, false)
}

// refusedMessages reads postbox_messages_refused_total.
func refusedMessages(t *testing.T, r *relay.Relay) float64 {
	t.Helper()
	families, err := r.Metrics().Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "postbox_messages_refused_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no postbox_messages_refused_total")
	return 0
}

// requireMessagesOffAlert asserts whether the messages_off alert fires.
func requireMessagesOffAlert(t *testing.T, tb *testBundle, firing bool) {
	t.Helper()
	cfg := tb.resolved(t)
	s, err := telemetry.LoadQueueSummary(context.Background(), tb.pool, cfg.Slot)
	require.NoError(t, err)
	for _, a := range telemetry.Evaluate(s, nil, cfg.Alerts) {
		if a.Name == telemetry.AlertMessagesOff {
			require.Equal(t, firing, a.Firing, a.Detail)
			return
		}
	}
	t.Fatal("no messages_off alert evaluated")
}

// TestEmittedEventsAreRoutedByType: an event emitted with a type and no
// endpoint goes, as a row whose endpoint is NULL, to every enabled
// endpoint subscribed to its type, once each; one that matches none is a
// no_subscriber dead letter.
func TestEmittedEventsAreRoutedByType(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.OutboxMessages = true
	rc := newReceiver(t, nil)
	tb.subscriber(t, "exact", rc, true, "", "order.paid")
	tb.subscriber(t, "orders", rc, true, "", "order.*")
	tb.subscriber(t, "users", rc, true, "", "user.*")
	tb.start(t, relay.Options{})
	ctx := context.Background()
	var paid, nobody string
	require.NoError(t, pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error {
		var err error
		if paid, err = outbox.Emit(ctx, tx, outbox.Event{Type: "order.paid", Payload: []byte(`{"order": 7}`)}); err != nil {
			return err
		}
		nobody, err = outbox.Emit(ctx, tx, outbox.Event{Type: "invoice.sent"})
		return err
	}))
	tb.waitSettled(t, 3, 30*time.Second)
	require.Equal(t, []string{paid}, receivedAt(rc, "exact"))
	require.Equal(t, []string{paid}, receivedAt(rc, "orders"))
	require.Empty(t, receivedAt(rc, "users"))
	require.Equal(t, []string{"exact=order.paid", "orders=order.*"}, tb.matchedOf(t, paid))
	d := tb.delivery(t, nobody)
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.Contains(t, d.LastError, "no_subscriber")
	_, _, err := outbox.EncodeMessage(outbox.Event{}, time.Now())
	require.ErrorContains(t, err, "needs an endpoint, or a type to route it by")
}
