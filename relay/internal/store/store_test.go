package store_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/protect"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func setup(t testing.TB) *store.Store {
	t.Helper()
	return setupConns(t, 4)
}

// setupConns is setup with a pool of conns sessions.
func setupConns(t testing.TB, conns int32) *store.Store {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), conns)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	s := &store.Store{Pool: pool, Table: table, Slot: "test"}
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "me"}, time.Minute, false))
	return s
}

// queue ingests n pending deliveries for endpoint.
func queue(t testing.TB, s *store.Store, endpoint string, n int) {
	t.Helper()
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	defer ic.Release()
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = store.NewEvent{
			OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: endpoint, Payload: []byte(`{}`), CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
			Status:    postboxtype.DeliveryPending,
		}
	}
	_, err = ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
}

// ingestOne opens an ingest on s and inserts one pending event in its
// transaction, which it leaves open.
func ingestOne(t *testing.T, s *store.Store) *store.IngestConn {
	t.Helper()
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	t.Cleanup(ic.Release)
	_, err = ic.Insert(ctx, []store.NewEvent{{
		OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "e", Payload: []byte(`{}`), CreatedAt: time.Now()}},
		Status:    postboxtype.DeliveryPending,
	}}, false)
	require.NoError(t, err)
	require.True(t, ic.InTx())
	return ic
}

// backendEnded reports, for require.Eventually, whether the server has
// ended backend pid (watched through q, another connection). The server
// ends a backend after its client has gone or its session timed out, not
// at once.
func backendEnded(t testing.TB, q store.Querier, pid uint32) func() bool {
	return func() bool {
		var n int
		// assert, not require: Eventually calls this on a goroutine of
		// its own, where FailNow must not be called.
		err := q.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return assert.NoError(t, err) && n == 0
	}
}

func count(claimed []store.Claimed) map[string]int {
	out := map[string]int{}
	for _, c := range claimed {
		out[c.Endpoint]++
	}
	return out
}

// TestClaimsAreFairAcrossEndpoints: an endpoint with a deep queue cannot
// take a batch from one with a short one.
func TestClaimsAreFairAcrossEndpoints(t *testing.T) {
	t.Parallel()
	s := setup(t)
	queue(t, s, "aaa-big", 2000)
	queue(t, s, "zzz-small", 10)
	claimed, err := s.Claim(context.Background(), "me", 100, nil, nil, 20, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"aaa-big": 10, "zzz-small": 10}, count(claimed))
}

// TestFirstAttemptsAreNotStarvedByRetries: with a backlog of due retries,
// new events still get half the claims.
func TestFirstAttemptsAreNotStarvedByRetries(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 500)
	_, err := s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'failed', attempt_count = 1, next_attempt_at = now() - interval '1 minute'`)
	require.NoError(t, err)
	queue(t, s, "ep", 5)
	claimed, err := s.Claim(ctx, "me", 10, nil, nil, 1000, nil)
	require.NoError(t, err)
	first := 0
	for _, c := range claimed {
		if c.AttemptCount == 0 {
			first++
		}
	}
	require.Len(t, claimed, 10)
	require.Equal(t, 5, first, "every new event is claimed beside the retries")
}

func TestClaimSkipsOpenBreakersAndPausedEndpoints(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	for _, ep := range []string{"open", "paused", "fine"} {
		queue(t, s, ep, 3)
	}
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, state, opened_at, paused_until) VALUES
		('open', 'open', now(), NULL), ('paused', 'closed', NULL, now() + interval '1 hour')`)
	require.NoError(t, err)
	claimed, err := s.Claim(ctx, "me", 10, nil, nil, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"fine": 3}, count(claimed))
}

