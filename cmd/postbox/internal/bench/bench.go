package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// Defaults of Options, which are also `postbox bench`'s flag defaults.
const (
	ScenariosDefault = "latency,catchup"
	RateDefault      = 200
	EndpointsDefault = 10
	DurationDefault  = 20 * time.Second
	// WarmupDefault is how long the latency scenarios produce before they
	// measure (Options.Warmup).
	WarmupDefault    = 2 * time.Second
	BacklogDefault   = 100000
	ProducersDefault = 8
)

// scenarios are the names Options.Scenarios may list.
var scenarios = []string{"latency", "floor", "hanging", "failing", "catchup", "catchup-bulk", "load", "load-floor", "chaos", "soak", "dead", "scale", "storm", "partners"}

// ErrBadSignatures is returned by Run, with the figures, when a delivery
// failed outbox.Verify.
var ErrBadSignatures = errors.New("deliveries failed signature verification")

// ErrLost is returned by Run, with the figures, when a committed event was
// never delivered.
var ErrLost = errors.New("committed events were never delivered")

// ErrUnmeasured is returned by Run, with the figures, when a scenario that
// measures commit → delivery has events it received without a latency:
// its percentiles would leave them out.
var ErrUnmeasured = errors.New("received events without a commit → delivery latency")

// ErrDuplicates is returned by Run, with the figures, when a scenario's
// duplicates exceed their bound: none without a fault, and for each chaos
// fault the attempts in flight at it (Fault.dupBound).
var ErrDuplicates = errors.New("duplicates above their bound")

// ErrSlow is returned by Run, with the figures, when the chaos scenario's
// steady endpoints took longer than ChaosSteadyWithin.
var ErrSlow = errors.New("steady endpoints' events arrived later than the bound")

// maxRate keeps the latency scenario's pacing interval above zero.
const maxRate = 100000

// Options say what to measure. Zero values take the …Default constants.
type Options struct {
	// Scenarios is a comma-separated list of latency, floor, hanging,
	// failing, catchup, load, load-floor, chaos, soak, dead, scale and
	// storm, run
	// in the order given.
	Scenarios string
	// Rate is the latency and chaos scenarios' events per second; zero
	// means RateDefault, and ChaosRateDefault for chaos.
	Rate int
	// Endpoints is the number of healthy endpoints events are spread over.
	Endpoints int
	// Duration is how long the latency and load scenarios produce.
	Duration time.Duration
	// Warmup is how long the latency scenarios (latency, hanging, floor)
	// produce at their rate before they measure; negative for none. See
	// env.warmUp.
	Warmup time.Duration
	// Backlog is the number of events the catchup scenario queues while
	// the relay is down.
	Backlog int
	// Producers is the number of concurrent producers of the load scenario.
	Producers int
	// Seed seeds the chaos scenario's choice of faults and moments; zero
	// means a random seed (printed, and in the result, to replay the run).
	Seed uint64
	// Faults is a comma-separated list of the chaos scenario's faults to
	// inject (kill, freeze, restart-fast, restart-immediate, drop-slot,
	// read-only); empty means all of them.
	Faults string
	// Relays is how many relays the chaos scenario runs (ChaosRelays when
	// zero).
	Relays int
	// Dead is how many dead endpoints the dead scenario adds (DeadDefault
	// when zero).
	Dead int
	// Storm and StormRate are the storm scenario's failing endpoints and
	// their fresh events a second (StormDefault, StormRateDefault when
	// zero).
	Storm, StormRate int
	// Instances is how many relays the scale scenario runs at most
	// (InstancesDefault when zero): it runs 1, 2, … up to Instances.
	Instances int
	// TableEndpoints is how many rows of postbox.endpoints the partners
	// scenario writes (TableEndpointsDefault when zero).
	TableEndpoints int
	// PartnersParts is a comma-separated list of the partners scenario's
	// parts to run: latency (file against table endpoints), start (the
	// first start, the seed, the restart), caughtup (the first start waits
	// until it has read the rows), follow (the second instance); empty
	// means all of them.
	PartnersParts string
	// Emit has the producers write events with outbox.Emit (WAL messages)
	// instead of outbox rows: latency, catchup, load and scale.
	Emit bool
	// WalsenderNice, when not zero, is the scheduling weight the load and
	// load-floor scenarios give the walsender that streams to the relay
	// (or to the bare client), as a nice value from -20 to 19: under a
	// load that keeps every CPU busy, the walsender waits its turn beside
	// each backend and the relay, and that wait is the tail of the load
	// scenario's latency. The relay is given walsender_nice; the bare
	// client's walsender is weighed by the bench (weighWalsender). The
	// walsender must run on this machine.
	WalsenderNice int
	// CPUScheduling is the relay's cpu_scheduling, batch or normal (empty:
	// batch, the relay's default), and the floor's bare client's when it
	// runs in a process of its own.
	CPUScheduling string
	// FloorInProcess runs the floor scenarios' bare client in the bench's
	// process, beside the receiver, as before it had a process of its own:
	// a floor a little under any relay's (see ServeBareClient), kept to
	// compare with the figures taken so.
	FloorInProcess bool

	// RelayBinary is the postbox binary run as the relay. Empty means this
	// executable, which is what `postbox bench` wants; tests build one.
	RelayBinary string
	// BareClientBinary is the postbox binary run as the floor scenarios'
	// bare client (`postbox bench --serve-bare-client`). Empty means this
	// executable; tests build one.
	BareClientBinary string
	// DatabaseURL, when set, is an empty database (wal_level=logical, a
	// superuser) used instead of starting PostgreSQL with fsync on; the
	// slot then gets a unique name, as the server may be shared.
	DatabaseURL string
	// PG is the major version of the PostgreSQL the bench starts (14 to
	// 18, pgtest finds its binaries); 0 means POSTBOX_TEST_PG's, or the
	// system's.
	PG int
}

