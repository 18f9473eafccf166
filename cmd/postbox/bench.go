package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// benchOptions are `postbox bench` flags.
type benchOptions struct {
	scenarios string
	rate      int
	endpoints int
	duration  time.Duration
	backlog   int
	producers int
	json      bool
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o benchOptions
	fs := flag.NewFlagSet("postbox bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.scenarios, "scenario", "latency,catchup", "comma-separated: latency, hanging, failing, catchup, load")
	fs.IntVar(&o.rate, "rate", 200, "latency: events per second")
	fs.IntVar(&o.endpoints, "endpoints", 10, "number of endpoints")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "latency: how long to produce")
	fs.IntVar(&o.backlog, "backlog", 100000, "catchup: events queued while the relay is down")
	fs.IntVar(&o.producers, "producers", 8, "load: concurrent producers inserting as fast as they can")
	fs.BoolVar(&o.json, "json", false, "print one JSON document")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	res, err := runBench(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "postbox bench:", err)
		return exitFailure
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	} else {
		printBench(stdout, res)
	}
	return exitOK
}

// benchResult is what `postbox bench` measured.
type benchResult struct {
	Machine string         `json:"machine"`
	Latency *latencyResult `json:"latency,omitempty"`
	Hanging *latencyResult `json:"latency_with_hanging_endpoint,omitempty"`
	Failing *failingResult `json:"failing_endpoint,omitempty"`
	Catchup *catchupResult `json:"catchup,omitempty"`
	Load    *loadResult    `json:"load,omitempty"`
}

type loadResult struct {
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
	Sent           int     `json:"sent"`
	Lost           int     `json:"lost"`
	Dups           int     `json:"duplicates"`
	RSSMB          float64 `json:"relay_peak_rss_mb"`
}

type failingResult struct {
	Queued    int     `json:"queued"`
	Seconds   float64 `json:"seconds"`
	Requests  int64   `json:"requests"`
	Threshold int     `json:"failure_threshold"`
	State     string  `json:"breaker_state"`
}

type latencyResult struct {
	Rate      int     `json:"rate_per_s"`
	Endpoints int     `json:"endpoints"`
	Hanging   bool    `json:"one_endpoint_hanging"`
	Sent      int     `json:"sent"`
	Received  int     `json:"received"`
	Lost      int     `json:"lost"`
	Dups      int     `json:"duplicates"`
	P50ms     float64 `json:"p50_ms"`
	P90ms     float64 `json:"p90_ms"`
	P99ms     float64 `json:"p99_ms"`
	Maxms     float64 `json:"max_ms"`
	RSSMB     float64 `json:"relay_peak_rss_mb"`
}

type catchupResult struct {
	Backlog      int     `json:"backlog"`
	Endpoints    int     `json:"endpoints"`
	Seconds      float64 `json:"seconds_from_start"`
	DrainSeconds float64 `json:"seconds_first_to_last"`
	Rate         float64 `json:"deliveries_per_s"`
	DrainRate    float64 `json:"drain_per_s"`
	Lost         int     `json:"lost"`
	Dups         int     `json:"duplicates"`
	RSSMB        float64 `json:"relay_peak_rss_mb"`
}

// benchReceiver records when each event first arrived.
type benchReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	first  map[string]time.Time
	dups   int
	n      atomic.Int64
	failed atomic.Int64  // requests to /fail
	hang   chan struct{} // /hang blocks until closed
}

func newBenchReceiver() *benchReceiver {
	br := &benchReceiver{first: map[string]time.Time{}, hang: make(chan struct{})}
	br.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/hang":
			select {
			case <-br.hang:
			case <-r.Context().Done():
			}
			return
		case "/fail":
			br.failed.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		id := r.Header.Get("webhook-id")
		br.mu.Lock()
		if _, ok := br.first[id]; ok {
			br.dups++
		} else {
			br.first[id] = now
		}
		br.mu.Unlock()
		br.n.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	return br
}

func (br *benchReceiver) distinct() int {
	br.mu.Lock()
	defer br.mu.Unlock()
	return len(br.first)
}

