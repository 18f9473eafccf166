package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// ingestConn is an ingest connection for instance "me", released when the
// test ends.
func ingestConn(t testing.TB, s *store.Store) *store.IngestConn {
	t.Helper()
	ic, err := s.AcquireIngest(context.Background(), "me")
	require.NoError(t, err)
	t.Cleanup(ic.Release)
	return ic
}

// ingestInFlight ingests n events for endpoint with their deliveries in
// flight for "me", as the fast path writes them, and returns what the
// insert returned.
func ingestInFlight(t testing.TB, s *store.Store, endpoint string, n int) []store.Ingested {
	t.Helper()
	ctx := context.Background()
	ic := ingestConn(t, s)
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: endpoint, Payload: []byte(`{}`), CreatedAt: time.Now()}},
			Status:    postboxtype.DeliveryInFlight,
		}
	}
	ingested, err := ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	return ingested
}

// queueLane ingests n pending deliveries for endpoint in lane.
func queueLane(t testing.TB, s *store.Store, endpoint, lane string, n int) {
	t.Helper()
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	defer ic.Release()
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: endpoint, URL: "http://x/", Payload: []byte(`{}`)}},
			Lane:      lane,
			Status:    postboxtype.DeliveryPending,
		}
	}
	_, err = ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
}

func countLanes(claimed []store.Claimed) map[string]int {
	out := map[string]int{}
	for _, c := range claimed {
		out[c.Key()]++
	}
	return out
}

// TestLanesAreClaimedAndHeldApart: the deliveries of one endpoint to its
// rows' hosts are claimed per lane, each up to the endpoint's cap; an open
// breaker holds only its own lane, and its probe is one of that lane's
// deliveries; a pause of the endpoint holds every lane.
func TestLanesAreClaimedAndHeldApart(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const a, b = "partners → a.test:8080", "partners → b.test"
	queueLane(t, s, "partners", a, 5)
	queueLane(t, s, "partners", b, 5)
	queueLane(t, s, "partners", "", 5)
	var stored int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE lane IS NULL`).Scan(&stored))
	require.Equal(t, 5, stored, "the endpoint's own lane stores nothing")

	caps := map[string]int{"partners": 2}
	claimed, err := s.Claim(ctx, "me", 10, nil, caps, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{a: 2, b: 2, "partners": 2}, countLanes(claimed), "each lane up to the endpoint's cap")
	for _, c := range claimed {
		require.Equal(t, "partners", c.Endpoint)
	}
	claimed, err = s.Claim(ctx, "me", 10, map[string]int{a: 0, b: 1}, caps, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{b: 1, "partners": 2}, countLanes(claimed), "a lane's own free room first")

	// Lane a's breaker opens: a waits, b and the endpoint's own go on.
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, opened_at, cooldown_seconds)
		VALUES ($1, 'open', 5, now() - interval '1 hour', 1)`, a)
	require.NoError(t, err)
	claimed, err = s.Claim(ctx, "me", 10, nil, caps, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{b: 2, "partners": 1}, countLanes(claimed))

	probes, err := s.ClaimProbes(ctx, "me", []store.ProbeCandidate{{Endpoint: a}})
	require.NoError(t, err)
	require.Equal(t, map[string]int{a: 1}, countLanes(probes), "one probe, from the lane whose breaker it tests")
	var st postboxtype.BreakerState
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT state FROM postbox.endpoint_health WHERE endpoint = $1`, a).Scan(&st))
	require.Equal(t, postboxtype.BreakerHalfOpen, st)

	// Everything back in the queue; a pause of the endpoint holds all of
	// its lanes, and resuming it frees them.
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'pending', lease_owner = NULL WHERE status = 'in_flight'`)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `DELETE FROM postbox.endpoint_health`)
	require.NoError(t, err)
	require.NoError(t, s.Pause(ctx, "partners", time.Now().Add(time.Hour)))
	claimed, err = s.Claim(ctx, "me", 10, nil, caps, 100, nil)
	require.NoError(t, err)
	require.Empty(t, claimed)
	require.NoError(t, s.Resume(ctx, "partners"))
	claimed, err = s.Claim(ctx, "me", 10, nil, caps, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{a: 2, b: 2, "partners": 2}, countLanes(claimed))
}

