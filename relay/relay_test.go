package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

func TestDeliversOnceSignedWithExactBody(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "partner", rc.URL+"/hook?token=not-for-the-attempts-table", nil)
	r := tb.start(t, relay.Options{})

	payload := `{"click_id":"abc","payout":"12.50","nested":{"list":[1,2,3]},"text":"ünïcode \"quoted\""}`
	ids := tb.insert(t, outbox.Event{Endpoint: "partner", Type: "conversion", Payload: []byte(payload)})
	tb.waitSettled(t, 1, 20*time.Second)

	var want string
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT $1::jsonb::text`, payload).Scan(&want))
	reqs := rc.requests()
	require.Len(t, reqs, 1, "delivered exactly once")
	got := reqs[0]
	require.Equal(t, ids[0], got.ID, "webhook-id is the event id")
	require.Equal(t, http.MethodPost, got.Method)
	require.Equal(t, "/hook", got.Path)
	require.Equal(t, want, string(got.Body), "the body is the payload as stored")
	require.Equal(t, "application/json", got.Header.Get("Content-Type"))
	require.NoError(t, outbox.Verify([]string{tb.secret}, got.Header, got.Body, time.Now()))
	require.Error(t, outbox.Verify([]string{outbox.NewSecret()}, got.Header, got.Body, time.Now()))

	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryDelivered, d.Status)
	require.Equal(t, 1, d.Attempts)
	require.Equal(t, 200, d.LastStatus)
	require.NotNil(t, d.C2DMS, "commit-to-delivery time recorded")
	require.Greater(t, *d.C2DMS, 0.0)

	var attempts, attempt, code int
	var target, instance string
	require.NoError(t, tb.pool.QueryRow(context.Background(), `
		SELECT count(*) OVER (), attempt, status_code, target, instance FROM postbox.all_attempts WHERE endpoint = 'partner'`).
		Scan(&attempts, &attempt, &code, &target, &instance))
	require.Equal(t, 1, attempts, "one attempt row per attempt")
	require.Equal(t, 1, attempt)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, rc.URL+"/hook", target, "scheme://host/path, never the query")
	require.Equal(t, r.InstanceID(), instance)
}

func TestRetriesWithBackoffUntilSuccess(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, func(n int, _ received) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	base := 300 * time.Millisecond
	tb.endpoint(t, "flaky", rc.URL, func(ec *config.EndpointConfig) {
		b := config.Duration(base)
		ec.BackoffBase = &b
	})
	// The jitter's top: each wait is its full ceiling, base·2^(n-1).
	tb.start(t, relay.Options{}.WithRand(func() float64 { return 0.999 }))

	ids := tb.insert(t, outbox.Event{Endpoint: "flaky", Payload: []byte(`{"n":1}`)})
	tb.waitSettled(t, 1, 20*time.Second)

	reqs := rc.requests()
	require.Len(t, reqs, 3)
	for _, r := range reqs {
		require.Equal(t, ids[0], r.ID, "every attempt carries the same webhook-id")
	}
	gap1, gap2 := reqs[1].At.Sub(reqs[0].At), reqs[2].At.Sub(reqs[1].At)
	require.GreaterOrEqual(t, gap1, base*99/100, "first retry waits ~base")
	require.GreaterOrEqual(t, gap2, 2*base*99/100, "second retry waits ~2·base")
	// Signed afresh each time.
	require.NotEqual(t, reqs[0].Header.Get(outbox.HeaderSignature), "")
	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryDelivered, d.Status)
	require.Equal(t, 3, d.Attempts)
}

func TestPermanentStatusesDeadLetterAfterOneAttempt(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	codes := map[string]int{"/400": 400, "/401": 401, "/404": 404}
	rc := newReceiver(t, func(_ int, r received) int { return codes[r.Path] })
	for path := range codes {
		tb.endpoint(t, "ep"+path[1:], rc.URL+path, nil)
	}
	tb.start(t, relay.Options{})
	ids := tb.insert(t,
		outbox.Event{Endpoint: "ep400"}, outbox.Event{Endpoint: "ep401"}, outbox.Event{Endpoint: "ep404"})
	// A dead letter is final, and it is recorded after its attempt
	// returned: once all three are, the receiver has seen every request
	// there will be.
	tb.waitSettled(t, 3, 20*time.Second)
	require.Equal(t, 3, rc.count(), "no retries")
	for i, code := range []int{400, 401, 404} {
		d := tb.delivery(t, ids[i])
		require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
		require.Equal(t, 1, d.Attempts)
		require.Equal(t, code, d.LastStatus)
		require.Equal(t, fmt.Sprintf("http %d", code), d.LastError)
		// The endpoint shows its latest failure, though a 4xx leaves its
		// breaker alone.
		var breaker postboxtype.BreakerState
		var lastErr string
		var lastCode, streak int
		require.NoError(t, tb.pool.QueryRow(context.Background(), `
			SELECT state, coalesce(last_error, ''), coalesce(last_status_code, 0), consecutive_failures
			FROM postbox.endpoint_health WHERE endpoint = $1`, fmt.Sprintf("ep%d", code)).Scan(&breaker, &lastErr, &lastCode, &streak))
		require.Equal(t, []any{postboxtype.BreakerClosed, d.LastError, code, 0}, []any{breaker, lastErr, lastCode, streak})
	}
}

func TestServerErrorsDeadLetterAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, func(int, received) int { return http.StatusInternalServerError })
	tb.endpoint(t, "down", rc.URL, func(ec *config.EndpointConfig) {
		b := config.Duration(20 * time.Millisecond)
		ec.BackoffBase = &b
	})
	tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "down"})
	tb.waitSettled(t, 1, 30*time.Second) // final, recorded after the last attempt returned
	require.Equal(t, 5, rc.count(), "max_attempts defaults to 5")
	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.Equal(t, 5, d.Attempts)
	require.Equal(t, "max_attempts (5) exhausted: http 500", d.LastError)
}

func TestRolledBackTransactionDeliversNothing(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()

	tx, err := tb.pool.Begin(ctx)
	require.NoError(t, err)
	for range 3 {
		_, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: "p"})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Rollback(ctx))
	// A committed marker after it: the stream ingests in commit order, so
	// once the marker is ingested, rows committed before it would be too.
	ids := tb.insert(t, outbox.Event{Endpoint: "p", Type: "marker"})
	tb.waitSettled(t, 1, 20*time.Second)
	var events int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events`).Scan(&events))
	require.Equal(t, 1, events, "nothing of the rolled-back transaction was ingested, so nothing will be delivered")
	reqs := rc.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, ids[0], reqs[0].ID)
}

