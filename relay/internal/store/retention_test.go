package store_test

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

const week = 7 * 24 * time.Hour

// ingested is an event ingest wrote, with its first delivery.
type ingested struct {
	eventID    string
	eventPK    int64
	deliveryID int64
}

// ingest writes one pending event for endpoint per id ("" for a new id).
func ingest(t *testing.T, s *store.Store, endpoint string, ids ...string) []ingested {
	t.Helper()
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	defer ic.Release()
	evs := make([]store.NewEvent, len(ids))
	for i, id := range ids {
		if id == "" {
			id = outbox.NewEventID()
		}
		evs[i] = store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: endpoint, Payload: []byte(`{}`), CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
			Status:    postboxtype.DeliveryPending,
		}
	}
	got, err := ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	require.Len(t, got, len(evs))
	out := make([]ingested, len(evs))
	for _, g := range got {
		out[g.Index] = ingested{eventID: evs[g.Index].EventID, eventPK: g.EventPK, deliveryID: g.DeliveryID}
	}
	return out
}

// set gives a delivery a status, as if it were finished (or not) long ago
// (age) or just now (age 0).
func set(t *testing.T, s *store.Store, deliveryID int64, status postboxtype.DeliveryState, age time.Duration) {
	t.Helper()
	_, err := s.Pool.Exec(context.Background(), `
		UPDATE postbox.deliveries SET status = $2,
		  lease_owner = CASE WHEN $2 = 'in_flight' THEN 'me' END,
		  delivered_at = CASE WHEN $2 = 'delivered' THEN now() - $3 * interval '1 second' END,
		  created_at = now() - $3 * interval '1 second', updated_at = now() - $3 * interval '1 second',
		  next_attempt_at = now() - $3 * interval '1 second'
		WHERE id = $1`, deliveryID, status, age.Seconds())
	require.NoError(t, err)
}

// replayDelivery adds a delivery of an event that replays deliveryID.
func replayDelivery(t *testing.T, s *store.Store, ev ingested, status postboxtype.DeliveryState, age time.Duration) int64 {
	t.Helper()
	var id int64
	require.NoError(t, s.Pool.QueryRow(context.Background(), `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, replay_of)
		SELECT event_pk, endpoint, 'pending', id FROM postbox.deliveries WHERE id = $1 RETURNING id`, ev.deliveryID).Scan(&id))
	set(t, s, id, status, age)
	return id
}

func ageEvents(t *testing.T, s *store.Store, age time.Duration, evs ...ingested) {
	t.Helper()
	pks := make([]int64, len(evs))
	for i, e := range evs {
		pks[i] = e.eventPK
	}
	_, err := s.Pool.Exec(context.Background(), `UPDATE postbox.events SET ingested_at = now() - $2 * interval '1 second' WHERE id = ANY($1)`, pks, age.Seconds())
	require.NoError(t, err)
}

