package bench

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A virtual machine can stand still as a whole: a host that throttles it
// (CFS bandwidth control on its vCPU threads) stops every vCPU for the
// rest of a 100 ms period once the VM has used its quota, which two busy
// vCPUs can. Nothing in the guest runs meanwhile, PostgreSQL's walsender
// and the relay no more than the producers, and every event committed
// just before waits the whole pause: a latency figure of a run that had
// such pauses says as much about the host as about the relay. Run two
// spinning processes on such a machine and each sees gaps of 100 ms.
//
// hostWatch notices these pauses from a thread of its own that sleeps
// pauseTick at a time: when it wakes late, what the scheduler's
// statistics do not explain (the thread's run delay, the time it spent
// runnable while others had the CPUs) is time in which the thread was
// neither asleep as asked nor waiting for a CPU: the machine stood still.
// A wake a pause of Go's own scheduler delays (a P to return to after the
// sleep) is counted too, which pauseMin, far above such delays, keeps out.
type hostWatch struct {
	mu       sync.Mutex
	watching bool // the thread's statistics could be read
	pauses   []hostPause
	stop     chan struct{}
	done     chan struct{}
}

// hostPause is one: when the watch thread went to sleep before it, and
// how long the machine stood still.
type hostPause struct {
	at time.Time
	d  time.Duration
}

const (
	pauseTick = 5 * time.Millisecond
	pauseMin  = 40 * time.Millisecond
)

// watchHost starts a hostWatch; stopWatch ends it. Where the thread's
// scheduler statistics cannot be read (not Linux), it watches nothing.
func watchHost() *hostWatch {
	w := &hostWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *hostWatch) run() {
	defer close(w.done)
	// The thread is the watch's alone, and ends with the goroutine.
	runtime.LockOSThread()
	f, err := os.Open("/proc/thread-self/schedstat")
	if err != nil {
		return
	}
	defer f.Close()
	w.mu.Lock()
	w.watching = true
	w.mu.Unlock()
	buf := make([]byte, 128)
	delay := func() (time.Duration, bool) {
		n, _ := f.ReadAt(buf, 0) // a seq_file: each read from 0 is fresh
		return runDelay(buf[:n])
	}
	prev := time.Now()
	prevDelay, known := delay()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		threadSleep(pauseTick)
		now := time.Now()
		d, read := delay()
		// A gap is judged only between two readings of the run delay: a
		// reading that failed would count the thread's whole wait so far
		// as the machine's.
		if known && read {
			if stood := standingStill(now.Sub(prev), pauseTick, d-prevDelay); stood >= pauseMin {
				w.mu.Lock()
				w.pauses = append(w.pauses, hostPause{at: prev, d: stood})
				w.mu.Unlock()
			}
		}
		prev, prevDelay, known = now, d, read
	}
}

// standingStill is what of a gap between two wakes of the watch thread
// neither its sleep nor its wait for a CPU explains.
func standingStill(gap, slept, waited time.Duration) time.Duration {
	return max(gap-slept-waited, 0)
}

// runDelay is the second field of a schedstat line, the time runnable
// without a CPU; ok is false when it cannot be read.
func runDelay(line []byte) (d time.Duration, ok bool) {
	f := strings.Fields(string(line))
	if len(f) < 2 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

func (w *hostWatch) stopWatch() {
	close(w.stop)
	<-w.done
}

// between is the pauses that began in [from, to); nil where nothing
// was watched.
func (w *hostWatch) between(from, to time.Time) *HostPauses {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.watching {
		return nil
	}
	p := &HostPauses{}
	for _, h := range w.pauses {
		if h.at.Before(from) || !h.at.Before(to) {
			continue
		}
		p.Count++
		ms := float64(h.d.Microseconds()) / 1000
		p.TotalMS += ms
		p.LongestMS = max(p.LongestMS, ms)
	}
	return p
}

// HostPauses is what a run lost to the machine standing still (see
// hostWatch): the pauses of at least 40 ms, the longest and their sum.
type HostPauses struct {
	Count     int     `json:"count"`
	LongestMS float64 `json:"longest_ms"`
	TotalMS   float64 `json:"total_ms"`
}
