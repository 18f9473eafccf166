package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// env is the bench's PostgreSQL, receiver and relay process.
type env struct {
	cluster     *pgtest.Cluster // nil when the database was given
	dbURL       string
	slot        string
	pool        *pgxpool.Pool
	secret      string
	recv        *receiver
	cfgPath     string
	admin       string // the relay's admin listener ("" when none was free)
	relayBinary string
	// The floor scenarios' bare client: its binary ("" for this one), or
	// in this process.
	bareBinary     string
	floorInProcess bool
	bare           *bareProcess // while it runs
	cpuScheduling  string       // the relay's and the bare client's: batch or normal
	emit           bool         // events are written with outbox.Emit: the relays need outbox_messages
	relay          *exec.Cmd
	done           chan struct{}
	// startedIn is how long the last relay started took to stream, and
	// stoppedRSS its RSS when it was last told to stop.
	startedIn  time.Duration
	stoppedRSS float64
	log        io.Writer
	watch      *hostWatch // the machine's pauses, while the bench runs
}

// writeConfigHead writes what every relay configuration the bench writes
// starts with: the database and slot, private targets allowed (the
// receiver is on loopback), the admin listener and log level, the
// scheduling, outbox_messages with --emit, and the signing secret.
// cpu_scheduling is written only when normal, outbox_messages only with
// --emit: batch and no messages are the relays' defaults, and a build from
// before the keys (--relay-binary) still reads the configuration, and
// runs as it did.
func (e *env) writeConfigHead(b *strings.Builder, admin, logLevel string) {
	fmt.Fprintf(b, "database_url: %s\nslot: %s\nallow_private_targets: true\nadmin_listen: %s\nlog_level: %s\n",
		e.dbURL, e.slot, admin, logLevel)
	if e.cpuScheduling == "normal" {
		b.WriteString("cpu_scheduling: normal\n")
	}
	if e.emit {
		b.WriteString("outbox_messages: true\n")
	}
	fmt.Fprintf(b, "signing:\n  secrets: [%s]\n", e.secret)
}

// config is the relay's configuration file: the bench's endpoints on the
// receiver, deliveries signed as in production.
func (e *env) config(endpoints int) string {
	var b strings.Builder
	e.writeConfigHead(&b, cmp.Or(e.admin, "127.0.0.1:0"), "warn")
	b.WriteString("endpoints:\n")
	for i := range endpoints {
		fmt.Fprintf(&b, "  ep-%d:\n    url: %s/ep-%d\n", i, e.recv.URL, i)
	}
	// Defaults otherwise: a 15 s timeout, the breaker at 10 failures.
	fmt.Fprintf(&b, "  hang:\n    url: %s/hang\n  fail:\n    url: %s/fail\n", e.recv.URL, e.recv.URL)
	return b.String()
}

// startRelay starts `postbox run` and waits until its slot is streaming.
func (e *env) startRelay(ctx context.Context) error { return e.startRelayWith(ctx, e.cfgPath) }

// startRelayWith is startRelay with the configuration file cfgPath.
func (e *env) startRelayWith(ctx context.Context, cfgPath string) error {
	spawned := time.Now()
	cmd, done, err := e.spawnRelay(cfgPath)
	if err != nil {
		return err
	}
	e.relay, e.done = cmd, done
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		// A slot being created is active too, but has no confirmed
		// position until it is made: a relay stopped before then leaves
		// no slot, and a backlog written next would be only
		// reconciliation's to find (the catch-up would measure that).
		var active bool
		err := e.pool.QueryRow(ctx, `SELECT coalesce(bool_or(active AND confirmed_flush_lsn IS NOT NULL), false) FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&active)
		if err == nil && active {
			e.startedIn = time.Since(spawned)
			return nil
		}
		select {
		case <-e.done:
			return errors.New("relay exited at start")
		case <-ctx.Done():
			e.stopRelay()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	e.stopRelay()
	return errors.New("relay did not start streaming within 60s")
}

// spawnRelay starts `postbox run --config cfgPath`; done closes when the
// process has exited.
func (e *env) spawnRelay(cfgPath string) (*exec.Cmd, chan struct{}, error) {
	exe := e.relayBinary
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, nil, fmt.Errorf("find the postbox binary: %w", err)
		}
	}
	args := []string{"run", "--config", cfgPath}
	if p := os.Getenv("POSTBOX_BENCH_CPUPROFILE"); p != "" {
		args = append(args, "--cpuprofile", p)
	}
	if p := os.Getenv("POSTBOX_BENCH_MEMPROFILE"); p != "" {
		args = append(args, "--memprofile", p)
	}
	cmd := exec.Command(exe, args...)
	// The relay's configuration is the bench's own: POSTBOX_* variables of
	// the calling shell (a real database's URL, its secrets) never reach it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "POSTBOX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = e.log, e.log
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start the relay: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return cmd, done, nil
}

// waitCaughtUp waits until the slot has confirmed the WAL position of now.
func (e *env) waitCaughtUp(ctx context.Context) error {
	var target string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return fmt.Errorf("read the WAL position: %w", err)
	}
	var ok bool
	err := waitFor(ctx, 2*time.Minute, 50*time.Millisecond, func() (bool, error) {
		// confirmed_flush_lsn is NULL while the slot is still being created.
		err := e.pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn >= $1::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $2`, target, e.slot).Scan(&ok)
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("wait for the relay to catch up with the WAL: %w", err)
	}
	if !ok {
		return errors.New("the relay did not catch up with the WAL within 2 minutes")
	}
	return nil
}