// TestOpenBreakersAreParked: the queued deliveries of a lane whose breaker
// is open are parked out of the claim's indexes; the probe still finds
// one; once the breaker closes, Unpark makes every one due again and the
// claim takes them, none lost.
func TestOpenBreakersAreParked(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const dead = "partners → dead.test"
	queueLane(t, s, "partners", dead, 30)
	queueLane(t, s, "partners", "partners → live.test", 3)
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, opened_at, cooldown_seconds)
		VALUES ($1, 'open', 5, now() - interval '1 hour', 1)`, dead)
	require.NoError(t, err)
	parkedRows := func() int {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE next_attempt_at = 'infinity' AND status IN ('pending', 'failed')`).Scan(&n))
		return n
	}

	n, err := s.Park(ctx, 20)
	require.NoError(t, err)
	require.EqualValues(t, 20, n, "a batch at a time")
	n, err = s.Park(ctx, 20)
	require.NoError(t, err)
	require.EqualValues(t, 10, n)
	require.Equal(t, 30, parkedRows(), "only the open breaker's lane")
	n, err = s.Unpark(ctx, nil, 100, true)
	require.NoError(t, err)
	require.Zero(t, n, "its breaker is still open")

	claimed, err := s.Claim(ctx, "me", 10, nil, nil, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"partners → live.test": 3}, countLanes(claimed))
	probes, err := s.ClaimProbes(ctx, "me", []store.ProbeCandidate{{Endpoint: dead}})
	require.NoError(t, err)
	require.Equal(t, map[string]int{dead: 1}, countLanes(probes), "the probe finds a parked delivery")

	// The probe succeeds and the breaker closes.
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'delivered', lease_owner = NULL WHERE id = $1`, probes[0].DeliveryID)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.endpoint_health SET state = 'closed' WHERE endpoint = $1`, dead)
	require.NoError(t, err)
	n, err = s.Unpark(ctx, nil, 10, false) // the sweep's: every closed lane
	require.NoError(t, err)
	require.EqualValues(t, 10, n)
	n, err = s.Unpark(ctx, []string{dead}, 100, false) // the closing instance's
	require.NoError(t, err)
	require.EqualValues(t, 19, n)
	require.Zero(t, parkedRows())
	claimed, err = s.Claim(ctx, "me", 100, nil, nil, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{dead: 29}, countLanes(claimed), "every parked delivery, due at once")

	// A parked lane whose health row an operator deleted has no breaker
	// left: the sweep's look at every parked lane finds it.
	const gone = "partners → gone.test"
	queueLane(t, s, "partners", gone, 4)
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, opened_at, cooldown_seconds)
		VALUES ($1, 'open', 5, now(), 3600)`, gone)
	require.NoError(t, err)
	n, err = s.Park(ctx, 100)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	_, err = s.Pool.Exec(ctx, `DELETE FROM postbox.endpoint_health WHERE endpoint = $1`, gone)
	require.NoError(t, err)
	n, err = s.Unpark(ctx, nil, 100, false)
	require.NoError(t, err)
	require.Zero(t, n, "no closed health row names it")
	n, err = s.Unpark(ctx, nil, 100, true)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	require.Zero(t, parkedRows())
}

// TestOneEventInsertsAsMany: the single-event insert (a live
// transaction's) writes what the many-event one writes: the event with
// its search fields, its delivery's lane, status and owner; and an event
// ingested before is not written again.
func TestOneEventInsertsAsMany(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ic := ingestConn(t, s)
	ic.SetSearchKeys([]string{"click_id"})
	ev := func(id string) store.NewEvent {
		return store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: "partners", URL: "http://a.test/pb", EventType: "conversion", Payload: []byte(`{"click_id":"c1"}`), Headers: []byte(`{"X-A":"1"}`)}},
			Lane:      "partners → a.test",
			Status:    postboxtype.DeliveryInFlight,
		}
	}
	one, many := outbox.NewEventID(), outbox.NewEventID()
	got, err := ic.Insert(ctx, []store.NewEvent{ev(one)}, false)
	require.NoError(t, err)
	require.Len(t, got, 1)
	got, err = ic.Insert(ctx, []store.NewEvent{ev(many), ev(outbox.NewEventID())}, false)
	require.NoError(t, err)
	require.Len(t, got, 2)
	got, err = ic.Insert(ctx, []store.NewEvent{ev(one)}, false)
	require.NoError(t, err)
	require.Empty(t, got, "ingested before")
	require.NoError(t, ic.Commit(ctx, 0, false))

	row := func(id string) string {
		var out string
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT concat_ws(' | ', e.endpoint, e.url, e.event_type, e.payload::text, e.headers::text, e.search::text,
			                 d.endpoint, d.lane, d.status, d.lease_owner)
			FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id WHERE e.event_id = $1`, id).Scan(&out))
		return out
	}
	require.Equal(t, row(many), row(one))
	var n int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, one).Scan(&n))
	require.Equal(t, 1, n)
}