func (br *benchReceiver) reset() {
	br.mu.Lock()
	br.first, br.dups = map[string]time.Time{}, 0
	br.mu.Unlock()
	br.n.Store(0)
}

func (br *benchReceiver) snapshot() (map[string]time.Time, int) {
	br.mu.Lock()
	defer br.mu.Unlock()
	m := make(map[string]time.Time, len(br.first))
	for k, v := range br.first {
		m[k] = v
	}
	return m, br.dups
}

// benchEnv is the bench's PostgreSQL (fsync on), receiver and relay process.
type benchEnv struct {
	cluster *pgtest.Cluster
	dbURL   string
	pool    *pgxpool.Pool
	recv    *benchReceiver
	cfgPath string
	relay   *exec.Cmd
	done    chan struct{}
	log     io.Writer
}

func runBench(ctx context.Context, o benchOptions, log io.Writer) (*benchResult, error) {
	fmt.Fprintln(log, "bench: starting PostgreSQL (fsync on)")
	cluster, err := pgtest.Start(ctx, pgtest.Options{Fsync: true})
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	dbURL, err := cluster.CreateDatabase(ctx, "bench")
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	env := &benchEnv{cluster: cluster, dbURL: dbURL, pool: pool, recv: newBenchReceiver(), log: log}
	defer env.recv.Close()
	defer close(env.recv.hang)
	dir, err := os.MkdirTemp("", "postbox-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var b strings.Builder
	// Deliveries are signed, as in production: the cost is part of the figures.
	fmt.Fprintf(&b, "database_url: %s\nallow_private_targets: true\nadmin_listen: 127.0.0.1:0\nlog_level: warn\n", dbURL)
	fmt.Fprintf(&b, "signing:\n  secrets: [%s]\nendpoints:\n", outbox.NewSecret())
	for i := range o.endpoints {
		fmt.Fprintf(&b, "  ep-%d:\n    url: %s/ep-%d\n", i, env.recv.URL, i)
	}
	// Defaults otherwise: a 15 s timeout, the breaker at 10 failures.
	fmt.Fprintf(&b, "  hang:\n    url: %s/hang\n  fail:\n    url: %s/fail\n", env.recv.URL, env.recv.URL)
	env.cfgPath = filepath.Join(dir, "postbox.yaml")
	if err := os.WriteFile(env.cfgPath, []byte(b.String()), 0o600); err != nil {
		return nil, err
	}
	res := &benchResult{Machine: machineDescription()}
	for _, s := range strings.Split(o.scenarios, ",") {
		switch strings.TrimSpace(s) {
		case "latency":
			if res.Latency, err = env.latency(ctx, o, false); err != nil {
				return nil, err
			}
		case "hanging":
			if res.Hanging, err = env.latency(ctx, o, true); err != nil {
				return nil, err
			}
		case "failing":
			if res.Failing, err = env.failing(ctx); err != nil {
				return nil, err
			}
		case "catchup":
			if res.Catchup, err = env.catchup(ctx, o); err != nil {
				return nil, err
			}
		case "load":
			if res.Load, err = env.load(ctx, o); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unknown scenario %q", s)
		}
	}
	return res, nil
}

func (e *benchEnv) startRelay(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"run", "--config", e.cfgPath}
	if p := os.Getenv("POSTBOX_BENCH_CPUPROFILE"); p != "" {
		args = append(args, "--cpuprofile", p)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = os.Environ()
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Start(); err != nil {
		return err
	}
	e.relay, e.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var active bool
		err := e.pool.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = 'postbox'`).Scan(&active)
		if err == nil && active {
			return nil
		}
		select {
		case <-e.done:
			return errors.New("relay exited at start")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("relay did not start streaming within 60s")
}

// waitCaughtUp waits until the slot has confirmed the WAL position of now.
func (e *benchEnv) waitCaughtUp(ctx context.Context) error {
	var target string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var ok bool
		if err := e.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'postbox'`, target).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the relay did not catch up with the WAL within 2 minutes")
}

