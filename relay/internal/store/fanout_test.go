package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestRoutedRowsAreIngestedOnceAndPurged: an outbox row without an
// endpoint is ingested once any event it was routed to exists (its
// no_subscriber record too), by the copy and by the statement alike: the
// reconciliation reads it no more and the purge deletes it; a routed row
// whose event_id only a directly addressed event shares is not ingested.
func TestRoutedRowsAreIngestedOnceAndPurged(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	row := func(eventType string) (id int64, eventID string) {
		require.NoError(t, s.Pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, event_type, created_at) VALUES (NULL, $1, now() - interval '2 hours')
			RETURNING id, event_id::text`, eventType).Scan(&id, &eventID))
		return id, eventID
	}
	fanned, fannedEvent := row("order.paid")
	waiting, _ := row("order.paid")
	nobody, nobodyEvent := row("nothing.subscribes")
	shared, sharedEvent := row("order.paid")
	direct, directEvent := int64(0), ""
	require.NoError(t, s.Pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, event_type, created_at) VALUES ('ep', 'order.paid', now() - interval '2 hours')
		RETURNING id, event_id::text`).Scan(&direct, &directEvent))

	routed := func(id int64, eventID, endpoint, why string) store.NewEvent {
		return store.NewEvent{OutboxRow: store.OutboxRow{
			Event:  state.Event{EventID: eventID, Endpoint: endpoint, EventType: "order.paid", Payload: []byte(`{}`)},
			Fanout: true, Routed: true, Matched: why, OutboxID: id,
		}, Status: postboxtype.DeliveryPending}
	}
	ic := ingestConn(t, s)
	var evs []store.NewEvent
	for i := range 8 { // copied (copyEventsMin)
		evs = append(evs, routed(fanned, fannedEvent, fmt.Sprintf("sub-%d", i), "order.*"))
	}
	got, err := ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.Len(t, got, 8)
	none := routed(nobody, nobodyEvent, "", "")
	none.Status, none.LastError = postboxtype.DeliveryDeadLetter, "no_subscriber"
	got, err = ic.Insert(ctx, []store.NewEvent{none}, false) // the statement of one event
	require.NoError(t, err)
	require.Len(t, got, 1)
	// Another event, addressed, under the shared row's event id.
	got, err = ic.Insert(ctx, []store.NewEvent{{OutboxRow: store.OutboxRow{Event: state.Event{EventID: sharedEvent, Endpoint: "ep", Payload: []byte(`{}`)}},
		Status: postboxtype.DeliveryPending}, {OutboxRow: store.OutboxRow{Event: state.Event{EventID: directEvent, Endpoint: "ep", Payload: []byte(`{}`)}},
		Status: postboxtype.DeliveryPending}}, false)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.NoError(t, ic.Commit(ctx, 0, true))

	rows, err := s.Pool.Query(ctx, `SELECT endpoint || '=' || coalesce(matched, 'NULL') FROM postbox.events WHERE event_id = ANY($1::uuid[]) ORDER BY 1`,
		[]string{fannedEvent, nobodyEvent, directEvent})
	require.NoError(t, err)
	matched, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"=", "ep=NULL", "sub-0=order.*", "sub-1=order.*", "sub-2=order.*", "sub-3=order.*",
		"sub-4=order.*", "sub-5=order.*", "sub-6=order.*", "sub-7=order.*"}, matched)

	left, err := s.UningestedOutbox(ctx, 0, 100, "", 1<<20)
	require.NoError(t, err)
	var ids []int64
	for _, r := range left {
		require.True(t, r.Fanout)
		require.Empty(t, r.Invalid)
		require.Empty(t, r.Endpoint)
		ids = append(ids, r.OutboxID)
	}
	require.Equal(t, []int64{waiting, shared}, ids, "each ingested row is read no more; the one sharing an addressed event's id is not ingested")

	n, _, err := s.PurgeIngestedOutbox(ctx, time.Hour, 0, 100, store.OutboxHorizon{})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	rows, err = s.Pool.Query(ctx, `SELECT id FROM postbox.outbox ORDER BY id`)
	require.NoError(t, err)
	kept, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{waiting, shared}, kept, "gone: the routed row %d, its no_subscriber row %d and the addressed row %d", fanned, nobody, direct)
}

// TestReplayRoutesANoSubscriberRowAgain: replaying a row routed to no
// endpoint routes it again under postbox.endpoints as it is now (exact,
// prefix, filter by @>, enabled only), one event and pending delivery per
// endpoint matched, with why, and supersedes its dead letter; a second
// replay adds nothing, and a row still matched by none stays a dead letter.
func TestReplayRoutesANoSubscriberRowAgain(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ic := ingestConn(t, s)
	none := func(eventType string) string {
		id := outbox.NewEventID()
		_, err := ic.Insert(ctx, []store.NewEvent{{OutboxRow: store.OutboxRow{
			Event:  state.Event{EventID: id, EventType: eventType, Payload: []byte(`{"brand": "casino-de"}`)},
			Fanout: true, Routed: true,
		}, Status: postboxtype.DeliveryDeadLetter, LastError: "no_subscriber: none"}}, false)
		require.NoError(t, err)
		return id
	}
	paid, other := none("order.paid"), none("user.made")
	require.NoError(t, ic.Commit(ctx, 0, true))
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoints (name, url, event_types, filter, enabled) VALUES
		('orders', 'http://127.0.0.1:1/', '{order.*}', NULL, true),
		('casino', 'http://127.0.0.1:1/', '{order.paid}', '{"brand": "casino-de"}', true),
		('elsewhere', 'http://127.0.0.1:1/', '{order.paid}', '{"brand": "casino-fr"}', true),
		('all', 'http://127.0.0.1:1/', '{*}', NULL, false),
		('order', 'http://127.0.0.1:1/', '{order}', NULL, true)`)
	require.NoError(t, err)

	items, enqueued, err := s.Replay(ctx, postboxtype.ReplayFilter{DeadLetters: true}, false, 0)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, 2, enqueued)
	rows, err := s.Pool.Query(ctx, `
		SELECT e.endpoint || '=' || coalesce(e.matched, 'NULL') || ':' || d.status FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id
		WHERE e.event_id = $1 ORDER BY 1`, paid)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"=:replayed", "casino=order.paid + filter:pending", "orders=order.*:pending"}, got)

	var status string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT d.status FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, other).Scan(&status))
	require.Equal(t, "dead_letter", status, "still no subscriber")

	_, enqueued, err = s.Replay(ctx, postboxtype.ReplayFilter{EventIDs: []string{paid}}, false, 0)
	require.NoError(t, err)
	require.Zero(t, enqueued, "its deliveries wait already")
}