// TestDeliveredInsertsAlikeAloneAndAmongOthers: a delivery whose first
// attempt delivered before the insert (NewEvent.Delivered) is written
// delivered, with its attempt kept on it (postbox.all_attempts shows it,
// postbox.attempts has no row), whether alone (the single-event
// statement) or beside deliveries still to be made (the many-event one,
// which writes those as before); its latency is left to the recorder.
func TestDeliveredInsertsAlikeAloneAndAmongOthers(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ic := ingestConn(t, s)
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	done := func(id string) store.NewEvent {
		return store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: "partners", Payload: []byte(`{}`)}},
			Status:    postboxtype.DeliveryDelivered,
			Delivered: &state.Result{Status: postboxtype.DeliveryDelivered, StatusCode: 202, ResponseMS: 1.5, Response: "ok", At: at,
				CommitToDeliveryMS: 4, Target: "http://a.test/pb", Attempted: true, Sampled: true},
		}
	}
	alone, among, other := outbox.NewEventID(), outbox.NewEventID(), outbox.NewEventID()
	got, err := ic.Insert(ctx, []store.NewEvent{done(alone)}, false)
	require.NoError(t, err)
	require.Len(t, got, 1)
	got, err = ic.Insert(ctx, []store.NewEvent{
		{OutboxRow: store.OutboxRow{Event: state.Event{EventID: other, Endpoint: "partners", Payload: []byte(`{}`)}}, Status: postboxtype.DeliveryInFlight}, done(among)}, false)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.NoError(t, ic.Commit(ctx, 0, false))

	row := func(id string) string {
		var out string
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT concat_ws(' | ', d.status, d.attempt_count, d.lease_owner, d.delivered_at, d.last_status_code,
			                 d.last_response_ms, d.last_response, d.commit_to_delivery_ms, d.updated_at,
			                 (SELECT string_agg(concat_ws(' ', a.attempt, a.started_at, a.duration_ms, a.status_code, a.outcome,
			                                              a.response, a.target, a.instance), ', ')
			                  FROM postbox.all_attempts a WHERE a.delivery_id = d.id))
			FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id WHERE e.event_id = $1`, id).Scan(&out))
		return out
	}
	want := "delivered | 1 | 2026-12-04 12:00:00+00 | 202 | 1.5 | ok | 4 | 2026-12-04 12:00:00+00 | " +
		"1 2026-12-04 11:59:59.9985+00 1.5 202 delivered ok http://a.test/pb me"
	require.Equal(t, want, row(alone))
	require.Equal(t, want, row(among))
	require.Equal(t, "in_flight | 0 | me", row(other)[:len("in_flight | 0 | me")])
	var attempts, counted int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM postbox.attempts), (SELECT count(*) FROM postbox.latency_histogram)`).
		Scan(&attempts, &counted))
	require.Zero(t, attempts, "kept on the deliveries")
	require.Zero(t, counted, "counted by the recorder, in memory")
}

