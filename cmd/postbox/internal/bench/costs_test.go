package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProcWaitCountsThreadsKeptFromACPU: twice as many threads as CPUs,
// each spinning on its own OS thread, must wait for one; the process's
// wait grows by about as much as they ran without one.
func TestProcWaitCountsThreadsKeptFromACPU(t *testing.T) {
	n := 2 * runtime.NumCPU()
	// Only GOMAXPROCS threads run Go code at once; the others would wait
	// in Go's scheduler, not the kernel's. Let them all be runnable.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	before := procSched(os.Getpid())
	// Every thread is checked while it still lives: one that exits takes
	// its counts with it.
	var ready, spun sync.WaitGroup
	ready.Add(n)
	spun.Add(n)
	release := make(chan struct{})
	for range n {
		go func() {
			runtime.LockOSThread() // the thread ends with the goroutine
			ready.Done()
			for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
			}
			spun.Done()
			<-release
		}()
	}
	ready.Wait()
	spun.Wait()
	waited := schedBetween(before, procSched(os.Getpid()))
	close(release)
	// n threads runnable for 300 ms on n/2 CPUs wait about 0.3 s × n/2 in
	// all (0.6 s on two CPUs); a third of that allows for the scheduler's
	// slack. Reading only the main thread, which sleeps, finds about none.
	require.Greater(t, waited.wait, 0.1*float64(n-runtime.NumCPU()), "threads that outnumber the CPUs waited for one")
	require.GreaterOrEqual(t, waited.turns, int64(n), "each spinning thread had a turn at least")
	t.Logf("%d threads on %d CPUs for 300 ms waited %.0f ms in all, %.0f µs a turn", n, runtime.NumCPU(), waited.wait*1000, waited.perTurnus())
}

func TestReadSchedReadsTheRunDelayAndTurns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "schedstat")
	require.NoError(t, os.WriteFile(path, []byte("1200000000 350000000 4242\n"), 0o644))
	s := readSched(path)
	require.InDelta(t, 0.35, s.wait, 1e-9, "the second field, in nanoseconds")
	require.Equal(t, int64(4242), s.turns)
	require.InDelta(t, 350000.0/4242, s.perTurnus(), 1e-6, "µs a turn")
	require.Zero(t, readSched(filepath.Join(dir, "gone")), "a thread that exited")
	require.NoError(t, os.WriteFile(path, []byte("12 34\n"), 0o644))
	require.Zero(t, readSched(path), "a short line")
	require.Zero(t, sched{wait: 1}.perTurnus(), "no turns")

	// A walsender that started since the first reading counts whole; one
	// that exited is left out.
	from := map[int]sched{10: {1.0, 100}, 11: {2.0, 50}}
	to := map[int]sched{10: {1.5, 300}, 12: {0.25, 50}}
	got := schedBetween(from, to)
	require.InDelta(t, 0.75, got.wait, 1e-9)
	require.Equal(t, int64(250), got.turns)
}
