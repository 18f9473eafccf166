package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DeadDefault is how many dead endpoints the dead scenario adds.
const DeadDefault = 10000

// DeadResult is the dead scenario's: the latency scenario run twice, once
// alone and once beside dead endpoints whose breakers are open and whose
// deliveries wait on them.
type DeadResult struct {
	Dead   int            `json:"dead_endpoints"`
	Alone  *LatencyResult `json:"without_dead_endpoints"`
	Beside *LatencyResult `json:"beside_dead_endpoints"`
}

// dead measures the cost of dead endpoints to the healthy ones.
func (e *env) dead(ctx context.Context, o Options) (*DeadResult, error) {
	res := &DeadResult{Dead: o.Dead}
	var err error
	if res.Alone, err = e.latency(ctx, o, false); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: dead, %d endpoints with open breakers and three deliveries waiting each\n", o.Dead)
	if err := e.seedDead(ctx, o.Dead); err != nil {
		return nil, err
	}
	if res.Beside, err = e.latency(ctx, o, false); err != nil {
		return nil, err
	}
	e.truncate(ctx, true)
	return res, nil
}

// seedDead gives n endpoints (row URLs to a closed port) three failed
// deliveries each and a breaker opened now with an hour's cooldown, as
// partners that went away leave them.
func (e *env) seedDead(ctx context.Context, n int) error {
	if err := e.ensureSchema(ctx); err != nil {
		return err
	}
	_, err := e.pool.Exec(ctx, `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, url, payload, created_at)
		  SELECT gen_random_uuid(), format('dead-%s', i), 'http://127.0.0.1:9/gone', '{}', now()
		  FROM generate_series(1, $1) i, generate_series(1, 3)
		  RETURNING id, endpoint)
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, last_error)
		SELECT id, endpoint, 'failed', 1, 'connection refused' FROM ev`, n)
	if err == nil {
		_, err = e.pool.Exec(ctx, `
			INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, opened_at, cooldown_seconds)
			SELECT format('dead-%s', i), 'open', 5, now(), 3600 FROM generate_series(1, $1) i`, n)
	}
	if err == nil {
		_, err = e.pool.Exec(ctx, `VACUUM ANALYZE postbox.deliveries, postbox.events, postbox.endpoint_health`)
	}
	if err != nil {
		return fmt.Errorf("seed dead endpoints: %w", err)
	}
	return nil
}

// postgresCPU is the CPU time, in seconds, the bench's PostgreSQL server
// has used: its processes alive now and those it has reaped. Zero with a
// given database, whose processes are not the bench's to read.
func (e *env) postgresCPU() float64 {
	if e.cluster == nil {
		return 0
	}
	data, err := os.ReadFile(filepath.Join(e.cluster.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	if err != nil {
		return 0
	}
	total := cpuSeconds(pid, true)
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		child, err := strconv.Atoi(ent.Name())
		if err != nil || child == pid {
			continue
		}
		if parentOf(child) == pid {
			total += cpuSeconds(child, false)
		}
	}
	return total
}

// stat is the fields of /proc/PID/stat after the command name.
func stat(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(data[i+1:]))
}

func parentOf(pid int) int {
	f := stat(pid)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// cpuSeconds is a process's user and system time, with reaped children's
// when children is set.
func cpuSeconds(pid int, children bool) float64 {
	f := stat(pid)
	// After the name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
	if len(f) < 15 {
		return 0
	}
	n := 13
	if children {
		n = 15
	}
	var ticks float64
	for _, s := range f[11:n] {
		v, _ := strconv.ParseFloat(s, 64)
		ticks += v
	}
	return ticks / clockTicks
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100