func TestLargeTransactionAllDelivered(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "bulk", rc.URL, func(ec *config.EndpointConfig) {
		n := 32
		ec.MaxInFlight = &n
	})
	tb.start(t, relay.Options{})
	const n = 10000
	_, err := tb.pool.Exec(context.Background(), `
		INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'bulk', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
	tb.waitSettled(t, n, 3*time.Minute)
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: n}, tb.deliveries(t))
	rc.requireEachOnce(t, n)
	waitUntil(t, 30*time.Second, "ingested outbox rows deleted (outbox_retention 0)", func() bool {
		var left int
		require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT count(*) FROM postbox.outbox`).Scan(&left))
		return left == 0
	})
}

func TestUpdatesAndDeletesAreIgnoredAndTheSlotAdvances(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.OutboxRetention = config.Duration(time.Hour) // keep rows to update
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	tb.insert(t, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"})
	tb.waitSettled(t, 2, 20*time.Second)

	_, err := tb.pool.Exec(ctx, `UPDATE postbox.outbox SET event_type = 'changed'`)
	require.NoError(t, err)
	_, err = tb.pool.Exec(ctx, `DELETE FROM postbox.outbox`)
	require.NoError(t, err)
	var after string
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after))
	afterLSN, err := pglogrepl.ParseLSN(after)
	require.NoError(t, err)

	waitUntil(t, 20*time.Second, "slot to confirm past the update and delete", func() bool {
		var confirmed string
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot).Scan(&confirmed))
		lsn, err := pglogrepl.ParseLSN(confirmed)
		require.NoError(t, err)
		return lsn >= afterLSN
	})
	require.Equal(t, 2, rc.count(), "updates and deletes deliver nothing")
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: 2}, tb.deliveries(t))
}