// stopRelay sends SIGTERM and returns the relay's peak RSS in MB.
func (e *env) stopRelay() float64 {
	rss := PeakRSS(e.relay.Process.Pid)
	e.stoppedRSS = statusMB(e.relay.Process.Pid, "VmRSS:")
	_ = e.relay.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(60 * time.Second):
		_ = e.relay.Process.Kill()
		<-e.done
	}
	return rss
}

// ensureSchema has the relay create its schema and slot, once.
func (e *env) ensureSchema(ctx context.Context) error {
	if e.relay != nil {
		return nil
	}
	if err := e.startRelay(ctx); err != nil {
		return err
	}
	e.stopRelay()
	return nil
}

// truncate empties the outbox and the relay's tables of events between
// scenarios, so that each starts with empty tables and indexes. (It named
// a table that migration 009 dropped, and so emptied nothing from then
// until 2026-12-06: a scenario ran on the rows of those before it.)
func (e *env) truncate(ctx context.Context, health bool) {
	q := `TRUNCATE postbox.outbox, postbox.events, postbox.deliveries, postbox.attempts, postbox.under_way`
	if health {
		q += `, postbox.endpoint_health`
	}
	if _, err := e.pool.Exec(ctx, q); err != nil && ctx.Err() == nil {
		fmt.Fprintf(e.log, "bench: emptying the tables between scenarios: %v\n", err)
	}
}

// latencies are the commit → first arrival times, in milliseconds and
// sorted, of the events the receiver got: one for each, or the scenario
// fails (Result.check). The commit time is the event's committed_at, which
// the relay takes from the stream's Commit message; an event the stream
// did not bring (reconciled from the outbox table after a lost slot) has
// none, and its outbox row's transaction's commit time stands in for it
// (pg_xact_commit_timestamp, with track_commit_timestamp on in the bench's
// own server). Those are the slowest events of a run, and leaving them out
// would flatter it.
func (e *env) latencies(ctx context.Context, first map[string]time.Time) ([]float64, error) {
	committed, err := e.commitTimes(ctx, "")
	if err != nil {
		return nil, err
	}
	if latenciesFile != "" {
		e.dumpLatencies(ctx, latenciesFile, first, committed)
	}
	return latenciesFrom(first, committed), nil
}