// TestIngestsSkipWhatIsIngested: an ingest alone skips the events already
// ingested, committed or earlier in its own transaction, among new ones;
// one declared concurrent (a reconciliation's) waits for another ingest's
// uncommitted insert of the same event and then skips it. An ingest alone
// that meets such an insert fails once the other commits, and writes
// nothing of its transaction.
func TestIngestsSkipWhatIsIngested(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ev := func(id string) store.NewEvent {
		return store.NewEvent{OutboxRow: store.OutboxRow{Event: state.Event{EventID: id, Endpoint: "ep", Payload: []byte(`{}`)}}, Status: postboxtype.DeliveryPending}
	}
	events := func(id string) int {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events WHERE event_id = $1`, id).Scan(&n))
		return n
	}

	alone := ingestConn(t, s)
	a, b, c := outbox.NewEventID(), outbox.NewEventID(), outbox.NewEventID()
	got, err := alone.Insert(ctx, []store.NewEvent{ev(a)}, false)
	require.NoError(t, err)
	require.Len(t, got, 1)
	got, err = alone.Insert(ctx, []store.NewEvent{ev(b), ev(a), ev(c)}, false)
	require.NoError(t, err)
	require.Len(t, got, 2, "a, inserted earlier in the transaction, is skipped")
	require.ElementsMatch(t, []int{0, 2}, []int{got[0].Index, got[1].Index})
	require.NoError(t, alone.Commit(ctx, 0, false))
	got, err = alone.Insert(ctx, []store.NewEvent{ev(c), ev(b)}, false)
	require.NoError(t, err)
	require.Empty(t, got, "committed before")
	require.NoError(t, alone.Commit(ctx, 0, false))

	// A reconciliation waits for the stream's insert and skips the event.
	recon := ingestConn(t, s)
	recon.SetConcurrent()
	d := outbox.NewEventID()
	_, err = alone.Insert(ctx, []store.NewEvent{ev(d)}, false)
	require.NoError(t, err)
	skipped := make(chan int, 1)
	go func() {
		got, err := recon.Insert(ctx, []store.NewEvent{ev(outbox.NewEventID()), ev(d)}, false)
		assert.NoError(t, err)
		assert.NoError(t, recon.Commit(ctx, 0, false))
		skipped <- 2 - len(got)
	}()
	waitForLock(t, s)
	require.NoError(t, alone.Commit(ctx, 0, false))
	require.Equal(t, 1, <-skipped)
	require.Equal(t, 1, events(d))

	// The stream meets a reconciliation's insert: it fails, and its
	// transaction's other event is not written.
	e, f := outbox.NewEventID(), outbox.NewEventID()
	_, err = recon.Insert(ctx, []store.NewEvent{ev(e)}, false)
	require.NoError(t, err)
	_, err = alone.Insert(ctx, []store.NewEvent{ev(f)}, false)
	require.NoError(t, err)
	failed := make(chan error, 1)
	go func() {
		_, err := alone.Insert(ctx, []store.NewEvent{ev(e)}, false)
		failed <- err
	}()
	waitForLock(t, s)
	require.NoError(t, recon.Commit(ctx, 0, false))
	err = <-failed
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.NoError(t, alone.Rollback(ctx))
	require.Equal(t, 1, events(e))
	require.Zero(t, events(f))
}

// waitForLock waits until a session of s waits for a transaction's lock.
func waitForLock(t *testing.T, s *store.Store) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := s.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'transactionid'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}