// TestOneProbeWins: of many instances asking at once, exactly one gets the
// half-open breaker's probe.
func TestOneProbeWins(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 20)
	openBreaker(t, s, "ep")
	type win struct {
		ok  bool
		err error
	}
	wins := make(chan win, 8)
	for i := range 8 {
		owner := fmt.Sprintf("inst-%d", i)
		require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: owner}, time.Minute, false))
		go func() {
			got, err := s.ClaimProbes(ctx, owner, []store.ProbeCandidate{{Endpoint: "ep"}})
			wins <- win{len(got) == 1, err}
		}()
	}
	n := 0
	for range 8 {
		w := <-wins
		require.NoError(t, w.err)
		if w.ok {
			n++
		}
	}
	require.Equal(t, 1, n)
	var state string
	var inFlight int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT state, (SELECT count(*) FROM postbox.deliveries WHERE status = 'in_flight') FROM postbox.endpoint_health`).Scan(&state, &inFlight))
	require.Equal(t, "half_open", state)
	require.Equal(t, 1, inFlight, "exactly one probe delivery")
}

func TestTokenBucketIsShared(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	got, _, err := s.TakeTokens(ctx, "ep", 50, 10, 10)
	require.NoError(t, err)
	require.Equal(t, 10, got, "a new bucket starts full: the burst")
	got, wait, err := s.TakeTokens(ctx, "ep", 5, 10, 10)
	require.NoError(t, err)
	require.Equal(t, 0, got)
	require.Greater(t, wait, time.Duration(0))
	require.LessOrEqual(t, wait, 100*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // pacing: let the bucket refill
	// The bucket's last take and this one, by the server's clock.
	var before, after time.Time
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT updated_at FROM postbox.rate_buckets WHERE endpoint = 'ep'`).Scan(&before))
	got, _, err = s.TakeTokens(ctx, "ep", 50, 10, 10)
	require.NoError(t, err)
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT updated_at FROM postbox.rate_buckets WHERE endpoint = 'ep'`).Scan(&after))
	// However long the pause really was (a loaded machine stretches it),
	// the bucket gained 10 a second of it, plus less than one token left
	// over from the last take, up to the burst.
	refill := 10 * after.Sub(before).Seconds()
	require.GreaterOrEqual(t, got, min(10, int(refill)), "refilled at the rate")
	require.LessOrEqual(t, got, min(10, int(refill)+1), "refilled at the rate, no faster")
	t.Logf("%d tokens after %s", got, after.Sub(before))
}

// JIT-compiles, whatever the server's defaults (see Open).
func TestSessionSettings(t *testing.T) {
	t.Parallel()
	s := setup(t)
	var planCache, jit string
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT current_setting('plan_cache_mode'), current_setting('jit')`).Scan(&planCache, &jit))
	require.Equal(t, []string{"force_custom_plan", "off"}, []string{planCache, jit})
}

// Reconciliation reads a row its table lets be NULL where the contract
// wants a value as a dead letter to be, and goes on past it.
func TestUningestedOutboxNullsAreInvalidRows(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `ALTER TABLE postbox.outbox ALTER COLUMN endpoint DROP NOT NULL, ALTER COLUMN payload DROP NOT NULL`)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES (NULL, '{}'), ('ep', NULL), ('ep', '{"ok":1}'),
		('ep', jsonb_build_object('pad', repeat('x', 2000)))`)
	require.NoError(t, err)
	rows, err := s.UningestedOutbox(ctx, 0, 10, "", 1000)
	require.NoError(t, err)
	require.Len(t, rows, 4)
	require.Equal(t, "invalid_row: endpoint and event_type are both empty: the row names no endpoint and no type to route it by", rows[0].Invalid)
	require.True(t, rows[0].Fanout, "stored with matched set, so the purge finds its event")
	require.Equal(t, "invalid_row: column payload missing or unreadable", rows[1].Invalid)
	require.Empty(t, rows[2].Invalid)
	require.Equal(t, "ep", rows[2].Endpoint)
	require.JSONEq(t, `{"ok":1}`, string(rows[2].Payload))
	require.Empty(t, rows[3].Invalid, "a payload above max_body is measured, not read")
	require.Nil(t, rows[3].Payload)
	require.Greater(t, rows[3].PayloadTooLarge, 2000)
}

// openBreaker opens endpoint's breaker, its cooldown (5 s) passed: the
// next claim of probes may take it.
func openBreaker(t testing.TB, s *store.Store, endpoint string) {
	t.Helper()
	_, err := s.Pool.Exec(context.Background(), `INSERT INTO postbox.endpoint_health (endpoint, state, opened_at, cooldown_seconds)
		VALUES ($1, 'open', now() - interval '10 seconds', 5)`, endpoint)
	require.NoError(t, err)
}

// protection is the relay's breaker rules for instance "me" of s, under
// the default configuration: the HealthFunc the recorder gives
// RecordResults.
func protection(t testing.TB, s *store.Store) *protect.Protection {
	t.Helper()
	var cfg atomic.Pointer[config.Config]
	resolved, err := config.Default().Resolve()
	require.NoError(t, err)
	cfg.Store(resolved)
	env := service.NewEnv(&cfg)
	env.Store, env.Owner = s, "me"
	return protect.New(env)
}

// The queue table is vacuumed by a fixed count of dead rows, not by a
// fraction of a table that grows with retention.
func TestQueueTablesVacuumByCount(t *testing.T) {
	s := setup(t)
	var opts []string
	require.NoError(t, s.Pool.QueryRow(context.Background(),
		`SELECT reloptions FROM pg_class WHERE oid = 'postbox.deliveries'::regclass`).Scan(&opts))
	require.Contains(t, opts, "autovacuum_vacuum_scale_factor=0")
	require.Contains(t, opts, "autovacuum_vacuum_threshold=20000")
}

// TestProbesAreClaimedInOneStatement: of the candidates, the breaker due
// with work queued is probed; one with nothing queued stays open, to be
// probed once something is; one still cooling down is left alone.
func TestProbesAreClaimedInOneStatement(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "due", 3)
	queue(t, s, "cooling", 3)
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, state, opened_at, cooldown_seconds) VALUES
		('due', 'open', now() - interval '10 seconds', 5),
		('idle', 'open', now() - interval '10 seconds', 5),
		('cooling', 'open', now(), 60)`)
	require.NoError(t, err)
	got, err := s.ClaimProbes(ctx, "me", []store.ProbeCandidate{{Endpoint: "due"}, {Endpoint: "idle"}, {Endpoint: "cooling"}})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"due": 1}, count(got))
	held, err := s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	states := map[string]string{}
	for ep, h := range held {
		states[ep] = h.State.String()
	}
	require.Equal(t, map[string]string{"due": "half_open", "idle": "open", "cooling": "open"}, states)

	queue(t, s, "idle", 1)
	got, err = s.ClaimProbes(ctx, "me", []store.ProbeCandidate{{Endpoint: "idle"}})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"idle": 1}, count(got), "probed once something is queued")
}

