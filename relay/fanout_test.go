package relay_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// subscriber writes a row of postbox.endpoints for rc subscribed to
// types, with filter when not "" (migrating first if need be): the relay
// applies it from the table, as it would any application's.
func (tb *testBundle) subscriber(t *testing.T, name string, rc *receiver, enabled bool, filter string, types ...string) {
	t.Helper()
	_, err := relay.Migrate(context.Background(), tb.pool, tb.resolved(t))
	require.NoError(t, err)
	var f *string
	if filter != "" {
		f = &filter
	}
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, enabled, event_types, filter) VALUES ($1, $2, $3, $4, $5)`,
		name, rc.URL+"/"+name, enabled, types, f)
}

// received are the event ids rc received at /name, sorted.
func receivedAt(rc *receiver, name string) []string {
	var ids []string
	for _, r := range rc.requests() {
		if r.Path == "/"+name {
			ids = append(ids, r.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func sorted(ids ...string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// matchedOf is each event's endpoint and matched of eventID, as
// "endpoint=matched" (NULL for a row's own endpoint), sorted.
func (tb *testBundle) matchedOf(t *testing.T, eventID string) []string {
	t.Helper()
	rows, err := tb.pool.Query(context.Background(), `
		SELECT endpoint || '=' || coalesce(matched, 'NULL') FROM postbox.events WHERE event_id = $1 ORDER BY 1`, eventID)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestRoutesBySubscription: a row without an endpoint goes to every
// enabled endpoint subscribed to its type, by exact name or prefix and
// narrowed by a filter, once each with its own delivery and why; a row
// that matches none is a no_subscriber dead letter. A transaction of one
// event (the one-event statement, the fast path) and one of many (the
// copy) alike.
func TestRoutesBySubscription(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.subscriber(t, "exact", rc, true, "", "order.paid")
	tb.subscriber(t, "orders", rc, true, "", "order.*")
	tb.subscriber(t, "casino", rc, true, `{"brand": "casino-de"}`, "order.*")
	tb.subscriber(t, "off", rc, false, "", "order.*")
	tb.subscriber(t, "users", rc, true, "", "user.*", "order.refunded")
	tb.start(t, relay.Options{})

	paid := tb.insert(t, outbox.Event{Type: "order.paid", Payload: json.RawMessage(`{"brand": "casino-de", "amount": 5}`)})[0]
	direct := tb.insert(t, outbox.Event{Endpoint: "exact", Type: "order.paid"})[0]
	var many []outbox.Event
	for range 4 {
		many = append(many, outbox.Event{Type: "order.refunded", Payload: json.RawMessage(`{"brand": "casino-fr"}`)})
	}
	for range 4 {
		many = append(many, outbox.Event{Type: "user.made"})
	}
	many = append(many, outbox.Event{Type: "nothing.subscribes"})
	ids := tb.insert(t, many...)
	refunded, made, nobody := ids[:4], ids[4:8], ids[8]

	tb.waitSettled(t, 17, 30*time.Second)
	require.Equal(t, sorted(paid, direct), receivedAt(rc, "exact"))
	require.Equal(t, sorted(append([]string{paid}, refunded...)...), receivedAt(rc, "orders"))
	require.Equal(t, []string{paid}, receivedAt(rc, "casino"), "the filter holds only for casino-de")
	require.Empty(t, receivedAt(rc, "off"), "a disabled endpoint is not routed to")
	require.Equal(t, sorted(append(slices.Clone(refunded), made...)...), receivedAt(rc, "users"))
	require.Equal(t, 16, rc.count(), "one delivery per endpoint matched")
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: 16, postboxtype.DeliveryDeadLetter: 1}, tb.deliveries(t))

	require.Equal(t, []string{"casino=order.* + filter", "exact=order.paid", "orders=order.*"}, tb.matchedOf(t, paid))
	require.Equal(t, []string{"exact=NULL"}, tb.matchedOf(t, direct))
	require.Equal(t, []string{"orders=order.*", "users=order.refunded"}, tb.matchedOf(t, refunded[0]))
	require.Equal(t, []string{"="}, tb.matchedOf(t, nobody))
	d := tb.delivery(t, nobody)
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.True(t, strings.HasPrefix(d.LastError, "no_subscriber"), d.LastError)
	require.Zero(t, d.Attempts)

	var left int
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT count(*) FROM postbox.outbox`).Scan(&left))
	require.Zero(t, left, "outbox_retention 0: each routed row is deleted with its events")

	// A subscription applied later routes the rows that come after it,
	// and none of those before.
	tb.subscriber(t, "late", rc, true, "", "order.*")
	later := tb.insert(t, outbox.Event{Type: "order.paid"})[0]
	tb.waitSettled(t, 20, 30*time.Second)
	require.Equal(t, []string{later}, receivedAt(rc, "late"))
	require.Equal(t, []string{"exact=order.paid", "late=order.*", "orders=order.*"}, tb.matchedOf(t, later))
}

// TestRoutedRowsAreReconciledOnce: rows written before postbox started
// are routed by the reconciliation, as rows streamed after it are; a
// reconciliation owed again later reads them as ingested and routes none
// of them again, not even to an endpoint subscribed since.
func TestRoutedRowsAreReconciledOnce(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.OutboxRetention = config.Duration(time.Hour) // the rows stay to be reconciled again
	rc := newReceiver(t, nil)
	tb.subscriber(t, "a", rc, true, "", "order.*")
	tb.subscriber(t, "b", rc, true, "", "order.paid")
	ctx := context.Background()
	_, err := tb.pool.Exec(ctx, outbox.SchemaSQL(tb.resolved(t).Table))
	require.NoError(t, err)
	before := tb.insert(t, outbox.Event{Type: "order.paid"}, outbox.Event{Type: "order.paid"}, outbox.Event{Type: "user.made"})
	r := tb.start(t, relay.Options{})
	after := tb.insert(t, outbox.Event{Type: "order.paid"})
	tb.waitSettled(t, 7, 30*time.Second)
	want := sorted(before[0], before[1], after[0])
	require.Equal(t, want, receivedAt(rc, "a"))
	require.Equal(t, want, receivedAt(rc, "b"))
	require.Equal(t, []string{"="}, tb.matchedOf(t, before[2]), "no_subscriber, recorded by the reconciliation")

	// A later endpoint subscribes; a reconciliation is owed again.
	tb.subscriber(t, "late", rc, true, "", "order.*")
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	tb.exec(t, `UPDATE postbox.checkpoints SET reconcile_pending = true WHERE slot = $1`, tb.cfg.Slot)
	tb.start(t, relay.Options{})
	waitUntil(t, 20*time.Second, "the reconciliation done", func() bool { return !reconcilePending(t, tb) })
	var events, rows int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM postbox.events), (SELECT count(*) FROM postbox.outbox)`).Scan(&events, &rows))
	require.Equal(t, 7, events, "no row routed twice")
	require.Equal(t, 4, rows, "kept for outbox_retention")
	require.Empty(t, receivedAt(rc, "late"))
	require.Equal(t, 6, rc.count())
}