// stopRelay sends SIGTERM and returns the relay's peak RSS in MB.
func (e *benchEnv) stopRelay() float64 {
	rss := peakRSS(e.relay.Process.Pid)
	_ = e.relay.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(60 * time.Second):
		_ = e.relay.Process.Kill()
		<-e.done
	}
	return rss
}

// latency produces a paced stream over the endpoints; with hanging, one of
// them is the endpoint that never answers (its events are left out of the
// figures, which are the healthy endpoints').
func (e *benchEnv) latency(ctx context.Context, o benchOptions, hanging bool) (*latencyResult, error) {
	e.recv.reset()
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	// Measure the steady state: after a catch-up the walsender first
	// re-reads the WAL it retained, which says nothing about latency.
	if err := e.waitCaughtUp(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: latency, %d events/s over %d endpoints for %s (one hanging: %v)\n", o.rate, o.endpoints, o.duration, hanging)
	interval := time.Second / time.Duration(o.rate)
	total := int(o.duration / interval)
	var sent atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	// Paced producer: each event its own single-row transaction, issued on
	// schedule by a small pool of workers so one slow commit does not
	// delay the next.
	jobs := make(chan int, 64)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				ep := fmt.Sprintf("ep-%d", i%o.endpoints)
				if hanging && i%o.endpoints == o.endpoints-1 {
					ep = "hang"
				}
				_, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ($1, $2)`,
					ep, fmt.Sprintf(`{"i":%d,"click_id":"clk_%d","payout":"1.00"}`, i, i))
				if err == nil && ep != "hang" {
					sent.Add(1)
				}
			}
		})
	}
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for e.recv.distinct() < int(sent.Load()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	rss := e.stopRelay()
	first, dups := e.recv.snapshot()
	lat, err := e.latencies(ctx, first)
	if err != nil {
		return nil, err
	}
	_, _ = e.pool.Exec(ctx, `TRUNCATE postbox.outbox, postbox.events, postbox.deliveries, postbox.latency_samples`)
	return &latencyResult{
		Rate: o.rate, Endpoints: o.endpoints, Hanging: hanging, Sent: int(sent.Load()), Received: len(first),
		Lost: int(sent.Load()) - len(first), Dups: dups,
		P50ms: quantile(lat, 0.50), P90ms: quantile(lat, 0.90), P99ms: quantile(lat, 0.99), Maxms: quantile(lat, 1),
		RSSMB: rss,
	}, nil
}

// ensureSchema has the relay create its schema and slot, once.
func (e *benchEnv) ensureSchema(ctx context.Context) error {
	if e.relay != nil {
		return nil
	}
	if err := e.startRelay(ctx); err != nil {
		return err
	}
	e.stopRelay()
	return nil
}

// latencies are the commit → first arrival times, in milliseconds and
// sorted, of the events the receiver got.
func (e *benchEnv) latencies(ctx context.Context, first map[string]time.Time) ([]float64, error) {
	rows, err := e.pool.Query(ctx, `SELECT event_id::text, committed_at FROM postbox.events WHERE committed_at IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	var lat []float64
	for rows.Next() {
		var id string
		var committed time.Time
		if err := rows.Scan(&id, &committed); err != nil {
			return nil, err
		}
		if at, ok := first[id]; ok {
			lat = append(lat, float64(at.Sub(committed).Microseconds())/1000)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Float64s(lat)
	return lat, nil
}

// insertFlat inserts single-row transactions into table from o.producers
// connections as fast as they commit, for d; it returns how many
// committed, and calls each (if not nil) after every commit.
func (e *benchEnv) insertFlat(ctx context.Context, o benchOptions, table string, d time.Duration, each func()) int {
	var sent atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for w := range o.producers {
		wg.Go(func() {
			for i := w; time.Now().Before(stop); i += o.producers {
				_, err := e.pool.Exec(ctx, `INSERT INTO `+table+` (endpoint, payload) VALUES ($1, $2)`,
					fmt.Sprintf("ep-%d", i%o.endpoints), fmt.Sprintf(`{"i":%d,"click_id":"clk_%d","payout":"1.00"}`, i, i))
				if err != nil {
					continue
				}
				sent.Add(1)
				if each != nil {
					each()
				}
			}
		})
	}
	wg.Wait()
	return int(sent.Load())
}

// load inserts as fast as o.producers producers can while the relay runs,
// and samples the lag (committed but not yet received) every second: it
// must stay bounded. A run into an unpublished copy of the outbox first
// gives the machine's insert rate without the relay.
func (e *benchEnv) load(ctx context.Context, o benchOptions) (*loadResult, error) {
	e.recv.reset()
	res := &loadResult{Producers: o.producers, Endpoints: o.endpoints, Seconds: o.duration.Seconds()}
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: load, %d producers inserting for %s without the relay, then with it\n", o.producers, o.duration)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.bench_baseline (LIKE postbox.outbox INCLUDING ALL)`); err != nil {
		return nil, err
	}
	res.BaselinePerS = float64(e.insertFlat(ctx, o, "public.bench_baseline", o.duration, nil)) / o.duration.Seconds()
	_, _ = e.pool.Exec(ctx, `DROP TABLE public.bench_baseline`)
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	if err := e.waitCaughtUp(ctx); err != nil {
		return nil, err
	}
	var committed atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for range int(o.duration / time.Second) {
			<-tick.C
			res.MaxLag = max(res.MaxLag, int(committed.Load())-e.recv.distinct())
		}
	}()
	start := time.Now()
	sent := e.insertFlat(ctx, o, "postbox.outbox", o.duration, func() { committed.Add(1) })
	loadEnd := time.Now()
	<-sampled
	res.Sent = sent
	res.LagAtEnd = sent - e.recv.distinct()
	res.InsertsPerS = float64(sent) / loadEnd.Sub(start).Seconds()
	res.DeliveriesPerS = float64(e.recv.distinct()) / loadEnd.Sub(start).Seconds()
	deadline := time.Now().Add(5 * time.Minute)
	for e.recv.distinct() < sent && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	res.DrainSeconds = time.Since(loadEnd).Seconds()
	res.RSSMB = e.stopRelay()
	first, dups := e.recv.snapshot()
	lat, err := e.latencies(ctx, first)
	if err != nil {
		return nil, err
	}
	res.P50ms, res.P99ms = quantile(lat, 0.50), quantile(lat, 0.99)
	res.Lost, res.Dups = sent-len(first), dups
	_, _ = e.pool.Exec(ctx, `TRUNCATE postbox.outbox, postbox.events, postbox.deliveries, postbox.latency_samples`)
	return res, nil
}

// failing queues 200 events for an endpoint that answers only 500 and
// counts the requests it gets in 30 seconds: the breaker's saving.
func (e *benchEnv) failing(ctx context.Context) (*failingResult, error) {
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	before := e.recv.failed.Load()
	fmt.Fprintln(e.log, "bench: failing endpoint, 200 events queued for 30 s")
	if _, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) SELECT 'fail' FROM generate_series(1, 200)`); err != nil {
		return nil, err
	}
	start := time.Now()
	time.Sleep(30 * time.Second)
	res := &failingResult{Queued: 200, Seconds: time.Since(start).Seconds(), Requests: e.recv.failed.Load() - before}
	_ = e.pool.QueryRow(ctx, `SELECT state, failure_threshold FROM postbox.endpoint_health WHERE endpoint = 'fail'`).Scan(&res.State, &res.Threshold)
	e.stopRelay()
	_, _ = e.pool.Exec(ctx, `TRUNCATE postbox.outbox, postbox.events, postbox.deliveries, postbox.latency_samples, postbox.endpoint_health`)
	return res, nil
}

func (e *benchEnv) catchup(ctx context.Context, o benchOptions) (*catchupResult, error) {
	e.recv.reset()
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: catch-up, queueing %d events while the relay is down\n", o.backlog)
	for done := 0; done < o.backlog; done += 1000 {
		n := min(1000, o.backlog-done)
		_, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload)
			SELECT 'ep-' || (i % $2), jsonb_build_object('i', i, 'click_id', 'clk_' || i, 'payout', '1.00')
			FROM generate_series($1::int, $1::int + $3 - 1) i`, done, o.endpoints, n)
		if err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for e.recv.distinct() < o.backlog && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	rss := e.stopRelay()
	first, dups := e.recv.snapshot()
	var lo, hi time.Time
	for _, t := range first {
		if lo.IsZero() || t.Before(lo) {
			lo = t
		}
		if t.After(hi) {
			hi = t
		}
	}
	drain := hi.Sub(lo).Seconds()
	_, _ = e.pool.Exec(ctx, `TRUNCATE postbox.outbox, postbox.events, postbox.deliveries, postbox.latency_samples`)
	return &catchupResult{
		Backlog: o.backlog, Endpoints: o.endpoints, Seconds: elapsed.Seconds(), DrainSeconds: drain,
		Rate: float64(len(first)) / elapsed.Seconds(), DrainRate: float64(len(first)) / drain,
		Lost: o.backlog - len(first), Dups: dups, RSSMB: rss,
	}, nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[min(i, len(sorted)-1)]
}