// WithDefaults returns o with its zero values replaced by the defaults.
func (o Options) WithDefaults() Options {
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	o.Scenarios = cmp.Or(o.Scenarios, ScenariosDefault)
	o.Rate = cmp.Or(o.Rate, RateDefault)
	o.Endpoints = cmp.Or(o.Endpoints, EndpointsDefault)
	o.Duration = cmp.Or(o.Duration, DurationDefault)
	o.Warmup = cmp.Or(o.Warmup, WarmupDefault)
	o.Backlog = cmp.Or(o.Backlog, BacklogDefault)
	o.Producers = cmp.Or(o.Producers, ProducersDefault)
	o.Relays = cmp.Or(o.Relays, ChaosRelays)
	o.Dead = cmp.Or(o.Dead, DeadDefault)
	o.Instances = cmp.Or(o.Instances, InstancesDefault)
	o.TableEndpoints = cmp.Or(o.TableEndpoints, TableEndpointsDefault)
	o.Storm, o.StormRate = cmp.Or(o.Storm, StormDefault), cmp.Or(o.StormRate, StormRateDefault)
	return o
}

// choices splits a comma-separated list and checks each entry against
// allowed; what names the entries in errors.
func choices(what, list string, allowed []string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allowed, s) {
			return nil, fmt.Errorf("unknown %s %q (want %s)", what, s, strings.Join(allowed, ", "))
		}
		out = append(out, s)
	}
	return out, nil
}

