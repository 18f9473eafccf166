package bench

import (
	"context"
	"os"
	"syscall"
	"time"
)

// Costs is what delivering a scenario's events cost, per event: the CPU
// time of PostgreSQL, of the relay and of the bench process (its receiver,
// and where the scenario produces while it measures, its producers too),
// and what PostgreSQL wrote for them: rows inserted, updated or deleted in
// postbox's tables (the outbox's inserts left out: the application's), WAL
// records and WAL bytes (everything, the application's inserts included),
// and the WAL's flushes (fsync calls, of every process: commits that
// waited for their flush, and the WAL writer's; none with fsync off).
// The WAL's records are counted in the run's WAL itself (see
// walRecordsBetween); rows come from the statistics.
//
// Of PostgreSQL's CPU, WalsenderCPUms is the walsenders': logical decoding
// reads every WAL record, whatever table or database it is of, and checks
// its socket for the client's replies once per record, so this share
// follows WALRecordsPerEvent (every heap row and every index entry is a
// record) more than the rows the outbox publishes.
//
// WalsenderWaitms and RelayWaitms are what the walsenders and the relay's
// threads waited for a CPU while runnable (the scheduler's run delay),
// and the …PerTurnus figures that wait over their turns on a CPU. Under
// full insert load the walsender, one process beside the producers'
// backends on the machine's CPUs, waits about as long as it runs, and
// every event behind it waits with it. At a low rate, with the CPUs
// mostly idle, a turn's wait is still part of each event's latency: the
// walsender is woken by the commit, and runs only after it. A walsender
// or thread that exited during the run is left out, so the totals are at
// least the figure.
//
// In the floor scenarios the relay's figures are the bare client's, when
// it runs in a process of its own (it has no database writes: its CPU is
// its receipt of the stream and its requests).
type Costs struct {
	Events                 int     `json:"events"`
	PostgresCPUms          float64 `json:"postgres_cpu_ms_per_1000_events"`
	WalsenderCPUms         float64 `json:"postgres_walsender_cpu_ms_per_1000_events"`
	WalsenderWaitms        float64 `json:"postgres_walsender_cpu_wait_ms_per_1000_events"`
	WalsenderWaitPerTurnus float64 `json:"postgres_walsender_cpu_wait_us_per_turn"`
	RelayCPUms             float64 `json:"relay_cpu_ms_per_1000_events"`
	RelayWaitms            float64 `json:"relay_cpu_wait_ms_per_1000_events"`
	RelayWaitPerTurnus     float64 `json:"relay_cpu_wait_us_per_turn"`
	BenchCPUms             float64 `json:"bench_cpu_ms_per_1000_events"`
	RowsPerEvent           float64 `json:"rows_written_per_event"`
	WALRecordsPerEvent     float64 `json:"wal_records_per_event"`
	WALPerEvent            float64 `json:"wal_bytes_per_event"`
	WALFlushesPerEvent     float64 `json:"wal_flushes_per_event"`
	// HostPauses is no cost of the events but the machine's own: the
	// times it stood still during the run (see hostWatch), which every
	// event committed just before waited out. Nil where not watched.
	HostPauses *HostPauses `json:"host_pauses,omitempty"`

	relayName string // what the relay's figures are of, in print: "relay" when ""
}

// meter is a reading of the counters Costs are the differences of.
type meter struct {
	at            time.Time
	pg, walsender float64 // CPU seconds: all of PostgreSQL, its walsenders
	relay, bench  float64
	// Waits for a CPU: of each walsender alive (by PID), and of each of
	// the relay's threads (by thread id).
	walsenderSched map[int]sched
	relaySched     map[int]sched
	wal            int64 // bytes since 0/0
	written        written
}

// written is what the statistics say PostgreSQL has written.
type written struct {
	rows       int64 // of postbox's tables, the outbox's inserts left out
	walRecords int64
	walSyncs   int64 // the WAL's fsync calls
}

// read takes the counters now. The relay must be running (its CPU time is
// read from /proc). Rows come from the statistics, which a backend reports
// at the end of a busy second or when it exits: see settle.
func (e *env) read(ctx context.Context) meter {
	m := meter{at: time.Now(), bench: selfCPU()}
	m.pg, m.walsender, m.walsenderSched = e.postgresCPU()
	if p := e.relayProcess(); p != nil {
		m.relay = procCPU(p.Pid)
		m.relaySched = procSched(p.Pid)
	}
	_ = e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&m.wal)
	m.written = e.written(ctx)
	return m
}

// relayProcess is the process whose costs are the relay's: the floor's
// bare client while it runs in a process of its own, else the relay's
// last process (one that has exited reads as nothing); nil before the
// first.
func (e *env) relayProcess() *os.Process {
	switch {
	case e.bare != nil:
		return e.bare.cmd.Process
	case e.relay != nil:
		return e.relay.Process
	}
	return nil
}