func exists(t *testing.T, s *store.Store, table string, id int64) bool {
	t.Helper()
	var ok bool
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM postbox.`+table+` WHERE id = $1)`, id).Scan(&ok))
	return ok
}

// TestPurgeEventsKeepsEventsWithALiveDelivery: past event_retention an
// event goes with its finished deliveries, unless a delivery of it is
// still pending, in flight or awaiting a retry; an event kept for less
// than the retention stays whatever its state.
func TestPurgeEventsKeepsEventsWithALiveDelivery(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	evs := ingest(t, s, "ep", "", "", "", "", "", "", "", "")
	// In ingest order, as events are numbered: the young one last.
	slices.SortFunc(evs, func(a, b ingested) int { return cmp.Compare(a.eventPK, b.eventPK) })
	pending, failed, inFlight, delivered, dead, replayedLive, replayedDone, young := evs[0], evs[1], evs[2], evs[3], evs[4], evs[5], evs[6], evs[7]
	old := 8 * 24 * time.Hour
	ageEvents(t, s, old, evs[:7]...)
	set(t, s, pending.deliveryID, postboxtype.DeliveryPending, old)
	set(t, s, failed.deliveryID, postboxtype.DeliveryFailed, old)
	set(t, s, inFlight.deliveryID, postboxtype.DeliveryInFlight, old)
	set(t, s, delivered.deliveryID, postboxtype.DeliveryDelivered, old)
	set(t, s, dead.deliveryID, postboxtype.DeliveryDeadLetter, old)
	// Dead letters an operator replayed: one replay still waiting, one done.
	set(t, s, replayedLive.deliveryID, postboxtype.DeliveryReplayed, old)
	liveReplay := replayDelivery(t, s, replayedLive, postboxtype.DeliveryFailed, old)
	set(t, s, replayedDone.deliveryID, postboxtype.DeliveryReplayed, old)
	doneReplay := replayDelivery(t, s, replayedDone, postboxtype.DeliveryDelivered, old)
	set(t, s, young.deliveryID, postboxtype.DeliveryDelivered, old) // its event is young

	n, err := s.PurgeEvents(ctx, week)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the old events whose deliveries are all finished")
	for _, e := range []ingested{delivered, dead, replayedDone} {
		require.False(t, exists(t, s, "events", e.eventPK), "event %s is past retention and finished", e.eventID)
		require.False(t, exists(t, s, "deliveries", e.deliveryID), "its deliveries go with it")
	}
	require.False(t, exists(t, s, "deliveries", doneReplay))
	for _, e := range []ingested{pending, failed, inFlight, replayedLive, young} {
		require.True(t, exists(t, s, "events", e.eventPK), "event %s has a live delivery or is young", e.eventID)
		require.True(t, exists(t, s, "deliveries", e.deliveryID))
	}
	require.True(t, exists(t, s, "deliveries", liveReplay), "a replay waiting for its retry keeps its event")

	// Past retention an event can no longer be replayed; a kept one can.
	items, _, err := s.Replay(ctx, postboxtype.ReplayFilter{EventIDs: []string{delivered.eventID, young.eventID}}, true, 0)
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.Equal(t, young.eventID, items[0].EventID)

	n, err = s.PurgeEvents(ctx, week)
	require.NoError(t, err)
	require.Zero(t, n, "a second purge finds nothing")
}

// TestPurgeDeliveriesKeepsUnfinishedOnes: past delivery_retention
// delivered, dead-lettered and replayed deliveries go, by when they
// finished; pending, failed and in-flight ones stay however old, and so do
// the events.
func TestPurgeDeliveriesKeepsUnfinishedOnes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	evs := ingest(t, s, "ep", "", "", "", "", "", "", "", "")
	old := 8 * 24 * time.Hour
	gone := map[postboxtype.DeliveryState]ingested{
		postboxtype.DeliveryDelivered: evs[0], postboxtype.DeliveryDeadLetter: evs[1], postboxtype.DeliveryReplayed: evs[2],
	}
	kept := map[postboxtype.DeliveryState]ingested{
		postboxtype.DeliveryPending: evs[3], postboxtype.DeliveryFailed: evs[4], postboxtype.DeliveryInFlight: evs[5],
	}
	for status, e := range gone {
		set(t, s, e.deliveryID, status, old)
	}
	for status, e := range kept {
		set(t, s, e.deliveryID, status, old)
	}
	youngDelivered, youngDead := evs[6], evs[7]
	set(t, s, youngDelivered.deliveryID, postboxtype.DeliveryDelivered, time.Hour)
	set(t, s, youngDead.deliveryID, postboxtype.DeliveryDeadLetter, time.Hour)

	n, err := s.PurgeDeliveries(ctx, week)
	require.NoError(t, err)
	require.EqualValues(t, len(gone), n)
	for status, e := range gone {
		require.False(t, exists(t, s, "deliveries", e.deliveryID), "an old %s delivery goes", status)
	}
	for status, e := range kept {
		require.True(t, exists(t, s, "deliveries", e.deliveryID), "an old %s delivery is not finished: it stays", status)
	}
	require.True(t, exists(t, s, "deliveries", youngDelivered.deliveryID))
	require.True(t, exists(t, s, "deliveries", youngDead.deliveryID))
	for _, e := range evs {
		require.True(t, exists(t, s, "events", e.eventPK), "events have their own retention")
	}
}

// TestPurgePortalReplaysFollowTheirDeliveries: a partner's resend note
// goes with its delivery, never before.
func TestPurgePortalReplaysFollowTheirDeliveries(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	evs := ingest(t, s, "ep", "", "")
	for _, e := range evs {
		_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.portal_replays (delivery_id, endpoint, link_id) VALUES ($1, 'ep', 'l1')`, e.deliveryID)
		require.NoError(t, err)
	}
	set(t, s, evs[0].deliveryID, postboxtype.DeliveryDelivered, 8*24*time.Hour)
	_, err := s.PurgeDeliveries(ctx, week)
	require.NoError(t, err)
	n, err := s.PurgePortalReplays(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var left []int64
	require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT delivery_id FROM postbox.portal_replays`)
		if err != nil {
			return err
		}
		left, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	}))
	require.Equal(t, []int64{evs[1].deliveryID}, left, "the note of a delivery still kept stays")
}

// TestPurgeIngestedOutboxKeepsWhatIsNotIngested: outbox rows older than
// outbox_retention go once they are ingested (their event id and endpoint
// are in postbox.events); a row not ingested stays for reconciliation,
// however old.
func TestPurgeIngestedOutboxKeepsWhatIsNotIngested(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	row := func(endpoint, age string) (id int64, eventID string) {
		require.NoError(t, s.Pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, created_at) VALUES ($1, now() - $2::interval)
			RETURNING id, event_id::text`, endpoint, age).Scan(&id, &eventID))
		return id, eventID
	}
	oldIngested, oldIngestedEvent := row("ep", "2 hours")
	young, youngEvent := row("ep", "0 seconds")
	oldNotIngested, _ := row("ep", "2 hours")
	otherEndpoint, otherEndpointEvent := row("other", "2 hours")
	ingest(t, s, "ep", oldIngestedEvent, youngEvent, otherEndpointEvent) // the last under another endpoint

	n, next, err := s.PurgeIngestedOutbox(ctx, time.Hour, 0, 100, store.OutboxHorizon{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, next, "the window reached the end of the table: the next purge starts over")
	left := map[int64]bool{}
	rows, err := s.Pool.Query(ctx, `SELECT id FROM postbox.outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		left[id] = true
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[int64]bool{young: true, oldNotIngested: true, otherEndpoint: true}, left,
		"gone: only the old row that is ingested (%d)", oldIngested)
}

// TestPurgeIngestedOutboxStepsOverWhatItKeeps: the purge looks at a
// window of rows at a time, in the order of their ids; old rows that are
// not ingested, however many, do not hold it back from the ingested rows
// after them, and it starts over from the first row once a window reaches
// a row younger than the retention.
func TestPurgeIngestedOutboxStepsOverWhatItKeeps(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	row := func(age string) (id int64, eventID string) {
		require.NoError(t, s.Pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, created_at) VALUES ('ep', now() - $1::interval)
			RETURNING id, event_id::text`, age).Scan(&id, &eventID))
		return id, eventID
	}
	var kept []int64
	for range 3 { // old, never ingested: left for reconciliation
		id, _ := row("2 hours")
		kept = append(kept, id)
	}
	first, firstEvent := row("2 hours")
	second, secondEvent := row("2 hours")
	young, youngEvent := row("0 seconds")
	kept = append(kept, young)
	ingest(t, s, "ep", firstEvent, secondEvent, youngEvent)

	var steps []int64
	var purged int64
	after := int64(0)
	for range 3 {
		n, next, err := s.PurgeIngestedOutbox(ctx, time.Hour, after, 2, store.OutboxHorizon{})
		require.NoError(t, err)
		purged += n
		steps = append(steps, next)
		after = next
	}
	require.EqualValues(t, 2, purged)
	require.Equal(t, []int64{kept[1], first, 0}, steps,
		"over the first two kept rows, then the third and the first ingested one, then to the young row and back to the start")
	rows, err := s.Pool.Query(ctx, `SELECT id FROM postbox.outbox ORDER BY id`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, kept, left, "gone: the ingested rows %d and %d", first, second)
}