// validate checks o after WithDefaults and returns its scenarios.
func (o Options) validate() ([]string, error) {
	names, err := choices("scenario", o.Scenarios, scenarios)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Rate < 0 || o.Rate > maxRate:
		return nil, fmt.Errorf("rate: want 1 to %d events/s, got %d", maxRate, o.Rate)
	case o.Endpoints < 0:
		return nil, fmt.Errorf("endpoints: want at least 1, got %d", o.Endpoints)
	case o.Duration < 0:
		return nil, fmt.Errorf("duration: want a positive duration, got %s", o.Duration)
	case o.Backlog < 0:
		return nil, fmt.Errorf("backlog: want at least 1 event, got %d", o.Backlog)
	case o.Producers < 0:
		return nil, fmt.Errorf("producers: want at least 1, got %d", o.Producers)
	case slices.Contains(names, "chaos") && o.Endpoints < 2:
		return nil, fmt.Errorf("endpoints: chaos wants at least 2 (one of them flaps), got %d", o.Endpoints)
	case (slices.Contains(names, "floor") || slices.Contains(names, "load-floor")) && o.Emit:
		return nil, errors.New("floor, load-floor: the bare client reads outbox rows only, not outbox.Emit's messages")
	case o.TableEndpoints < 0 || slices.Contains(names, "partners") && o.TableEndpoints < o.Endpoints:
		return nil, fmt.Errorf("table-endpoints: want at least --endpoints (%d), got %d", o.Endpoints, o.TableEndpoints)
	case o.PartnersParts != "" && !validParts(o.PartnersParts):
		return nil, fmt.Errorf("partners-parts: want a comma-separated list of %s, got %q", strings.Join(partnersParts, ", "), o.PartnersParts)
	case slices.Contains(names, "partners") && o.Emit:
		return nil, errors.New("partners: the second instance's events are outbox rows; leave out --emit")
	case o.Relays < 0 || o.Relays > 16:
		return nil, fmt.Errorf("relays: want 1 to 16, got %d", o.Relays)
	case o.CPUScheduling != "" && o.CPUScheduling != "batch" && o.CPUScheduling != "normal":
		return nil, fmt.Errorf("cpu-scheduling: want batch or normal, got %q", o.CPUScheduling)
	case o.WalsenderNice < -20 || o.WalsenderNice > 19:
		return nil, fmt.Errorf("walsender-nice: want -20 to 19, got %d", o.WalsenderNice)
	}
	if _, err := o.faultKinds(); err != nil {
		return nil, err
	}
	return names, nil
}

// Result is what `postbox bench` measured; a scenario not run is nil.
type Result struct {
	Machine string         `json:"machine"`
	Latency *LatencyResult `json:"latency,omitempty"`
	// Floor is the latency scenario without the relay (see floor).
	Floor   *LatencyResult `json:"latency_floor_without_relay,omitempty"`
	Hanging *LatencyResult `json:"latency_with_hanging_endpoint,omitempty"`
	Failing *FailingResult `json:"failing_endpoint,omitempty"`
	Catchup *CatchupResult `json:"catchup,omitempty"`
	// CatchupBulk is the catch-up of a backlog written in transactions of
	// catchupBulkRows rows (catchup-bulk).
	CatchupBulk *CatchupResult `json:"catchup_bulk,omitempty"`
	Load        *LoadResult    `json:"load,omitempty"`
	// LoadFloor is the load scenario without the relay (see loadFloor).
	LoadFloor *LoadResult  `json:"load_floor_without_relay,omitempty"`
	Chaos     *ChaosResult `json:"chaos,omitempty"`
	Soak      *SoakResult  `json:"soak,omitempty"`
	Dead      *DeadResult  `json:"dead_endpoints,omitempty"`
	Scale     *ScaleResult `json:"scale,omitempty"`
	Storm     *StormResult `json:"storm,omitempty"`
	// Partners is endpoints as rows of postbox.endpoints at scale.
	Partners *PartnersResult `json:"partners,omitempty"`
	// Emit says the events were written with outbox.Emit, not as rows.
	Emit bool `json:"emit,omitempty"`
	// CPUScheduling is the relay's cpu_scheduling (Options.CPUScheduling).
	CPUScheduling string `json:"cpu_scheduling"`
}