func TestBadInputBecomesDeadLettersAndTheStreamGoesOn(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.MaxBody = 100
	rc := newReceiver(t, nil)
	tb.endpoint(t, "good", rc.URL, nil)
	tb.start(t, relay.Options{})
	big := `{"blob":"` + strings.Repeat("x", 200) + `"}`
	ids := tb.insert(t,
		outbox.Event{Endpoint: "nobody"},                               // unknown endpoint, no url
		outbox.Event{Endpoint: "nobody", URL: "ftp://example.com/x"},   // not http(s)
		outbox.Event{Endpoint: "nobody", URL: "http://[::1"},           // unparsable
		outbox.Event{Endpoint: "good", Payload: []byte(big)},           // too large
		outbox.Event{Endpoint: "good", Payload: []byte(`{"ok":true}`)}, // fine
	)
	tb.waitSettled(t, 5, 20*time.Second)
	wantPrefix := []string{"unknown_endpoint:", "invalid_url:", "invalid_url:", "payload_too_large:"}
	for i, p := range wantPrefix {
		d := tb.delivery(t, ids[i])
		require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status, "event %d", i)
		require.True(t, strings.HasPrefix(d.LastError, p), "event %d: %q should start with %q", i, d.LastError, p)
		require.Zero(t, d.Attempts, "nothing was sent")
	}
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, ids[4]).Status)
	require.Equal(t, 1, rc.count())
	var stored string
	var dropped int
	require.NoError(t, tb.pool.QueryRow(context.Background(),
		`SELECT payload::text, payload_dropped FROM postbox.events WHERE event_id = $1`, ids[3]).Scan(&stored, &dropped))
	require.Equal(t, "null", stored, "a payload above max_body is never stored")
	require.Greater(t, dropped, 100, "the size it had (as PostgreSQL printed it)")
	items, n, err := ops.Replay(context.Background(), tb.pool, tb.resolved(t), postboxtype.ReplayFilter{DeadLetters: true, Endpoint: "good"}, false, 0)
	require.NoError(t, err)
	require.Empty(t, items, "with its payload gone it cannot be replayed")
	require.Zero(t, n)
	// The stream went on: a later event is delivered too.
	later := tb.insert(t, outbox.Event{Endpoint: "good"})
	tb.waitSettled(t, 6, 20*time.Second)
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, later[0]).Status)
}

func TestReconcilesRowsWrittenWithoutASlot(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	ctx := context.Background()
	// The application's migrations ran and rows were written before
	// postbox ever started: no slot saw them.
	_, err := tb.pool.Exec(ctx, outbox.SchemaSQL(tb.resolved(t).Table))
	require.NoError(t, err)
	ids := tb.insert(t, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"})
	tb.start(t, relay.Options{})
	more := tb.insert(t, outbox.Event{Endpoint: "p"})
	tb.waitSettled(t, 4, 20*time.Second)
	byID := rc.byID()
	for _, id := range append(ids, more...) {
		require.Equal(t, 1, byID[id], "event %s delivered once", id)
	}
}

func TestGracefulStopRecordsAndConfirms(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	release := make(chan struct{})
	rc := newReceiver(t, func(n int, _ received) int {
		<-release
		return http.StatusOK
	})
	tb.endpoint(t, "slow", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "slow"})
	waitUntil(t, 10*time.Second, "attempt in flight", func() bool { return rc.count() == 1 })
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	waitUntil(t, 10*time.Second, "the stop to wait for the attempt in flight", func() bool {
		return strings.Contains(tb.logs.String(), "waiting for in-flight attempts")
	})
	close(release) // the in-flight attempt finishes within the grace period
	require.NoError(t, <-stopped)
	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryDelivered, d.Status, "the result was recorded before exit")

	var active bool
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot).Scan(&active))
	require.False(t, active)
	var confirmed, checkpoint string
	require.NoError(t, tb.pool.QueryRow(context.Background(), `
		SELECT s.confirmed_flush_lsn::text, c.lsn::text FROM pg_replication_slots s, postbox.checkpoints c
		WHERE s.slot_name = $1 AND c.slot = $1`, tb.cfg.Slot).Scan(&confirmed, &checkpoint))
	c1, _ := pglogrepl.ParseLSN(confirmed)
	c2, _ := pglogrepl.ParseLSN(checkpoint)
	require.GreaterOrEqual(t, c1, c2, "the ingested position was confirmed to the server")
}