// TestPurgeIngestedOutboxProvesByHorizon: an old outbox row whose event
// is already purged (event_retention no longer than outbox_retention)
// goes once a horizon taken after its commit is proven ingested by the
// checkpoint, and only then: not before the checkpoint passes it, not
// while a reconciliation is owed, not on another server; and a row whose
// transaction was still open when the horizon was taken stays.
func TestPurgeIngestedOutboxProvesByHorizon(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	row := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (id int64) {
		require.NoError(t, q.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, created_at) VALUES ('ep', now() - interval '2 hours')
			RETURNING id`).Scan(&id))
		return id
	}
	committed := row(s.Pool)
	var committedXID uint64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text::int8`).Scan(&committedXID)) // after the row's
	open, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	stillOpen := row(open)
	_, err = s.Pool.Exec(ctx, `INSERT INTO postbox.checkpoints (slot, lsn, system_id, timeline) VALUES ($1, '0/1', 'sys', 1)`, s.Slot)
	require.NoError(t, err)
	// The horizon is the cluster's: a transaction of another test's
	// database still open holds it back, so it is taken again until it
	// is past the row.
	var h store.OutboxHorizon
	require.Eventually(t, func() bool {
		h, err = s.OutboxHorizon(ctx)
		require.NoError(t, err)
		return h.XID > committedXID
	}, 20*time.Second, 20*time.Millisecond)
	require.NoError(t, open.Commit(ctx))
	after := row(s.Pool) // written after the horizon

	left := func() []int64 {
		rows, err := s.Pool.Query(ctx, `SELECT id FROM postbox.outbox ORDER BY id`)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return ids
	}
	purge := func(h store.OutboxHorizon) {
		_, _, err := s.PurgeIngestedOutbox(ctx, time.Hour, 0, 100, h)
		require.NoError(t, err)
	}
	checkpoint := func(lsn, system string, pending bool) {
		_, err := s.Pool.Exec(ctx, `UPDATE postbox.checkpoints SET lsn = $2::pg_lsn, system_id = $3, reconcile_pending = $4 WHERE slot = $1`,
			s.Slot, lsn, system, pending)
		require.NoError(t, err)
	}
	all := []int64{committed, stillOpen, after}

	purge(store.OutboxHorizon{})
	require.Equal(t, all, left(), "no horizon: nothing is proven")
	purge(h)
	require.Equal(t, all, left(), "the checkpoint is not yet at the horizon")
	past := (h.LSN + 1).String()
	checkpoint(past, "sys", true)
	purge(h)
	require.Equal(t, all, left(), "a reconciliation is owed")
	checkpoint(past, "another", false)
	purge(h)
	require.Equal(t, all, left(), "the checkpoint is another server's")
	checkpoint(past, "sys", false)
	purge(h)
	require.Equal(t, []int64{stillOpen, after}, left(), "only the row committed before the horizon goes")
}