// LoadResult is the load scenario's.
type LoadResult struct {
	Producers      int     `json:"producers"`
	Endpoints      int     `json:"endpoints"`
	Seconds        float64 `json:"seconds"`
	BaselinePerS   float64 `json:"inserts_per_s_without_relay"`
	InsertsPerS    float64 `json:"inserts_per_s"`
	DeliveriesPerS float64 `json:"deliveries_per_s"`
	MaxLag         int     `json:"max_lag_events"`
	LagAtEnd       int     `json:"lag_at_end_events"`
	DrainSeconds   float64 `json:"drain_seconds_after_load"`
	P50ms          float64 `json:"p50_ms"`
	P99ms          float64 `json:"p99_ms"`
	// Over50ms is the share of events that arrived more than 50 ms after
	// their commit.
	Over50ms float64 `json:"over_50ms_share"`
	Sent     int     `json:"sent"`
	// Received is the distinct events received, and Measured those with a
	// latency: all of them, or the run fails (Result.check).
	Received       int     `json:"received"`
	Measured       int     `json:"measured"`
	Lost           int     `json:"lost"`
	Dups           int     `json:"duplicates"`
	Unacknowledged int     `json:"unacknowledged_delivered"`
	BadSignatures  int     `json:"bad_signatures"`
	RSSMB          float64 `json:"relay_peak_rss_mb"`
	// Costs are from the first insert until the last arrival: the
	// producers' work is in the bench's CPU and the WAL.
	Costs *Costs `json:"costs,omitempty"`
	Split *Split `json:"split,omitempty"`
	// WalsenderNice is the scheduling weight the walsender was given
	// (Options.WalsenderNice); zero when it was left as it was.
	WalsenderNice int `json:"walsender_nice,omitempty"`

	loadEnd time.Time // when the producers stopped
}

// FailingResult is the failing scenario's.
type FailingResult struct {
	Queued        int     `json:"queued"`
	Seconds       float64 `json:"seconds"`
	Requests      int64   `json:"requests"`
	Threshold     int     `json:"failure_threshold"`
	State         string  `json:"breaker_state"`
	BadSignatures int     `json:"bad_signatures"`
}

// LatencyResult is the latency and hanging scenarios'.
type LatencyResult struct {
	Rate      int  `json:"rate_per_s"`
	Endpoints int  `json:"endpoints"`
	Hanging   bool `json:"one_endpoint_hanging"`
	Sent      int  `json:"sent"`
	Received  int  `json:"received"`
	// Measured is the received events with a latency: all of them, or the
	// run fails (Result.check).
	Measured       int     `json:"measured"`
	Lost           int     `json:"lost"`
	Dups           int     `json:"duplicates"`
	Unacknowledged int     `json:"unacknowledged_delivered"`
	BadSignatures  int     `json:"bad_signatures"`
	P50ms          float64 `json:"p50_ms"`
	P90ms          float64 `json:"p90_ms"`
	P99ms          float64 `json:"p99_ms"`
	Maxms          float64 `json:"max_ms"`
	// The warm-up before the measured run (env.warmUp): its events are
	// in no other figure but Lost, Dups and BadSignatures.
	WarmupSeconds float64 `json:"warmup_s"`
	WarmupSent    int     `json:"warmup_sent"`
	RSSMB         float64 `json:"relay_peak_rss_mb"`
	// Costs are from the first insert until the last arrival.
	Costs *Costs `json:"costs,omitempty"`
	Split *Split `json:"split,omitempty"`
	// Disk is the floor's alone, when the bench started the cluster.
	Disk *DiskFlush `json:"disk_flush,omitempty"`
}