func TestShutdownPastGraceReleasesTheAttempt(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.ShutdownGrace = config.Duration(300 * time.Millisecond)
	hang := make(chan struct{})
	rc := newReceiver(t, func(int, received) int {
		<-hang
		return http.StatusOK
	})
	t.Cleanup(func() { close(hang) }) // before the receiver's Close, which waits for handlers
	tb.endpoint(t, "hang", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "hang"})
	waitUntil(t, 10*time.Second, "attempt in flight", func() bool { return rc.count() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(ctx))
	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryPending, d.Status, "released back to the queue for the next instance")
	require.Zero(t, d.Attempts, "an interrupted attempt is not counted")
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	table := tb.resolved(t).Table
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- store.Migrate(ctx, tb.pool, table) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, store.Migrate(ctx, tb.pool, table))
	v, err := store.SchemaVersion(ctx, tb.pool)
	require.NoError(t, err)
	require.Equal(t, len(store.Migrations()), v)
	var cols []string
	rows, err := tb.pool.Query(ctx, `SELECT column_name || ' ' || data_type FROM information_schema.columns
		WHERE table_schema = 'postbox' AND table_name = 'outbox' ORDER BY ordinal_position`)
	require.NoError(t, err)
	cols, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"id bigint", "event_id uuid", "endpoint text", "url text", "event_type text",
		"payload jsonb", "headers jsonb", "created_at timestamp with time zone"}, cols)
}

func TestPreflightNamesTheFix(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	role := fmt.Sprintf("norepl_%d", time.Now().UnixNano())
	_, err := tb.pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = tb.pool.Exec(context.Background(), `DROP ROLE `+role) })
	cfg, err := pgx.ParseConfig(tb.dbURL)
	require.NoError(t, err)
	cfg.User = role
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	err = store.Preflight(ctx, conn)
	require.Error(t, err)
	require.Contains(t, err.Error(), `ALTER ROLE "`+role+`" WITH REPLICATION`)
	require.NoError(t, store.Preflight(ctx, tb.pool), "a superuser on wal_level=logical passes")
}

// The configured search keys' top-level scalar fields are extracted at
// ingest, as text; other fields, nested values and unconfigured keys are
// not, and without search keys nothing is.
func TestSearchKeysAreExtractedAtIngest(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "aff", rc.URL, nil)
	tb.cfg.SearchKeys = []string{"click_id", "payout", "order_id"}
	tb.start(t, relay.Options{})
	ids := tb.insert(t,
		outbox.Event{Endpoint: "aff", Payload: []byte(`{"click_id":"c_8812","payout":12.5,"order_id":{"nested":1},"sub1":"x"}`)},
		outbox.Event{Endpoint: "aff", Payload: []byte(`{"sub1":"only unconfigured"}`)},
		outbox.Event{Endpoint: "aff", Payload: []byte(`["not an object"]`)})
	tb.waitSettled(t, 3, 20*time.Second)
	search := func(id string) *string {
		var s *string
		require.NoError(t, tb.pool.QueryRow(context.Background(),
			`SELECT search::text FROM postbox.events WHERE event_id = $1`, id).Scan(&s))
		return s
	}
	require.Equal(t, `{"payout": "12.5", "click_id": "c_8812"}`, *search(ids[0]))
	require.Nil(t, search(ids[1]), "no configured field: no index entry")
	require.Nil(t, search(ids[2]))
	var found string
	require.NoError(t, tb.pool.QueryRow(context.Background(),
		`SELECT event_id::text FROM postbox.events WHERE search @> '{"click_id":"c_8812"}'`).Scan(&found))
	require.Equal(t, ids[0], found)
}

