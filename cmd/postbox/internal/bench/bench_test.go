package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestLedgerCountsByID: a committed id that never arrived is lost even when
// another id (whose commit was never acknowledged) arrived in its place —
// where inserts minus distinct arrivals would say nothing was lost.
func TestLedgerCountsByID(t *testing.T) {
	t.Parallel()
	l := newLedger()
	l.commit("a", "b", "c")
	require.Equal(t, 3, l.pending())
	now := time.Now()
	l.arrive("a", now)
	l.arrive("a", now.Add(time.Millisecond))
	l.arrive("b", now)
	l.arrive("x", now) // its producer never saw the commit return
	require.Equal(t, 1, l.pending())

	got := l.tally()
	require.Equal(t, 3, got.sent)
	require.Equal(t, 3, got.received)
	require.Equal(t, 1, got.lost, "c")
	require.Equal(t, 1, got.dups, "a twice")
	require.Equal(t, 1, got.unacknowledged, "x")
	require.Equal(t, now, got.first["a"], "the first arrival counts")

	l.commit("x") // acknowledged after it arrived: no longer pending
	require.Equal(t, 1, l.pending())
}

// TestDuplicateBoundAddsTheUnrecordedToTheInFlight: an event a fault can
// make the relays send twice is one in flight at it or one that arrived
// and was left unrecorded; a delivery that is both counts once, and the
// two sets add up (the larger alone would refuse duplicates the fault
// did cause: first attempts made ahead of an ingest the fault failed are
// in no in-flight row).
func TestDuplicateBoundAddsTheUnrecordedToTheInFlight(t *testing.T) {
	t.Parallel()
	f := Fault{Kind: faultFreeze, inFlight: []string{"a", "b", "c"}}
	f.expose([]string{"c", "d", "e", "f"}, []string{"g", "h"})
	require.Equal(t, 6, f.dupBound(), "a to f, c once; what arrived during a freeze is not the freeze's")
	f = Fault{Kind: faultKill, inFlight: []string{"a", "b", "c"}}
	f.expose([]string{"c", "d", "e", "f"}, []string{"g", "h"})
	require.Equal(t, 8, f.dupBound(), "what arrived while a relay was killed was in flight at it")
	f = Fault{Kind: faultReadOnly, inFlight: []string{"a", "b", "c"}}
	f.expose([]string{"c", "d", "e", "f"}, []string{"f", "g", "h", "i"})
	require.Equal(t, 9, f.dupBound(), "and what arrived while the database was read-only")
	f.InFlightAfter = 11
	require.Equal(t, 11, f.dupBound(), "or, if more, what was in flight once it recovered")
}

// TestDuplicatesCountAgainstTheFaultThatExposedThem: a repeat belongs to
// the latest fault before it that had the event in flight, not merely to
// the latest fault; one no fault exposed counts against the latest before
// it, and one before any fault against none.
func TestDuplicatesCountAgainstTheFaultThatExposedThem(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	faults := []Fault{{Kind: faultKill, at: t0, exposed: map[string]bool{"a": true}}, {Kind: faultFreeze, at: t0.Add(10 * time.Second), exposed: map[string]bool{"b": true}}}
	before := attributeDups(faults, []string{"x", "a", "b", "c"}, []time.Time{t0.Add(-time.Second), t0.Add(12 * time.Second), t0.Add(13 * time.Second), t0.Add(14 * time.Second)})
	require.Equal(t, 1, before)
	require.Equal(t, 1, faults[0].Dups, "a, after the freeze but exposed by the kill")
	require.Equal(t, 2, faults[1].Dups, "b, and c which no fault exposed")
}