// CatchupResult is the catchup and catchup-bulk scenarios'.
type CatchupResult struct {
	Backlog int `json:"backlog"`
	// EventsPerTransaction is how the backlog was written: 1 (catchup,
	// as an application commits its events) or catchupBulkRows
	// (catchup-bulk), by Producers producers.
	EventsPerTransaction int     `json:"events_per_transaction"`
	Producers            int     `json:"producers"`
	Endpoints            int     `json:"endpoints"`
	Seconds              float64 `json:"seconds_from_start"`
	DrainSeconds         float64 `json:"seconds_first_to_last"`
	Rate                 float64 `json:"deliveries_per_s"`
	DrainRate            float64 `json:"drain_per_s"`
	Lost                 int     `json:"lost"`
	Dups                 int     `json:"duplicates"`
	Unacknowledged       int     `json:"unacknowledged_delivered"`
	BadSignatures        int     `json:"bad_signatures"`
	RSSMB                float64 `json:"relay_peak_rss_mb"`
	// Costs are from the relay's start until the last arrival: the
	// backlog was inserted before.
	Costs *Costs `json:"costs,omitempty"`
}

// statementsFile, from POSTBOX_BENCH_STATEMENTS, is where a bench that
// starts its own PostgreSQL writes the statements that cost it most
// (pg_stat_statements over the whole run): run one scenario at a time to
// see where each spends.
var statementsFile = os.Getenv("POSTBOX_BENCH_STATEMENTS")

