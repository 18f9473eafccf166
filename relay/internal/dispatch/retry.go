package dispatch

import (
	"container/heap"
	"time"
)

// KeepRetryMaxDefault is the longest retry delay an instance keeps (see
// KeepRetry); a later retry goes to the queue. Short retries are the many
// (a storm of failing partners retries within seconds); a long one kept
// would only wait longer in this instance's memory.
const KeepRetryMaxDefault = time.Minute

// CanKeepRetry reports whether the dispatcher takes one more kept retry:
// it is not stopping and keeps fewer than MaxKept.
func (d *Dispatcher) CanKeepRetry() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.stopping && len(d.retryIDs) < d.opts.MaxKept
}

// KeepRetry holds the retry of delivery id, on lane, due at due: the
// recorder wrote it failed and still this instance's (state.Result.Keep),
// and the claimer reads it back by id when due (HandOverDueRetries), as a
// claim would return it but without the claim's write of the row and its
// indexes. An instance beside a storm of failing partners claimed each of
// their retries, most of the database's work in the storm
// (docs/benchmarks.md). A retry not kept (stopping) stays this instance's
// in the table until the shutdown releases it.
func (d *Dispatcher) KeepRetry(lane string, id int64, due time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping || d.retryIDs[id] {
		return
	}
	d.retryIDs[id] = true
	heap.Push(&d.retries, keptRetry{lane: lane, id: id, due: due})
}

// HandOverDueRetries hands over the kept retries due at now: to load
// (their lanes have room and keep says so), or back to the queue (their
// lanes are full, or keep says no: an open breaker, a pause). With all,
// every kept retry goes back, due or not (another instance could claim
// them). The caller loads or releases them; either way the dispatcher
// holds them no more.
func (d *Dispatcher) HandOverDueRetries(now time.Time, all bool, keep func(lane string) bool) (load map[string][]int64, back []int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	load = map[string][]int64{}
	room := map[string]int{}
	total := d.opts.MaxHeldJobs - d.heldJobs
	for len(d.retries) > 0 && (all || !d.retries[0].due.After(now)) {
		r := heap.Pop(&d.retries).(keptRetry)
		delete(d.retryIDs, r.id)
		if all || total <= 0 || !keep(r.lane) {
			back = append(back, r.id)
			continue
		}
		n, ok := room[r.lane]
		if !ok {
			n = -1 // a lane the dispatcher has not: bounded by total alone
			if l := d.lanes[r.lane]; l != nil {
				n = max(0, l.limit()-l.held())
			}
		}
		if n == 0 {
			back = append(back, r.id)
			continue
		}
		room[r.lane], total = n-1, total-1
		load[r.lane] = append(load[r.lane], r.id)
	}
	return load, back
}

// KeptRetries is how many retries the dispatcher keeps.
func (d *Dispatcher) KeptRetries() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.retryIDs)
}

type keptRetry struct {
	lane string
	id   int64
	due  time.Time
}

// retryHeap orders kept retries by when they fall due.
type retryHeap []keptRetry

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(keptRetry)) }
func (h *retryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NextRetryDue is when the earliest kept retry falls due, if any.
func (d *Dispatcher) NextRetryDue() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.retries) == 0 {
		return time.Time{}, false
	}
	return d.retries[0].due, true
}