// TestProbeTakesTheEarliestQueued: a breaker's probe takes the lane's
// earliest queued delivery, parked or not: not one queued since the
// breaker opened and not parked yet, which still looks due.
func TestProbeTakesTheEarliestQueued(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 2)
	openBreaker(t, s, "ep")
	parked, err := s.Park(ctx, 100)
	require.NoError(t, err)
	require.EqualValues(t, 2, parked)
	queue(t, s, "ep", 1) // queued while open, before the next park
	var earliest int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT min(id) FROM postbox.deliveries WHERE endpoint = 'ep'`).Scan(&earliest))

	got, err := s.ClaimProbes(ctx, "me", []store.ProbeCandidate{{Endpoint: "ep"}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, earliest, got[0].DeliveryID)
}

// The recorder and LoadOwned reach the batch's deliveries by primary key
// and read nothing else, even when the statistics were taken before the
// owner held anything in flight (a catch-up fills the table faster than
// autovacuum analyses it): the owner's other in-flight rows are not read
// and filtered away, nor is the table scanned.
func TestByIDStatementsReadOnlyTheirRows(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `ALTER TABLE postbox.deliveries SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	queue(t, s, "ep", 200)
	_, err = s.Pool.Exec(ctx, `ANALYZE postbox.deliveries`)
	require.NoError(t, err)

	ingested := ingestInFlight(t, s, "ep", 5000)
	var ids []int64
	for _, in := range ingested[2000:2010] {
		ids = append(ids, in.DeliveryID)
	}
	n := len(ids)

	explain := func(setting, sql string, args ...any) string {
		t.Helper()
		tx, err := s.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, setting)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) `+sql, args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	removed := regexp.MustCompile(`Rows Removed by [A-Za-z ]+: (\d+)`)
	// PostgreSQL 18 prints the rows with two decimals (rows=10.00).
	byKey := regexp.MustCompile(`deliveries_pkey.*\(actual rows=(\d+)(?:\.00)? `)
	check := func(what, plan string) {
		t.Helper()
		m := byKey.FindStringSubmatch(plan)
		require.NotNil(t, m, "%s reaches deliveries by id:\n%s", what, plan)
		require.Equal(t, fmt.Sprint(n), m[1], "%s finds its batch by id:\n%s", what, plan)
		require.NotContains(t, plan, "Seq Scan on deliveries", "%s scans the table:\n%s", what, plan)
		for _, m := range removed.FindAllStringSubmatch(plan, -1) {
			require.Equal(t, "0", m[1], "%s reads rows not in its batch:\n%s", what, plan)
		}
	}

	plan := explain(store.KeyPlans, store.LoadOwnedSQL, ids, "me")
	check("LoadOwned", plan)

	statuses, delays, attempted := make([]string, n), make([]float64, n), make([]bool, n)
	errs, codes, ms, bodies := make([]string, n), make([]int32, n), make([]float32, n), make([]string, n)
	ats, c2d, inline, targets := make([]time.Time, n), make([]float32, n), make([]bool, n), make([]string, n)
	for i := range ids {
		statuses[i], attempted[i], codes[i], ats[i], inline[i] = string(postboxtype.DeliveryDelivered), true, 200, time.Now(), true
	}
	plan = explain(store.RecordPlans, store.RecordResultsSQL, ids, statuses, delays, attempted, errs, codes, ms, bodies, ats, c2d, "me",
		inline, targets, make([]int64, n), make([]string, n), make([]bool, n))
	check("RecordResults", plan)

	// The calls themselves, on one connection whose statistics are
	// flushed before they are read: no row of deliveries is read but
	// through the primary key. PostgreSQL 14's statistics reach the
	// views some time later, by the collector, with no flush to wait on:
	// there the plans above are the proof.
	var version int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	if version < 150000 {
		t.Logf("PostgreSQL %d: no pg_stat_force_next_flush; the calls' reads are not counted", version/10000)
		return
	}
	one, err := store.Open(ctx, s.Pool.Config().ConnString(), 1)
	require.NoError(t, err)
	defer one.Close()
	s1 := &store.Store{Pool: one, Table: s.Table, Slot: s.Slot}
	// The report's rollup trigger (migration 038) looks up each changed
	// row's event among the event's deliveries, by deliveries_event: those
	// reads are counted apart and bounded by the batch, never a scan.
	reads := func() (other, byEvent int64) {
		t.Helper()
		_, err := one.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		_, err = one.Exec(ctx, `SELECT 1`) // the flush follows a transaction
		require.NoError(t, err)
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT coalesce(sum(idx_tup_read) FILTER (WHERE indexrelname NOT IN ('deliveries_pkey', 'deliveries_event')), 0)
			     + (SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 'postbox.deliveries'::regclass),
			       coalesce(sum(idx_tup_read) FILTER (WHERE indexrelname = 'deliveries_event'), 0)
			FROM pg_stat_user_indexes WHERE relid = 'postbox.deliveries'::regclass`).Scan(&other, &byEvent))
		return other, byEvent
	}
	// A batch as large as a catch-up's, where a scan of the table looks
	// cheaper to the planner than a thousand probes of the key.
	ids = ids[:0]
	for _, in := range ingested[3000:4000] {
		ids = append(ids, in.DeliveryID)
	}
	n = len(ids)
	before, beforeByEvent := reads()
	loaded, err := s1.LoadOwned(ctx, "me", ids)
	require.NoError(t, err)
	require.Len(t, loaded, n)
	results := make([]state.Result, n)
	for i, id := range ids {
		results[i] = state.Result{DeliveryID: id, Endpoint: "ep", Status: postboxtype.DeliveryDelivered, Attempted: true,
			Sampled: true, Attempt: 1, StatusCode: 200, At: time.Now()}
	}
	_, err = s1.RecordResults(ctx, "me", results, func(cur store.Health, _ []state.Result) store.Health { return cur }, nil)
	require.NoError(t, err)
	var delivered int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE id = ANY($1) AND status = 'delivered'`, ids).Scan(&delivered))
	require.Equal(t, n, delivered)
	after, afterByEvent := reads()
	require.Zero(t, after-before, "deliveries rows read other than by primary key or by their event")
	require.LessOrEqual(t, afterByEvent-beforeByEvent, int64(2*n), "the rollup trigger's lookups by event")
}

// TestNoIndexOnEventsLeadsWithTheBareEndpoint: the ingest finds each row
// among the events by (event_id, endpoint), through the unique index. An
// index whose first column is the bare endpoint (the portal's list once
// was) is one the planner may take for that lookup while the table's
// statistics are young, reading every event of the endpoint per row.
func TestNoIndexOnEventsLeadsWithTheBareEndpoint(t *testing.T) {
	t.Parallel()
	s := setup(t)
	rows, err := s.Pool.Query(context.Background(), `
		SELECT i.indexrelid::regclass::text
		FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = 'postbox.events'::regclass AND a.attname = 'endpoint'`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, names)
}
