package bench

import (
	"context"
	"syscall"
	"time"
)

// Costs is what delivering a scenario's events cost, per event: the CPU
// time of PostgreSQL, of the relay and of the bench process (its receiver,
// and where the scenario produces while it measures, its producers too),
// and what PostgreSQL wrote for them: rows inserted, updated or deleted in
// postbox's tables (the outbox's inserts left out: the application's) and
// WAL bytes (everything, the application's inserts included).
type Costs struct {
	Events        int     `json:"events"`
	PostgresCPUms float64 `json:"postgres_cpu_ms_per_1000_events"`
	RelayCPUms    float64 `json:"relay_cpu_ms_per_1000_events"`
	BenchCPUms    float64 `json:"bench_cpu_ms_per_1000_events"`
	RowsPerEvent  float64 `json:"rows_written_per_event"`
	WALPerEvent   float64 `json:"wal_bytes_per_event"`
}

// meter is a reading of the counters Costs are the differences of.
type meter struct {
	pg, relay, bench float64 // CPU seconds
	rows             int64
	wal              int64 // bytes since 0/0
}

// read takes the counters now. The relay must be running (its CPU time is
// read from /proc). Rows come from the statistics, which a backend reports
// at the end of a busy second or when it exits: see settle.
func (e *env) read(ctx context.Context) meter {
	m := meter{pg: e.postgresCPU(), bench: selfCPU()}
	if e.relay != nil && e.relay.Process != nil {
		m.relay = procCPU(e.relay.Process.Pid)
	}
	_ = e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&m.wal)
	m.rows = e.rowsWritten(ctx)
	return m
}

// rowsWritten is the rows postbox's tables have had inserted, updated and
// deleted, the outbox's inserts left out.
func (e *env) rowsWritten(ctx context.Context) int64 {
	var n int64
	_ = e.pool.QueryRow(ctx, `
		SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del - CASE WHEN relname = 'outbox' THEN n_tup_ins ELSE 0 END), 0)::int8
		FROM pg_stat_user_tables WHERE schemaname = 'postbox'`).Scan(&n)
	return n
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

// costs is what events cost between from and to; rowsTo is the rows
// written, read once the relay's statistics have settled.
func costs(from, to meter, rowsTo int64, events int) *Costs {
	if events == 0 {
		return nil
	}
	per1000 := func(s float64) float64 { return s * 1e6 / float64(events) }
	return &Costs{
		Events:        events,
		PostgresCPUms: per1000(to.pg - from.pg),
		RelayCPUms:    per1000(to.relay - from.relay),
		BenchCPUms:    per1000(to.bench - from.bench),
		RowsPerEvent:  float64(rowsTo-from.rows) / float64(events),
		WALPerEvent:   float64(to.wal-from.wal) / float64(events),
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