// TestPurgeIngestedOutboxReadsOnlyItsWindow: however many rows the outbox
// holds, the purge reads its window of them through the primary key, not
// the whole table.
func TestPurgeIngestedOutboxReadsOnlyItsWindow(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO postbox.outbox (endpoint, created_at) SELECT 'ep', now() - interval '2 hours' FROM generate_series(1, 20000);
		ANALYZE postbox.outbox`)
	require.NoError(t, err)
	tx, err := s.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+store.PurgeOutboxSQL(`"postbox"."outbox"`),
		time.Hour.Seconds(), 0, 100, nil, "0/0", nil, nil, s.Slot)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	text := strings.Join(plan, "\n")
	require.NotContains(t, text, "Seq Scan on outbox", text)
	require.Regexp(t, `Index Scan using outbox_pkey on outbox o \(actual rows=100(\.00)? loops=1\)`, text) // 18: rows=100.00
}

// TestPurgeAttemptsAndHistograms: attempts older than their retention and
// histogram bins older than the window go; the newer stay.
func TestPurgeAttemptsAndHistograms(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.attempts (endpoint, duration_ms, outcome, started_at)
		VALUES ('ep', 12, 'delivered', now() - interval '25 hours'), ('ep', 15, 'delivered', now())`)
	require.NoError(t, err)
	count := func(sql string) int {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	require.Equal(t, 2, count(`SELECT count(*) FROM postbox.latency_histogram`), "one bin each")

	n, err := s.PurgeAttempts(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, count(`SELECT count(*) FROM postbox.attempts WHERE started_at > now() - interval '1 hour'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM postbox.attempts`))

	n, err = s.PurgeHistograms(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, count(`SELECT count(*) FROM postbox.latency_histogram WHERE bin > now() - interval '1 hour'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM postbox.latency_histogram`))
}