// The reconciliation a new slot owes is recorded before the slot exists:
// a leader stopped between the two must not leave a slot without the debt
// (the rows written while there was none would stay in the table).
func TestReconciliationIsOwedBeforeTheSlotIsMade(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	ctx := context.Background()
	// The first slot's debt (rows before postbox) is paid.
	waitUntil(t, 20*time.Second, "the first reconciliation recorded as done", func() bool { return !reconcilePending(t, tb) })
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	tb.dropSlot(t)
	// Each time the debt is recorded, whether the slot existed then.
	tb.exec(t, `CREATE TABLE public.owed_seen (slot_existed bool NOT NULL);
		CREATE FUNCTION public.note_owed() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.reconcile_pending AND NOT OLD.reconcile_pending THEN
				INSERT INTO public.owed_seen SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = NEW.slot);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER note_owed BEFORE UPDATE ON postbox.checkpoints FOR EACH ROW EXECUTE FUNCTION public.note_owed()`)
	unseen := tb.insert(t, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"})

	tb.start(t, relay.Options{})
	tb.waitSettled(t, 2, 20*time.Second)
	byID := rc.byID()
	for _, id := range unseen {
		require.Equal(t, 1, byID[id], "a row no slot saw is delivered, once")
	}
	rows, err := tb.pool.Query(ctx, `SELECT slot_existed FROM public.owed_seen`)
	require.NoError(t, err)
	seen, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	require.NoError(t, err)
	require.Equal(t, []bool{false}, seen, "the debt recorded once, before the slot was made")
}

// A leader that recreated the slot and died before reconciling leaves the
// reconciliation owed in the database; the next leader, even one that has
// reconciled before in its life, does it.
func TestOwedReconciliationOutlivesTheLeaderThatOwedIt(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	tb.cfg.LeaderLease = config.Duration(time.Second)
	r := tb.start(t, relay.Options{})
	tb.insert(t, outbox.Event{Endpoint: "p"})
	tb.waitSettled(t, 1, 20*time.Second)
	slot := tb.cfg.Slot

	// Another instance takes the lease (the relay stands by), drops and
	// recreates the slot with rows written in between, owes the
	// reconciliation, and dies holding the lease for three more seconds.
	tb.exec(t, `UPDATE postbox.checkpoints SET leader = 'doomed', fencing = fencing + 1, lease_expires_at = now() + interval '3 seconds' WHERE slot = $1`, slot)
	waitUntil(t, 20*time.Second, "the relay to stand by", func() bool { return !r.Streaming() })
	tb.dropSlot(t)
	unseen := tb.insert(t, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"})
	tb.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	tb.exec(t, `UPDATE postbox.checkpoints SET reconcile_pending = true WHERE slot = $1`, slot)

	waitUntil(t, 30*time.Second, "the relay to lead again", r.Streaming)
	tb.waitSettled(t, 3, 20*time.Second)
	byID := rc.byID()
	for _, id := range unseen {
		require.Equal(t, 1, byID[id], "a row no slot saw is delivered, once")
	}
	// Recorded as done once the reconciliation has looked again and found
	// nothing: its deliveries may be recorded first.
	waitUntil(t, 20*time.Second, "the reconciliation done, and recorded as done", func() bool { return !reconcilePending(t, tb) })
}

// reconcilePending reads whether the database records a reconciliation
// owed for tb's slot.
func reconcilePending(t *testing.T, tb *testBundle) bool {
	t.Helper()
	var pending bool
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT reconcile_pending FROM postbox.checkpoints WHERE slot = $1`, tb.cfg.Slot).Scan(&pending))
	return pending
}

// exec runs sql on tb's database.
func (tb *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := tb.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// dropSlot drops tb's slot once no walsender holds it, ending the one that
// still does (a relay standing by may not have let go of it yet).
func (tb *testBundle) dropSlot(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	waitUntil(t, 20*time.Second, "the slot to be free", func() bool {
		var active bool
		_ = tb.pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot).Scan(&active)
		if active {
			_, _ = tb.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, tb.cfg.Slot)
		}
		return !active
	})
	tb.exec(t, `SELECT pg_drop_replication_slot($1)`, tb.cfg.Slot)
}