// dumpStatements writes the 25 statements that took the most time,
// planning and execution together: a statement planned each time it runs
// can cost the server more to plan than to run.
func (e *env) dumpStatements(ctx context.Context, path string) {
	rows, err := e.pool.Query(ctx, `
		SELECT calls, rows, round(total_exec_time::numeric, 1), round(total_plan_time::numeric, 1), round((total_exec_time / greatest(calls, 1))::numeric, 3),
		       round(max_exec_time::numeric, 1), shared_blks_dirtied, wal_records, wal_bytes, left(regexp_replace(query, '\s+', ' ', 'g'), 160)
		FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25`)
	if err != nil {
		fmt.Fprintf(e.log, "bench: pg_stat_statements: %v\n", err)
		return
	}
	defer rows.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%8s %9s %10s %9s %8s %8s %8s %9s %11s  query\n", "calls", "rows", "total_ms", "plan_ms", "mean_ms", "max_ms", "dirtied", "wal_recs", "wal_bytes")
	for rows.Next() {
		var calls, n, dirtied, recs int64
		var total, plan, mean, most float64
		var walBytes float64
		var q string
		if err := rows.Scan(&calls, &n, &total, &plan, &mean, &most, &dirtied, &recs, &walBytes, &q); err != nil {
			fmt.Fprintf(e.log, "bench: pg_stat_statements: %v\n", err)
			return
		}
		fmt.Fprintf(&b, "%8d %9d %10.1f %9.1f %8.3f %8.1f %8d %9d %11.0f  %s\n", calls, n, total, plan, mean, most, dirtied, recs, walBytes, q)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}

// walRecordsFile, from POSTBOX_BENCH_WALRECORDS, is where the latency,
// catch-up and load scenarios append what kinds of WAL record their events cost,
// and of which relation (pg_walinspect, PostgreSQL 15 and later): every
// index entry is a record, and the walsender pays for each.
var walRecordsFile = os.Getenv("POSTBOX_BENCH_WALRECORDS")

// walinspect installs pg_walinspect (PostgreSQL 15 and later), which reads
// the WAL between two LSNs.
func (e *env) walinspect(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	return err
}

// dumpWALRecords appends to path the WAL records of scenario between the
// LSNs from and to (bytes since 0/0), per event, by resource manager, record
// type and relation.
func (e *env) dumpWALRecords(ctx context.Context, path, scenario string, from, to int64, events int) {
	if path == "" || events == 0 {
		return
	}
	if err := e.walinspect(ctx); err != nil {
		fmt.Fprintf(e.log, "bench: pg_walinspect: %v\n", err)
		return
	}
	rows, err := e.pool.Query(ctx, `
		WITH r AS (
		  SELECT resource_manager || ' ' || split_part(record_type, ' ', 1) AS kind,
		         regexp_match(block_ref, 'rel \d+/(\d+)/(\d+)') AS rel, fpi_length
		  FROM pg_get_wal_records_info('0/0'::pg_lsn + $1::numeric, '0/0'::pg_lsn + $2::numeric)
		)
		SELECT kind,
		       CASE WHEN r.rel IS NULL THEN ''
		            WHEN r.rel[1]::oid <> (SELECT oid FROM pg_database WHERE datname = current_database()) THEN '(another database)'
		            ELSE coalesce(c.relname::text, r.rel[2]) END,
		       count(*), count(*) FILTER (WHERE fpi_length > 0)
		FROM r LEFT JOIN pg_class c ON c.relfilenode = r.rel[2]::oid
		GROUP BY 1, 2 ORDER BY 3 DESC`, from, to)
	if err != nil {
		fmt.Fprintf(e.log, "bench: pg_walinspect: %v\n", err)
		return
	}
	defer rows.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: %d events\n%10s %8s %8s  %-22s %s\n", scenario, events, "records", "/event", "with FPI", "kind", "relation")
	for rows.Next() {
		var kind, rel string
		var n, fpi int64
		if err := rows.Scan(&kind, &rel, &n, &fpi); err != nil {
			fmt.Fprintf(e.log, "bench: pg_walinspect: %v\n", err)
			return
		}
		fmt.Fprintf(&b, "%10d %8.2f %8d  %-22s %s\n", n, float64(n)/float64(events), fpi, kind, rel)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(e.log, "bench: %v\n", err)
		return
	}
	_, _ = f.WriteString(b.String())
	_ = f.Close()
}

// Run measures the scenarios of opts, writing progress (and the relay's
// own output) to progress. When a delivery failed signature verification
// it returns the figures together with an error wrapping ErrBadSignatures.
func Run(ctx context.Context, opts Options, progress io.Writer) (*Result, error) {
	chaosRate := opts.Rate
	if chaosRate == 0 {
		chaosRate = ChaosRateDefault
	}
	opts = opts.WithDefaults()
	names, err := opts.validate()
	if err != nil {
		return nil, err
	}
	if slices.Contains(names, "chaos") && opts.DatabaseURL != "" {
		return nil, errors.New("chaos restarts PostgreSQL: it needs its own server, not a given database")
	}
	log := &syncWriter{w: progress}
	env := &env{log: log, relayBinary: opts.RelayBinary, bareBinary: opts.BareClientBinary, floorInProcess: opts.FloorInProcess,
		cpuScheduling: cmp.Or(opts.CPUScheduling, "batch"), emit: opts.Emit, slot: "postbox", watch: watchHost()}
	defer env.watch.stopWatch()
	if opts.DatabaseURL != "" {
		env.dbURL, env.slot = opts.DatabaseURL, pgtest.UniqueName("bench")
	} else {
		fmt.Fprintln(log, "bench: starting PostgreSQL (fsync on)")
		// track_commit_timestamp: an event reconciled from the outbox table
		// has no committed_at, and its row's commit time stands in for it
		// (env.commitTimes).
		popts := pgtest.Options{Fsync: true, Major: opts.PG, Settings: map[string]string{"track_commit_timestamp": "on"}}
		if statementsFile != "" {
			popts.Settings["shared_preload_libraries"] = "pg_stat_statements"
			popts.Settings["pg_stat_statements.track"] = "all"
			popts.Settings["pg_stat_statements.track_planning"] = "on"
		}
		// POSTBOX_BENCH_PGSETTINGS, "name=value;name=value", adds settings
		// to the bench's server: to log its slow statements, autovacuum
		// and checkpoints with their times, for instance.
		for _, kv := range strings.Split(os.Getenv("POSTBOX_BENCH_PGSETTINGS"), ";") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				popts.Settings[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		cluster, err := pgtest.Start(ctx, popts)
		if err != nil {
			return nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		defer cluster.Stop()
		env.cluster = cluster
		if env.dbURL, err = cluster.CreateDatabase(ctx, "bench"); err != nil {
			return nil, err
		}
	}
	if env.pool, err = pgxpool.New(ctx, env.dbURL); err != nil {
		return nil, fmt.Errorf("connect to the bench database: %w", err)
	}
	defer env.pool.Close()
	if statementsFile != "" && env.cluster != nil {
		if _, err := env.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return nil, err
		}
		defer env.dumpStatements(context.WithoutCancel(ctx), statementsFile)
	}
	env.secret = outbox.NewSecret()
	env.recv = newReceiver(env.secret)
	defer env.recv.Close()
	defer close(env.recv.hang) // before Close, which waits for /hang requests
	dir, err := os.MkdirTemp("", "postbox-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	env.cfgPath = filepath.Join(dir, "postbox.yaml")
	// The relay's admin listener, whose /metrics gives the results their
	// Split (without a port, they lack it).
	if port, err := pgtest.FreePort(); err == nil {
		env.admin = fmt.Sprintf("127.0.0.1:%d", port)
	}
	if err := os.WriteFile(env.cfgPath, []byte(env.config(opts.Endpoints)), 0o600); err != nil {
		return nil, fmt.Errorf("write the relay's config: %w", err)
	}

	var version string
	if err := env.pool.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return nil, fmt.Errorf("read the server's version: %w", err)
	}
	res := &Result{Machine: machineDescription(opts.DatabaseURL == "") + ", PostgreSQL " + strings.Fields(version)[0], Emit: opts.Emit, CPUScheduling: env.cpuScheduling}
	for _, s := range names {
		switch s {
		case "latency":
			res.Latency, err = env.latency(ctx, opts, false)
		case "floor":
			res.Floor, err = env.floor(ctx, opts)
		case "hanging":
			res.Hanging, err = env.latency(ctx, opts, true)
		case "failing":
			res.Failing, err = env.failing(ctx)
		case "catchup":
			res.Catchup, err = env.catchup(ctx, opts, 1)
		case "catchup-bulk":
			res.CatchupBulk, err = env.catchup(ctx, opts, catchupBulkRows)
		case "load":
			res.Load, err = env.load(ctx, opts)
		case "load-floor":
			res.LoadFloor, err = env.loadFloor(ctx, opts)
		case "chaos":
			res.Chaos, err = env.chaos(ctx, opts, chaosRate)
		case "soak":
			res.Soak, err = env.soak(ctx, opts)
		case "dead":
			res.Dead, err = env.dead(ctx, opts)
		case "scale":
			res.Scale, err = env.scale(ctx, opts)
		case "storm":
			res.Storm, err = env.storm(ctx, opts)
		case "partners":
			res.Partners, err = env.partners(ctx, opts)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	if n, first := env.recv.badSignatures(); n > 0 {
		return res, fmt.Errorf("%d %w (the first: %w)", n, ErrBadSignatures, first)
	}
	return res, res.check()
}

// check judges a run's figures: it fails on events lost in any scenario,
// on received events without a latency where a scenario measures it, on
// duplicates above their bound (none without a fault; each chaos fault's
// the attempts in flight at it), on the chaos scenario's steady endpoints
// slower than ChaosSteadyWithin, and on a soak that grew.
func (r *Result) check() error {
	var errs []error
	if n := r.lost(); n > 0 {
		errs = append(errs, fmt.Errorf("%d %w", n, ErrLost))
	}
	measured := func(name string, measured, received int) {
		if measured != received {
			errs = append(errs, fmt.Errorf("%s: %w: %d measured of %d received", name, ErrUnmeasured, measured, received))
		}
	}
	unbounded := func(name string, dups int) {
		if dups > 0 {
			errs = append(errs, fmt.Errorf("%s: %d %w (0 without a fault)", name, dups, ErrDuplicates))
		}
	}
	latency := map[string]*LatencyResult{"latency": r.Latency, "floor": r.Floor, "hanging": r.Hanging}
	if r.Dead != nil {
		latency["dead, alone"], latency["dead, beside the dead endpoints"] = r.Dead.Alone, r.Dead.Beside
	}
	if r.Storm != nil {
		latency["storm, alone"], latency["storm, beside the storm"] = r.Storm.Alone, r.Storm.Beside
	}
	if p := r.Partners; p != nil {
		for i := range p.Alone {
			latency[fmt.Sprintf("partners, file endpoints, run %d", i+1)] = p.Alone[i]
		}
		for i := range p.Beside {
			latency[fmt.Sprintf("partners, table endpoints, run %d", i+1)] = p.Beside[i]
		}
	}
	for _, name := range slices.Sorted(maps.Keys(latency)) {
		if l := latency[name]; l != nil {
			measured(name, l.Measured, l.Received)
			unbounded(name, l.Dups)
		}
	}
	for i, l := range []*LoadResult{r.Load, r.LoadFloor} {
		if name := []string{"load", "load-floor"}[i]; l != nil {
			measured(name, l.Measured, l.Received)
			unbounded(name, l.Dups)
		}
	}
	for _, c := range []*CatchupResult{r.Catchup, r.CatchupBulk} {
		if c != nil {
			unbounded(c.name(), c.Dups)
		}
	}
	if r.Soak != nil {
		unbounded("soak", r.Soak.Dups)
	}
	if r.Scale != nil {
		for _, run := range r.Scale.Runs {
			unbounded(fmt.Sprintf("scale, %d instances", run.Instances), run.Dups)
		}
	}
	if c := r.Chaos; c != nil {
		measured("chaos", c.Measured, c.Received)
		if c.DupsBeforeFaults > 0 {
			errs = append(errs, fmt.Errorf("chaos: %d %w, before any fault", c.DupsBeforeFaults, ErrDuplicates))
		}
		for _, f := range c.Faults {
			if f.Dups > f.dupBound() {
				errs = append(errs, fmt.Errorf("chaos: the %s at %.1f s: %d %w of %d, the attempts in flight at it", f.Kind, f.AtSeconds, f.Dups, ErrDuplicates, f.dupBound()))
			}
		}
		if c.HealthyMaxms > c.SteadyBoundms {
			errs = append(errs, fmt.Errorf("chaos: %w: the longest took %.0f ms, the bound is %.0f ms", ErrSlow, c.HealthyMaxms, c.SteadyBoundms))
		}
	}
	if r.Soak != nil {
		errs = append(errs, r.Soak.err())
	}
	return errors.Join(errs...)
}

// syncWriter serialises the bench's progress lines with the relay's output.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// lost is the events lost across the scenarios that count them.
func (r *Result) lost() int {
	n := 0
	for _, l := range []*LatencyResult{r.Latency, r.Hanging} {
		if l != nil {
			n += l.Lost
		}
	}
	for _, c := range []*CatchupResult{r.Catchup, r.CatchupBulk} {
		if c != nil {
			n += c.Lost
		}
	}
	if r.Dead != nil {
		for _, l := range []*LatencyResult{r.Dead.Alone, r.Dead.Beside} {
			if l != nil {
				n += l.Lost
			}
		}
	}
	if r.Floor != nil {
		n += r.Floor.Lost
	}
	if r.LoadFloor != nil {
		n += r.LoadFloor.Lost
	}
	if r.Load != nil {
		n += r.Load.Lost
	}
	if r.Chaos != nil {
		n += r.Chaos.Lost
	}
	if r.Soak != nil {
		n += r.Soak.Lost
	}
	if r.Scale != nil {
		for _, run := range r.Scale.Runs {
			n += run.Lost
		}
	}
	if p := r.Partners; p != nil {
		for _, l := range append(slices.Clip(p.Alone), p.Beside...) {
			n += l.Lost
		}
	}
	return n + r.Storm.lost()
}