// written is the rows postbox's tables have had inserted, updated and
// deleted, the outbox's inserts left out, and the WAL records written and
// flushes made.
// Backends report both at the end of a busy second or when they exit.
func (e *env) written(ctx context.Context) written {
	var w written
	// PostgreSQL 18 moved the WAL's fsync count from pg_stat_wal
	// (wal_sync) to pg_stat_io (fsyncs of the object wal).
	syncs := `(SELECT wal_sync FROM pg_stat_wal)`
	var version int
	if err := e.pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err == nil && version >= 180000 {
		syncs = `(SELECT coalesce(sum(fsyncs), 0)::int8 FROM pg_stat_io WHERE object = 'wal')`
	}
	_ = e.pool.QueryRow(ctx, `
		SELECT (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del - CASE WHEN relname = 'outbox' THEN n_tup_ins ELSE 0 END), 0)::int8
		        FROM pg_stat_user_tables WHERE schemaname = 'postbox'),
		       (SELECT wal_records FROM pg_stat_wal), `+syncs).Scan(&w.rows, &w.walRecords, &w.walSyncs)
	return w
}

// settle waits (up to 5 s) until the stopped relay's backends have exited,
// which reports their statistics.
func (e *env) settle(ctx context.Context) {
	_ = waitFor(ctx, 5*time.Second, 20*time.Millisecond, func() (bool, error) {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'postbox%'`).Scan(&n)
		return n == 0, err
	})
}

// costs is what events cost between from and to, read once the relay's
// statistics have settled.
func (e *env) costs(ctx context.Context, from, to meter, events int) *Costs {
	if events == 0 {
		return nil
	}
	w := e.written(ctx)
	if n, ok := e.walRecordsBetween(ctx, from.wal, to.wal); ok {
		w.walRecords = from.written.walRecords + n
	}
	c := costs(from, to, w, events)
	c.HostPauses = e.watch.between(from.at, to.at)
	return c
}

// walRecordsBetween counts the WAL records between the LSNs from and to
// (bytes since 0/0) with pg_walinspect. pg_stat_wal's count alone would
// charge a run the records the relay wrote before it began: a backend
// reports its count at the end of a busy second or when it exits, so a
// relay's migrations, written just before a latency run begins, were
// counted in it (at 1 event/s, 370 records per event where the WAL held
// 29). ok is false where the WAL of the run cannot be read: the extension
// is not installed on a server given by DatabaseURL, or a checkpoint has
// removed the run's first segments.
func (e *env) walRecordsBetween(ctx context.Context, from, to int64) (n int64, ok bool) {
	if e.walinspect(ctx) != nil {
		return 0, false
	}
	err := e.pool.QueryRow(ctx, `
		SELECT coalesce(sum(count), 0)::int8
		FROM pg_get_wal_stats('0/0'::pg_lsn + $1::numeric, '0/0'::pg_lsn + $2::numeric)`, from, to).Scan(&n)
	return n, err == nil
}

// costs is what events cost between from and to; w is what was written
// by then.
func costs(from, to meter, w written, events int) *Costs {
	per1000 := func(s float64) float64 { return s * 1e6 / float64(events) }
	walsender, relay := schedBetween(from.walsenderSched, to.walsenderSched), schedBetween(from.relaySched, to.relaySched)
	return &Costs{
		Events:                 events,
		PostgresCPUms:          per1000(to.pg - from.pg),
		WalsenderCPUms:         per1000(to.walsender - from.walsender),
		WalsenderWaitms:        per1000(walsender.wait),
		WalsenderWaitPerTurnus: walsender.perTurnus(),
		RelayCPUms:             per1000(to.relay - from.relay),
		RelayWaitms:            per1000(relay.wait),
		RelayWaitPerTurnus:     relay.perTurnus(),
		BenchCPUms:             per1000(to.bench - from.bench),
		RowsPerEvent:           float64(w.rows-from.written.rows) / float64(events),
		WALRecordsPerEvent:     float64(w.walRecords-from.written.walRecords) / float64(events),
		WALPerEvent:            float64(to.wal-from.wal) / float64(events),
		WALFlushesPerEvent:     float64(w.walSyncs-from.written.walSyncs) / float64(events),
	}
}

// selfCPU is the bench process's own CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// schedBetween is what the walsenders (or threads) alive at to waited
// between the two readings: all of it for one that started since from,
// nothing for one that ended.
func schedBetween(from, to map[int]sched) sched {
	var s sched
	for pid, w := range to {
		s = s.plus(w.minus(from[pid]))
	}
	return s
}

// perTurnus is the wait per turn, in microseconds; 0 without turns.
func (a sched) perTurnus() float64 {
	if a.turns <= 0 {
		return 0
	}
	return a.wait * 1e6 / float64(a.turns)
}