// TestPurgeIdleLanesKeepsBusyAndNamedOnes: a row URL's lane that nothing
// changed for the retention and that has nothing queued or in flight
// loses its health and rate rows; a lane with a queued delivery, one used
// recently, and an endpoint's own row (a bare name) keep theirs.
func TestPurgeIdleLanesKeepsBusyAndNamedOnes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const sep = " → "
	idle, queued, inFlight, recent, named := "rows"+sep+"idle.example:443", "rows"+sep+"queued.example:443",
		"rows"+sep+"busy.example:443", "rows"+sep+"recent.example:443", "shop"
	old := 8 * 24 * time.Hour
	for _, h := range []struct {
		lane string
		age  time.Duration
	}{{idle, old}, {queued, old}, {inFlight, old}, {recent, time.Hour}, {named, old}} {
		_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, last_success_at, last_failure_at)
			VALUES ($1, now() - $2 * interval '1 second', now() - $2 * interval '1 second' - interval '1 hour')`, h.lane, h.age.Seconds())
		require.NoError(t, err)
		_, err = s.Pool.Exec(ctx, `INSERT INTO postbox.rate_buckets (endpoint, tokens, updated_at) VALUES ($1, 1, now() - $2 * interval '1 second')`,
			h.lane, h.age.Seconds())
		require.NoError(t, err)
	}
	evs := ingest(t, s, "rows", "", "")
	for i, lane := range []string{queued, inFlight} {
		_, err := s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET lane = $2 WHERE id = $1`, evs[i].deliveryID, lane)
		require.NoError(t, err)
	}
	set(t, s, evs[0].deliveryID, postboxtype.DeliveryFailed, old)
	set(t, s, evs[1].deliveryID, postboxtype.DeliveryInFlight, old)

	n, err := s.PurgeIdleLanes(ctx, week, sep)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "the idle lane's health and rate rows")
	left := func(table string) []string {
		rows, err := s.Pool.Query(ctx, `SELECT endpoint FROM postbox.`+table+` ORDER BY endpoint`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	want := []string{queued, inFlight, recent, named}
	slices.Sort(want)
	require.Equal(t, want, left("endpoint_health"))
	require.Equal(t, want, left("rate_buckets"))

	// Once the queued one is delivered, its lane goes too.
	set(t, s, evs[0].deliveryID, postboxtype.DeliveryDelivered, old)
	n, err = s.PurgeIdleLanes(ctx, week, sep)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "its health and rate rows")
	require.NotContains(t, left("endpoint_health"), queued)
	require.NotContains(t, left("rate_buckets"), queued)
}

// TestPurgeEndpointTombstonesAfterTheirRetention: a deleted endpoint's
// tombstone stays in endpoint_state until it is older than the
// retention, then goes; an applied row of the same age stays, and so does
// a tombstone the stream wrote again since (the endpoint recreated, then
// deleted again).
func TestPurgeEndpointTombstonesAfterTheirRetention(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO postbox.endpoint_state (name, row, revision, lsn, written_at) VALUES
		  ('old-gone', 'null', 1, '0/10', now() - interval '25 hours'),
		  ('new-gone', 'null', 2, '0/20', now() - interval '23 hours'),
		  ('live', '{"name": "live", "url": "https://l.example/"}', 3, '0/10', now() - interval '25 hours'),
		  ('back', 'null', 4, '0/10', now() - interval '25 hours')`)
	require.NoError(t, err)
	// 'back' is recreated and deleted again by the stream: its new
	// tombstone is as young as its delete.
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	require.NoError(t, ic.WriteEndpoints(ctx, []store.EndpointWrite{
		{Name: "back", Row: []byte(`{"name": "back", "url": "https://b.example/"}`), Revision: 5, LSN: 0x30},
		{Name: "back", Revision: 5, LSN: 0x40},
	}, []bool{true, false}))
	require.NoError(t, ic.Commit(ctx, 0, false))
	ic.Release()
	names := func() []string {
		rows, err := s.Pool.Query(ctx, `SELECT name FROM postbox.endpoint_state ORDER BY name`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}

	n, err := s.PurgeEndpointTombstones(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"back", "live", "new-gone"}, names(), "the young tombstone is kept")

	_, err = s.Pool.Exec(ctx, `UPDATE postbox.endpoint_state SET written_at = now() - interval '25 hours' WHERE name = 'new-gone'`)
	require.NoError(t, err)
	n, err = s.PurgeEndpointTombstones(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"back", "live"}, names())
}