// TestCheckFailsOnLossesUnmeasuredAndDuplicates: the judging of a run's
// figures, with crafted counts. Each scenario's losses, events received
// without a latency, and duplicates above their bound fail the run.
func TestCheckFailsOnLossesUnmeasuredAndDuplicates(t *testing.T) {
	t.Parallel()
	clean := func() *Result {
		return &Result{
			Latency: &LatencyResult{Sent: 10, Received: 10, Measured: 10},
			Dead:    &DeadResult{Alone: &LatencyResult{Sent: 10, Received: 10, Measured: 10}, Beside: &LatencyResult{Sent: 10, Received: 10, Measured: 10}},
			Load:    &LoadResult{Sent: 10, Received: 10, Measured: 10},
			Catchup: &CatchupResult{Backlog: 10, EventsPerTransaction: 1},
			Chaos: &ChaosResult{Received: 10, Measured: 10, HealthyMaxms: 900, SteadyBoundms: 10000,
				Faults: []Fault{{Kind: faultKill, Exposed: 3, Dups: 3}}},
		}
	}
	require.NoError(t, clean().check())
	for _, c := range []struct {
		name   string
		spoil  func(r *Result)
		target error
	}{
		{"dead loses one beside the dead endpoints", func(r *Result) { r.Dead.Beside.Lost = 1 }, ErrLost},
		{"catchup loses one", func(r *Result) { r.Catchup.Lost = 1 }, ErrLost},
		{"latency leaves one unmeasured", func(r *Result) { r.Latency.Measured = 9 }, ErrUnmeasured},
		{"load leaves one unmeasured", func(r *Result) { r.Load.Measured = 9 }, ErrUnmeasured},
		{"chaos leaves one unmeasured", func(r *Result) { r.Chaos.Measured = 9 }, ErrUnmeasured},
		{"latency repeats one with no fault", func(r *Result) { r.Latency.Dups = 1 }, ErrDuplicates},
		{"catchup repeats one", func(r *Result) { r.Catchup.Dups = 1 }, ErrDuplicates},
		{"a fault repeats more than it had in flight", func(r *Result) { r.Chaos.Faults[0].Dups = 4 }, ErrDuplicates},
		{"chaos repeats one before any fault", func(r *Result) { r.Chaos.DupsBeforeFaults = 1 }, ErrDuplicates},
		{"a steady endpoint's event later than the bound", func(r *Result) { r.Chaos.HealthyMaxms = 10001 }, ErrSlow},
	} {
		r := clean()
		c.spoil(r)
		require.ErrorIs(t, r.check(), c.target, c.name)
	}
}