// commitTimes reads each event's commit time by id (see latencies); the
// events of endpoint are left out when it is not "".
func (e *env) commitTimes(ctx context.Context, except string) (map[string]time.Time, error) {
	rows, err := e.pool.Query(ctx, `SELECT event_id::text, committed_at FROM postbox.events WHERE committed_at IS NOT NULL AND endpoint <> $1`, except)
	if err != nil {
		return nil, fmt.Errorf("read commit times: %w", err)
	}
	committed := map[string]time.Time{}
	scan := func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var id string
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				return fmt.Errorf("read commit times: %w", err)
			}
			committed[id] = at
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read commit times: %w", err)
		}
		return nil
	}
	if err := scan(rows); err != nil {
		return nil, err
	}
	before := len(committed)
	var missing int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events WHERE committed_at IS NULL AND endpoint <> $1`, except).Scan(&missing); err != nil {
		return nil, fmt.Errorf("read commit times: %w", err)
	}
	if missing == 0 {
		return committed, nil
	}
	// Without track_commit_timestamp (a given database) this fails, and
	// the events stay unmeasured: the scenario fails, measured below
	// received.
	rows, err = e.pool.Query(ctx, `
		SELECT o.event_id::text, pg_xact_commit_timestamp(o.xmin) FROM postbox.outbox o
		JOIN postbox.events ev ON ev.event_id = o.event_id
		WHERE ev.committed_at IS NULL AND ev.endpoint <> $1 AND pg_xact_commit_timestamp(o.xmin) IS NOT NULL`, except)
	if err == nil {
		err = scan(rows)
	}
	if err != nil {
		fmt.Fprintf(e.log, "bench: %d events have no committed_at, and their outbox rows' commit times cannot be read: %v\n", missing, err)
		return committed, nil
	}
	fmt.Fprintf(e.log, "bench: %d events have no committed_at (reconciled from the outbox table); %d timed from their outbox rows' commits\n", missing, len(committed)-before)
	return committed, nil
}

// latenciesFile, from POSTBOX_BENCH_LATENCIES, is where a scenario that
// measures commit → receiver latency writes, one event a line in commit
// order, its commit time (Unix seconds) and in milliseconds from the
// commit: its arrival, the start of its ingest's transaction and the
// start of its first attempt (-1 where unknown). To see when a run's slow
// deliveries were committed, and whether they waited before postbox had
// them (the ingest and the attempt late alike) or after. The floor
// scenarios write theirs to the same name with ".floor" added.
var latenciesFile = os.Getenv("POSTBOX_BENCH_LATENCIES")

func (e *env) dumpLatencies(ctx context.Context, path string, first, committed map[string]time.Time) {
	type starts struct{ ingest, attempt time.Time }
	known := map[string]starts{}
	rows, err := e.pool.Query(ctx, `
		SELECT e.event_id::text, e.ingested_at, a.started_at
		FROM postbox.events e
		LEFT JOIN postbox.deliveries d ON d.event_pk = e.id AND d.replay_of IS NULL
		LEFT JOIN postbox.all_attempts a ON a.delivery_id = d.id AND a.attempt = 1`)
	if err == nil {
		for rows.Next() {
			var id string
			var ingested time.Time
			var started *time.Time
			if rows.Scan(&id, &ingested, &started) == nil {
				st := starts{ingest: ingested}
				if started != nil {
					st.attempt = *started
				}
				known[id] = st
			}
		}
		rows.Close()
	}
	type sample struct {
		at                       time.Time
		arrival, ingest, attempt float64
	}
	ms := func(from, to time.Time) float64 {
		if to.IsZero() {
			return -1
		}
		return float64(to.Sub(from).Microseconds()) / 1000
	}
	var all []sample
	for id, at := range first {
		if c, ok := committed[id]; ok {
			st := known[id]
			all = append(all, sample{c, ms(c, at), ms(c, st.ingest), ms(c, st.attempt)})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	var b strings.Builder
	for _, s := range all {
		fmt.Fprintf(&b, "%.6f %.3f %.3f %.3f\n", float64(s.at.UnixMicro())/1e6, s.arrival, s.ingest, s.attempt)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}

// latenciesFrom are the commit → first arrival times, in milliseconds and
// sorted, of the events in both first (arrivals) and committed (commit
// times).
func latenciesFrom(first, committed map[string]time.Time) []float64 {
	lat := make([]float64, 0, len(first))
	for id, at := range first {
		if c, ok := committed[id]; ok {
			lat = append(lat, float64(at.Sub(c).Microseconds())/1000)
		}
	}
	sort.Float64s(lat)
	return lat
}

// waitFor polls cond every interval until it holds, for at most d. It
// returns nil when d ran out with cond still false: the caller's figures
// say what was missing.
func waitFor(ctx context.Context, d, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil || ok || !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// shareOver is the share of sorted that is above limit.
func shareOver(sorted []float64, limit float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := sort.SearchFloat64s(sorted, math.Nextafter(limit, math.Inf(1)))
	return float64(len(sorted)-i) / float64(len(sorted))
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[min(i, len(sorted)-1)]
}

// PeakRSS reads VmHWM (peak resident set) of a process, in MB; 0 when it
// cannot be read.
func PeakRSS(pid int) float64 { return statusMB(pid, "VmHWM:") }

// statusMB reads a process's /proc status line key (in kB), in MB; 0 when
// it cannot be read.
func statusMB(pid int, key string) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, key) {
			f := strings.Fields(line)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func machineDescription(ownServer bool) string {
	cpus := 0
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(data), "processor\t:")
	}
	if !ownServer {
		return fmt.Sprintf("%d CPUs, a given PostgreSQL, receiver on this machine", cpus)
	}
	return fmt.Sprintf("%d CPUs, PostgreSQL and receiver on the same machine, fsync on", cpus)
}

// postgresCPU is the CPU time, in seconds, the bench's PostgreSQL server
// has used: its processes alive now and those it has reaped. Zero with a
// given database, whose processes are not the bench's to read.
// walsenders is the part of it the walsenders alive now have used, and
// waits what each of those has waited for a CPU (see sched), by PID.
func (e *env) postgresCPU() (all, walsenders float64, waits map[int]sched) {
	if e.cluster == nil {
		return 0, 0, nil
	}
	data, err := os.ReadFile(filepath.Join(e.cluster.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0, 0, nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	if err != nil {
		return 0, 0, nil
	}
	// /proc/PID/stat after the command name: state(0) ppid(1) …
	// utime(11) stime(12) cutime(13) cstime(14), in clock ticks.
	total := ticks(procStat(pid), 15) // with the reaped children's
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		child, err := strconv.Atoi(ent.Name())
		if err != nil || child == pid {
			continue
		}
		if f := procStat(child); len(f) >= 15 && f[1] == strconv.Itoa(pid) {
			t := ticks(f, 13)
			total += t
			// A walsender titles itself "postgres: walsender …"; one that
			// has exited is counted in the postmaster's reaped children
			// only.
			if title, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline")); bytes.HasPrefix(title, []byte("postgres: walsender")) {
				walsenders += t
				if waits == nil {
					waits = map[int]sched{}
				}
				waits[child] = threadSched(child)
			}
		}
	}
	return total / clockTicks, walsenders / clockTicks, waits
}

// sched is what the scheduler's statistics say of one or more threads:
// the time they spent runnable and waiting for a CPU, in seconds, and the
// turns they had on one.
type sched struct {
	wait  float64
	turns int64
}

func (a sched) plus(b sched) sched  { return sched{a.wait + b.wait, a.turns + b.turns} }
func (a sched) minus(b sched) sched { return sched{a.wait - b.wait, a.turns - b.turns} }

// threadSched is a single-threaded process's sched (a PostgreSQL
// backend's); zero when it cannot be read.
func threadSched(pid int) sched {
	return readSched(fmt.Sprintf("/proc/%d/schedstat", pid))
}

// procSched is the sched of each of a process's threads alive now, by
// thread id.
func procSched(pid int) map[int]sched {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	out := make(map[int]sched, len(tasks))
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			out[tid] = readSched(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
		}
	}
	return out
}

// readSched reads a schedstat file: the time on a CPU and the run delay,
// in nanoseconds, and the number of turns.
func readSched(path string) sched {
	data, err := os.ReadFile(path)
	if err != nil {
		return sched{}
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return sched{}
	}
	ns, _ := strconv.ParseFloat(f[1], 64)
	turns, _ := strconv.ParseInt(f[2], 10, 64)
	return sched{wait: ns / 1e9, turns: turns}
}

// procCPU is a process's own CPU time in seconds (0 when it is gone).
func procCPU(pid int) float64 { return ticks(procStat(pid), 13) / clockTicks }

// ticks sums the stat fields from utime up to field to (13: the process's
// own; 15: with its reaped children's).
func ticks(f []string, to int) float64 {
	if len(f) < to {
		return 0
	}
	var n float64
	for _, s := range f[11:to] {
		v, _ := strconv.ParseFloat(s, 64)
		n += v
	}
	return n
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// procStat is the fields of /proc/PID/stat after the command name.
func procStat(pid int) []string {
	f, _ := proc.StatFields(fmt.Sprintf("/proc/%d/stat", pid))
	return f
}