// peakRSS reads VmHWM (peak resident set) of a process, in MB.
func peakRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func machineDescription() string {
	cpus := 0
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(data), "processor\t:")
	}
	return fmt.Sprintf("%d CPUs, PostgreSQL and receiver on the same machine, fsync on", cpus)
}

func printBench(w io.Writer, r *benchResult) {
	fmt.Fprintf(w, "postbox bench (%s)\n", r.Machine)
	for _, l := range []*latencyResult{r.Latency, r.Hanging} {
		if l == nil {
			continue
		}
		if l.Hanging {
			fmt.Fprintf(w, "\ncommit → receiver latency of the %d healthy endpoints at %d events/s, one of %d endpoints hanging:\n", l.Endpoints-1, l.Rate, l.Endpoints)
		} else {
			fmt.Fprintf(w, "\ncommit → receiver latency at %d events/s over %d endpoints:\n", l.Rate, l.Endpoints)
		}
		fmt.Fprintf(w, "  p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms\n", l.P50ms, l.P90ms, l.P99ms, l.Maxms)
		fmt.Fprintf(w, "  sent %d, received %d, lost %d, duplicates %d; relay peak RSS %.0f MB\n", l.Sent, l.Received, l.Lost, l.Dups, l.RSSMB)
	}
	if f := r.Failing; f != nil {
		fmt.Fprintf(w, "\nan endpoint answering only 500, %d events queued for it:\n", f.Queued)
		fmt.Fprintf(w, "  %d requests in %.0f s (breaker %s after %d consecutive failures)\n", f.Requests, f.Seconds, f.State, f.Threshold)
	}
	if l := r.Load; l != nil {
		fmt.Fprintf(w, "\n%d producers inserting single-row transactions as fast as they commit, for %.0f s, over %d endpoints:\n", l.Producers, l.Seconds, l.Endpoints)
		fmt.Fprintf(w, "  inserts %.0f/s with the relay running (%.0f/s without it); deliveries %.0f/s meanwhile\n", l.InsertsPerS, l.BaselinePerS, l.DeliveriesPerS)
		fmt.Fprintf(w, "  lag (committed, not yet received): at most %d, %d when the load stopped, drained %.1f s later\n", l.MaxLag, l.LagAtEnd, l.DrainSeconds)
		fmt.Fprintf(w, "  commit → receiver p50 %.2f ms, p99 %.2f ms; sent %d, lost %d, duplicates %d; relay peak RSS %.0f MB\n", l.P50ms, l.P99ms, l.Sent, l.Lost, l.Dups, l.RSSMB)
	}
	if c := r.Catchup; c != nil {
		fmt.Fprintf(w, "\ncatch-up of a %d-event backlog over %d endpoints:\n", c.Backlog, c.Endpoints)
		fmt.Fprintf(w, "  %.0f deliveries/s from relay start (%.1f s); %.0f/s first to last delivery (%.1f s)\n", c.Rate, c.Seconds, c.DrainRate, c.DrainSeconds)
		fmt.Fprintf(w, "  lost %d, duplicates %d; relay peak RSS %.0f MB\n", c.Lost, c.Dups, c.RSSMB)
	}
}