func TestReceiverVerifiesSignatures(t *testing.T) {
	t.Parallel()
	secret := outbox.NewSecret()
	rv := newReceiver(secret)
	t.Cleanup(rv.Close)
	t.Cleanup(func() { close(rv.hang) })
	led := rv.reset()

	post := func(id, secret string) int {
		body := []byte(`{"i":1}`)
		req, err := http.NewRequest(http.MethodPost, rv.URL+"/ep-0", strings.NewReader(string(body)))
		require.NoError(t, err)
		if secret != "" {
			key, err := outbox.ParseSecret(secret)
			require.NoError(t, err)
			ts := time.Now().Unix()
			req.Header.Set(outbox.HeaderID, id)
			req.Header.Set(outbox.HeaderTimestamp, strconv.FormatInt(ts, 10))
			req.Header.Set(outbox.HeaderSignature, key.Sign(id, ts, body))
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNoContent, post("good", secret))
	n, err := rv.badSignatures()
	require.Zero(t, n)
	require.NoError(t, err)

	post("forged", outbox.NewSecret())
	post("unsigned", "")
	require.Equal(t, 2, rv.scenarioBad())
	n, err = rv.badSignatures()
	require.Equal(t, 2, n)
	require.ErrorIs(t, err, outbox.ErrNoMatch)
	require.Equal(t, 3, led.received(), "failed deliveries still arrive: lost and bad signatures are separate figures")

	rv.reset()
	require.Zero(t, rv.scenarioBad(), "per scenario")
	n, _ = rv.badSignatures()
	require.Equal(t, 2, n, "per run")
}

func TestOptions(t *testing.T) {
	t.Parallel()
	o := Options{}.WithDefaults()
	names, err := o.validate()
	require.NoError(t, err)
	require.Equal(t, []string{"latency", "catchup"}, names)
	require.Equal(t, RateDefault, o.Rate)
	require.Equal(t, WarmupDefault, o.Warmup)

	_, err = Options{Scenarios: "latency,nope"}.WithDefaults().validate()
	require.ErrorContains(t, err, `"nope"`)
	_, err = Options{Rate: -1}.WithDefaults().validate()
	require.Error(t, err)
}

// TestRun runs a small latency scenario and catch-up end to end, with the
// relay as its own process: nothing lost, every signature good. The floors
// run first, before the relay has made its schema, and none of their
// events reaches the relay. (The load scenario adds a baseline run and a
// drain; it is left to `postbox bench`. Its floor, with no relay, is
// short.)
func TestRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts the relay process three times")
	}
	opts := Options{
		Scenarios:   "load-floor,floor,latency,catchup,catchup-bulk",
		Rate:        50,
		Endpoints:   3,
		Duration:    2 * time.Second,
		Warmup:      time.Second,
		Backlog:     300,
		DatabaseURL: pgtest.NewDatabase(t),
		// Weighs the floor's walsender (load-floor alone takes it).
		WalsenderNice: 3,
	}
	// The bare client runs as a process of its own, as a relay does.
	opts.RelayBinary = buildPostbox(t)
	opts.BareClientBinary = opts.RelayBinary
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts, t.Output())
	require.NoError(t, err)

	requireEachOnce(t, "latency", res.Latency)
	requireEachOnce(t, "floor", res.Floor)
	require.Equal(t, "batch", res.CPUScheduling, "the relay's default")
	// Each scenario leaves the tables empty for the next.
	pool, err := pgxpool.New(ctx, opts.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM postbox.events) + (SELECT count(*) FROM postbox.deliveries) + (SELECT count(*) FROM postbox.outbox)`).Scan(&left))
	require.Zero(t, left, "rows left after the last scenario")
	// The warm-up's events are delivered and checked, and measured in no
	// other figure: 50 of them, then the run's 100.
	for _, l := range []*LatencyResult{res.Latency, res.Floor} {
		require.Equal(t, 50, l.WarmupSent)
		require.Equal(t, 100, l.Sent)
		require.LessOrEqual(t, l.Split.Streamed, l.Sent)
	}
	// The relay's histograms were read: its ingest observed the rows it
	// streamed (the last ones may be observed after they arrived).
	sp := res.Latency.Split
	require.NotNil(t, sp, "the relay's /metrics read at the start and the end")
	require.Greater(t, sp.Streamed, res.Latency.Sent/2)
	require.LessOrEqual(t, sp.Streamed, res.Latency.Sent)
	require.Positive(t, sp.CommitToStreamP99ms)
	require.Positive(t, sp.CommitToSendP99ms, "the server's share, from its histogram")
	// The floor splits its latency from its own timings: the server's send
	// comes after the commit and before the bare client has the row.
	fs := res.Floor.Split
	require.NotNil(t, fs, "the bare client's timings")
	require.Greater(t, fs.Streamed, res.Floor.Sent/2)
	require.Positive(t, fs.CommitToSendP50ms)
	require.LessOrEqual(t, fs.CommitToSendP50ms, fs.CommitToStreamP50ms)
	require.Positive(t, fs.StreamToAttemptP99ms)

	// The floor under load: every event the producers committed arrived
	// once, its latency split by the bare client's own timings.
	lf := res.LoadFloor
	require.NotNil(t, lf)
	require.Equal(t, 3, lf.WalsenderNice, "the walsender found by its slot and weighed")
	require.Positive(t, lf.Sent)
	require.Zero(t, lf.Lost)
	require.Zero(t, lf.Dups)
	require.Zero(t, lf.BadSignatures)
	require.Positive(t, lf.P50ms)
	require.Equal(t, lf.Received, lf.Measured, "a latency for every event received")
	require.InDelta(t, float64(lf.Sent)/lf.Seconds, lf.InsertsPerS, lf.InsertsPerS/2)
	require.NotNil(t, lf.Split)
	require.LessOrEqual(t, lf.Split.CommitToSendP50ms, lf.Split.CommitToStreamP50ms)
	require.NotNil(t, lf.Costs)
	// The bare client's process's CPU is counted where a relay's is (at
	// the floor's 100 events, it may be under the clock's tick).
	require.Positive(t, lf.Costs.RelayCPUms, "the bare client's process")

	c := res.Catchup
	require.NotNil(t, c)
	require.Equal(t, 300, c.Backlog)
	require.Equal(t, 1, c.EventsPerTransaction, "as an application commits its events")
	require.Equal(t, ProducersDefault, c.Producers)
	cb := res.CatchupBulk
	require.NotNil(t, cb)
	require.Equal(t, catchupBulkRows, cb.EventsPerTransaction)
	require.Zero(t, cb.Lost)
	require.Zero(t, cb.Dups)
	require.Zero(t, c.Lost)
	require.Zero(t, c.Dups)
	require.Zero(t, c.BadSignatures)
	require.Zero(t, c.Unacknowledged)
	// Every event was written at least as an event row and a delivery row
	// (the statistics are the whole server's: other tests only add).
	require.NotNil(t, c.Costs)
	// PostgreSQL 14 has no pg_walinspect, and its statistics collector
	// may report the run's records and rows after the run.
	if !strings.Contains(res.Machine, "PostgreSQL 14.") {
		require.GreaterOrEqual(t, c.Costs.WALRecordsPerEvent, 2.0)
		require.GreaterOrEqual(t, c.Costs.RowsPerEvent, 2.0)
	}
	// The relay's threads were woken, each wake-up some time runnable
	// before it ran; a given database's walsender is not the bench's to
	// read.
	require.Positive(t, c.Costs.RelayWaitms)
	require.Zero(t, c.Costs.WalsenderWaitms)

	var out strings.Builder
	res.Print(&out)
	require.Contains(t, out.String(), "lost 0, duplicates 0, bad signatures 0")
	require.Contains(t, out.String(), "the floor under load")
	require.Contains(t, out.String(), "ms bare client")
	require.Contains(t, out.String(), "written one event a transaction by 8 producers")
	require.Contains(t, out.String(), "written in transactions of 1000 events")
	require.Contains(t, out.String(), "measured/received 100/100")
}

// TestServeBareClientWantsASetup: a bare client process given no setup,
// or one it cannot read, says so and starts nothing.
func TestServeBareClientWantsASetup(t *testing.T) {
	var out strings.Builder
	require.ErrorContains(t, ServeBareClient(context.Background(), strings.NewReader(""), &out), "no setup")
	require.ErrorContains(t, ServeBareClient(context.Background(), strings.NewReader("{\n"), &out), "read the setup")
	err := ServeBareClient(context.Background(), strings.NewReader(`{"secret":"not a secret"}`+"\n"), &out)
	require.Error(t, err)
	require.Contains(t, out.String(), `"error"`, "the bench is told why")
}

// requireEachOnce: a latency-shaped scenario ran, and every event it sent
// arrived once, well signed, with a latency measured.
func requireEachOnce(t *testing.T, name string, l *LatencyResult) {
	t.Helper()
	require.NotNil(t, l, name)
	require.Positive(t, l.Sent, name)
	require.Equal(t, l.Sent, l.Received, name)
	require.Equal(t, l.Received, l.Measured, name)
	require.Zero(t, l.Lost, name)
	require.Zero(t, l.Dups, name)
	require.Zero(t, l.BadSignatures, name)
	require.Positive(t, l.P50ms, name)
}

// TestChaos runs the chaos scenario for a minute with a fixed seed: three
// relays killed, frozen, cut off by PostgreSQL restarts, a dropped slot and
// a read-only database, under load. No committed event may be lost, and
// the duplicates stay within the deliveries that were in flight at the
// faults.
func TestChaos(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs three relays for a minute while injecting faults")
	}
	opts := Options{
		Scenarios:   "chaos",
		Duration:    time.Minute,
		Seed:        12,
		RelayBinary: buildPostbox(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts, t.Output())
	if res != nil && res.Chaos != nil && len(res.Chaos.LostWhere) > 0 {
		t.Logf("lost events, by where postbox has them: %v", res.Chaos.LostWhere)
	}
	require.NoError(t, err)

	c := res.Chaos
	require.NotNil(t, c)
	require.Equal(t, uint64(12), c.Seed)
	kinds := map[string]bool{}
	for _, f := range c.Faults {
		t.Logf("%5.1f s %-17s in flight %d before, %d arrived during, %d in flight after, %d arrived unrecorded, %d exposed; %d duplicates, bound %d", f.AtSeconds, f.Kind, f.InFlight, f.During, f.InFlightAfter, f.Unrecorded, f.Exposed, f.Dups, f.dupBound())
	}
	for _, f := range c.Faults {
		require.Empty(t, f.Error, "%s at %.1f s", f.Kind, f.AtSeconds)
		kinds[f.Kind] = true
	}
	require.Len(t, kinds, len(faultKinds), "every kind of fault once: %v", kinds)
	require.Positive(t, c.Sent)
	require.Zero(t, c.Lost)
	require.Zero(t, c.BadSignatures)
	t.Logf("measured/received %d/%d; steady endpoints' longest %.0f ms, bound %.0f ms", c.Measured, c.Received, c.HealthyMaxms, c.SteadyBoundms)
	require.True(t, c.DupsWithin, "each fault's duplicates within the attempts in flight at it")
	for _, f := range c.Faults {
		require.LessOrEqual(t, f.Dups, f.dupBound(), "%s at %.1f s", f.Kind, f.AtSeconds)
	}
	require.Zero(t, c.DupsBeforeFaults)
	require.Equal(t, c.Received, c.Measured, "a latency for every event received, reconciled ones too")
	require.Positive(t, c.HealthyP99ms, "the steady endpoints' latencies were read")
	require.LessOrEqual(t, c.HealthyMaxms, c.SteadyBoundms, "the steady endpoints' events within the stated bound")
}

// buildPostbox builds the postbox binary, which the bench runs as the
// relay (in `postbox bench` it is the running executable itself).
func buildPostbox(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "postbox")
	out, err := exec.Command("go", "build", "-o", path, "github.com/postbox-relay/postbox/cmd/postbox").CombinedOutput()
	require.NoError(t, err, fmt.Sprintf("go build: %s", out))
	return path
}

// TestDumpWALRecords: the WAL records between two LSNs are written per
// kind and relation, per event: ten rows into a table with a primary key
// are ten heap inserts and ten index entries.
func TestDumpWALRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	require.NoError(t, err)
	defer pool.Close()
	needsMajor(t, pool, 15, "pg_walinspect")
	e := &env{pool: pool, log: t.Output()}
	_, err = pool.Exec(ctx, `CREATE TABLE walrec_probe (id int PRIMARY KEY, v text)`)
	require.NoError(t, err)
	lsn := func() int64 {
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&n))
		return n
	}
	from := lsn()
	_, err = pool.Exec(ctx, `INSERT INTO walrec_probe SELECT i, 'x' FROM generate_series(1, 10) i`)
	require.NoError(t, err)
	to := lsn()
	path := filepath.Join(t.TempDir(), "wal.txt")
	e.dumpWALRecords(ctx, path, "probe", from, to, 10)
	out, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(out), "\n")
	find := func(kind, rel string) string {
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) >= 6 && strings.Join(f[3:5], " ") == kind && f[5] == rel {
				return l
			}
		}
		t.Fatalf("no %s of %s in\n%s", kind, rel, out)
		return ""
	}
	for _, l := range []string{find("Heap INSERT", "walrec_probe"), find("Btree INSERT_LEAF", "walrec_probe_pkey")} {
		// Ten records, one per event (the first may have started the page).
		f := strings.Fields(l)
		n, err := strconv.Atoi(f[0])
		require.NoError(t, err)
		require.InDelta(t, 10, n, 1, l)
	}
}

// TestSplitCountsBetweenReadings: a split counts only what the relay's
// histogram observed between the scenario's two readings, and bounds each
// quantile by its bucket.
// A backend reports its WAL records to pg_stat_wal late (at the end of a
// busy second, or when it exits), so what one wrote before a run began can
// be reported during it. The run's costs count the records in its own WAL.
// Not parallel: the WAL is the server's, and other tests' records would
// count.
func TestCostsCountTheRunsOwnWALRecords(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	needsMajor(t, pool, 15, "pg_walinspect, and pg_stat_wal reported when a backend exits (14's collector reports later)")
	e := &env{pool: pool, log: t.Output()}
	_, err = pool.Exec(ctx, `CREATE TABLE early (id int PRIMARY KEY); CREATE TABLE probe (id int PRIMARY KEY)`)
	require.NoError(t, err)

	// Before the run: a backend's first transaction reports at once, a
	// second one just after it waits (up to ten seconds while it idles).
	before, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	var pid int
	require.NoError(t, before.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = before.Exec(ctx, `INSERT INTO early VALUES (0)`)
	require.NoError(t, err)
	_, err = before.Exec(ctx, `INSERT INTO early SELECT generate_series(1, 2000)`)
	require.NoError(t, err)

	read := func() meter {
		m := meter{written: e.written(ctx)}
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&m.wal))
		return m
	}
	from := read()
	_, err = pool.Exec(ctx, `INSERT INTO probe SELECT generate_series(1, 10)`)
	require.NoError(t, err)
	// The earlier backend exits during the run, and reports.
	closeAndWaitGone(t, pool, before, pid)
	to := read()

	byStats := float64(e.written(ctx).walRecords-from.written.walRecords) / 10
	require.Greater(t, byStats, 100.0, "pg_stat_wal charges the run the earlier backend's 4,000 records")
	c := e.costs(ctx, from, to, 10)
	require.NotNil(t, c)
	// Ten heap and ten index records, a commit, and what the server adds.
	require.InDelta(t, 2.1, c.WALRecordsPerEvent, 1, "%+v", c)
}

func TestSplitCountsBetweenReadings(t *testing.T) {
	t.Parallel()
	hist := func(total uint64, cum ...uint64) *dto.Histogram {
		bounds := []float64{0.001, 0.01, 0.05, 0.1}
		h := &dto.Histogram{SampleCount: &total}
		for i, c := range cum {
			h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: &bounds[i], CumulativeCount: &c})
		}
		return h
	}
	// Before the scenario: 10 fast rows. During it: 100 more, 60 of them
	// within 1 ms, 30 within 10 ms, 9 within 50 ms, 1 above 100 ms.
	from := histograms{commitToStreamMetric: hist(10, 10, 10, 10, 10)}
	to := histograms{commitToStreamMetric: hist(110, 70, 100, 109, 109), commitToSendMetric: hist(100, 90, 99, 100, 100)}
	s := splitBetween(from, to)
	require.NotNil(t, s)
	require.Equal(t, 100, s.Streamed)
	require.Equal(t, 1.0, s.CommitToStreamP50ms)
	require.Equal(t, 50.0, s.CommitToStreamP99ms)
	require.InDelta(t, 0.01, s.StreamedOver50ms, 1e-9)
	require.Equal(t, 1.0, s.CommitToSendP50ms, "the server's share, counted from the relay's start (no earlier reading)")
	require.Equal(t, 10.0, s.CommitToSendP99ms)
	require.Zero(t, s.SentOver50ms)
	require.True(t, math.IsInf(bucketsBetween(from[commitToStreamMetric], to[commitToStreamMetric]).quantileMS(1), 1), "the slowest is above every bound")
	require.Nil(t, splitBetween(nil, to), "no reading at the start: no split")

	require.InDelta(t, 0.4, shareOver([]float64{1, 20, 50, 51, 90}, 50), 1e-9, "50 itself is not over")
}

// The costs count the WAL's flushes: each commit that waits for its flush
// makes one (with fsync on), and commits that do not wait make few. A
// server of its own, as the bench starts (fsync on), where nothing else
// runs.
func TestCostsCountTheWALFlushes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Options{Fsync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	url, err := cluster.CreateDatabase(ctx, "flushes")
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	needsMajor(t, pool, 15, "pg_stat_wal reported when a backend exits (14's collector reports later)")
	e := &env{pool: pool, log: t.Output()}
	_, err = pool.Exec(ctx, `CREATE TABLE probe (id int PRIMARY KEY)`)
	require.NoError(t, err)

	// A backend reports its statistics at the latest when it exits.
	commits := func(settings string) float64 {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		var pid int
		_, err = conn.Exec(ctx, settings)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		from := meter{written: e.written(ctx)}
		for i := range 20 {
			_, err := conn.Exec(ctx, `INSERT INTO probe VALUES ($1) ON CONFLICT (id) DO UPDATE SET id = excluded.id`, i)
			require.NoError(t, err)
		}
		closeAndWaitGone(t, pool, conn, pid)
		return costs(from, from, e.written(ctx), 20).WALFlushesPerEvent
	}
	waited := commits("SET synchronous_commit = on")
	require.GreaterOrEqual(t, waited, 1.0, "each commit flushed")
	unwaited := commits("SET synchronous_commit = off")
	require.Less(t, unwaited, 0.5, "the WAL writer flushes a few commits together")
	t.Logf("WAL flushes per commit: %.2f waiting for the flush, %.2f not", waited, unwaited)
}

// needsMajor skips a test of what the server's statistics or extensions
// give from major version min on.
func needsMajor(t *testing.T, pool *pgxpool.Pool, min int, what string) {
	t.Helper()
	var major int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major))
	if major < min {
		t.Skipf("PostgreSQL %d: needs %d or newer for %s", major, min, what)
	}
}

// closeAndWaitGone closes conn and waits until its backend, pid, has
// exited: it has then reported its statistics.
func closeAndWaitGone(t *testing.T, pool *pgxpool.Pool, conn *pgx.Conn, pid int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, waitFor(ctx, 10*time.Second, 10*time.Millisecond, func() (bool, error) {
		var gone bool
		err := pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone)
		return gone, err
	}))
}

// TestRelayConfigNamesSchedulingOnlyWhenNormal: the relays' configuration
// leaves cpu_scheduling to its default (batch), which a build from before
// the key also reads; --cpu-scheduling normal writes it, and the relay's
// configuration takes it.
func TestRelayConfigNamesSchedulingOnlyWhenNormal(t *testing.T) {
	t.Parallel()
	secret := outbox.NewSecret()
	e := &env{dbURL: "postgres://bench@localhost/bench", slot: "postbox", secret: secret, recv: newReceiver(secret)}
	defer e.recv.Close()
	for _, tc := range []struct {
		scheduling string
		batch      bool
	}{{"", true}, {"batch", true}, {"normal", false}} {
		e.cpuScheduling = tc.scheduling
		// The latency, load and catch-up relays', the chaos relays' and
		// the scale scenario's alike.
		for _, text := range []string{e.config(2), e.chaosConfig(2), e.scaleConfig(2)} {
			require.Equal(t, !tc.batch, strings.Contains(text, "cpu_scheduling"), tc.scheduling)
			cfg, err := config.Parse([]byte(text))
			require.NoError(t, err, text)
			require.Equal(t, tc.batch, cfg.CPUBatch, tc.scheduling)
			require.Len(t, cfg.Secrets, 1, "signed as in production")
			require.False(t, cfg.Messages, "outbox_messages only with --emit")
		}
	}
	e.emit = true
	for _, text := range []string{e.config(2), e.chaosConfig(2), e.scaleConfig(2)} {
		cfg, err := config.Parse([]byte(text))
		require.NoError(t, err, text)
		require.True(t, cfg.Messages, "--emit: the relays deliver outbox.Emit's events")
	}
}

// TestSplitJSONAboveTheLastBound: a split quantile above the histograms'
// last bound (+Inf) is written as null, and the rest as numbers; JSON has
// no infinity, and the encoder refused the whole document.
func TestSplitJSONAboveTheLastBound(t *testing.T) {
	t.Parallel()
	doc, err := json.Marshal(Result{Storm: &StormResult{Beside: &LatencyResult{Split: &Split{Streamed: 3, CommitToStreamP50ms: 2.5, CommitToStreamP99ms: math.Inf(1)}}}})
	require.NoError(t, err)
	var back struct {
		Storm struct {
			Beside struct {
				Split map[string]any `json:"split"`
			} `json:"beside_storm"`
		} `json:"storm"`
	}
	require.NoError(t, json.Unmarshal(doc, &back))
	sp := back.Storm.Beside.Split
	require.Contains(t, sp, "commit_to_stream_p99_ms_at_most")
	require.Nil(t, sp["commit_to_stream_p99_ms_at_most"])
	require.Equal(t, 2.5, sp["commit_to_stream_p50_ms_at_most"])
	require.Equal(t, float64(3), sp["streamed"])
}
