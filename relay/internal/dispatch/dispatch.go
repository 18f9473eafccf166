// Package dispatch runs delivery attempts in memory: one lane per endpoint,
// each with its own bounded number of attempts in flight and a small queue,
// so a slow or failing endpoint only ever occupies its own slots.
//
// Jobs arrive two ways: straight from ingestion (the fast path: the
// ingester reserves a slot before it writes the delivery as in_flight), or
// claimed from the queue table. Each finished attempt is handed to the
// Recorder (the recorder), which records it; the RoomWatcher (the
// claimer) hears when a lane has room for claims.
package dispatch

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Options configure a Dispatcher.
type Options struct {
	// Capacity is an endpoint's max_in_flight.
	Capacity func(endpoint string) int
	// Execute makes one attempt. Its context is cancelled only when a
	// shutdown runs out of grace; it should then return a released result.
	Execute func(ctx context.Context, j *Job) state.Result
	// MaxHeldBytes bounds the payload bytes held in memory across lanes
	// (MaxHeldBytesDefault when zero); MaxHeldJobs the jobs
	// (MaxHeldJobsDefault when zero).
	MaxHeldBytes int
	MaxHeldJobs  int
	// MaxConcurrency bounds the attempts in flight across all lanes
	// (MaxConcurrencyDefault when zero). Each lane still has its own cap, so one endpoint can
	// never hold more than its share, but ten thousand per-row endpoints
	// cannot open ten thousand connections at once.
	MaxConcurrency int
	// MaxKept bounds the deliveries kept by id (MaxKeptDefault when zero;
	// see ReserveKeep).
	MaxKept int
}

// Recorder records what became of each job: record.Recorder.
type Recorder interface {
	// Record takes a finished (or released) job's outcome. It must not
	// block for long, and must call Dispatcher.Recorded once the outcome
	// is written or dropped.
	Record(o Outcome)
}

// RoomWatcher hears (without the dispatcher's locks held) when a lane has
// drained to half its limit, so the queue is claimed from in batches:
// claim.Claimer.
type RoomWatcher interface {
	LaneFreed()
}

// Dispatcher runs attempts, endpoint by endpoint.
type Dispatcher struct {
	opts      Options
	recorder  Recorder
	room      RoomWatcher
	attemptCx context.Context
	cancel    context.CancelFunc

	mu        sync.Mutex
	lanes     map[string]*lane
	heldJobs  int // across lanes, reservations included
	heldBytes int
	heldIDs   map[int64]int // deliveries submitted and not yet recorded
	// underWay counts, per range of events under way, those of its
	// events this instance holds (kept, submitted, or not yet recorded);
	// done are the ranges whose count fell to 0, for the claimer to sweep
	// (store.SweepOwnUnderWay).
	underWay map[int64]int
	done     []int64
	kept     int // across lanes, reservations included
	// retries are the retries kept by id (KeepRetry), by due time;
	// retryIDs their ids.
	retries  retryHeap
	retryIDs map[int64]bool
	inFlight int     // across lanes
	starved  []*lane // lanes with work waiting only for a global slot, in arrival order
	stopping bool
	// running joins the attempt goroutines. Each makes the next attempt
	// handed to it (tasks) until it has been idle for workerIdle or the
	// dispatcher stops (quit): a new goroutine per attempt grew its stack
	// twice over, copying it, on the way into net/http.
	running sync.WaitGroup
	tasks   chan task
	quit    chan struct{}
}

// task is an attempt handed to an idle attempt goroutine.
type task struct {
	l *lane
	j *Job
}

// workerIdle is how long an attempt goroutine waits for its next attempt
// before it returns.
const workerIdle = 5 * time.Second

// Defaults of Options.
const (
	MaxHeldBytesDefault   = 32 << 20
	MaxHeldJobsDefault    = 10000
	MaxConcurrencyDefault = 256
	MaxKeptDefault        = 200000
)

// WithDefaults fills unset options from the …Default constants.
func (o Options) WithDefaults() Options {
	if o.MaxHeldBytes <= 0 {
		o.MaxHeldBytes = MaxHeldBytesDefault
	}
	if o.MaxHeldJobs <= 0 {
		o.MaxHeldJobs = MaxHeldJobsDefault
	}
	if o.MaxConcurrency <= 0 {
		o.MaxConcurrency = MaxConcurrencyDefault
	}
	if o.MaxKept <= 0 {
		o.MaxKept = MaxKeptDefault
	}
	return o
}

// New returns a Dispatcher.
func New(opts Options) *Dispatcher {
	opts = opts.WithDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Dispatcher{opts: opts, attemptCx: ctx, cancel: cancel, lanes: map[string]*lane{}, heldIDs: map[int64]int{},
		retryIDs: map[int64]bool{}, underWay: map[int64]int{}, tasks: make(chan task), quit: make(chan struct{})}
}

// Connect names where outcomes go and who hears of room. The recorder
// and the claimer need the dispatcher in turn (a recorded outcome frees
// its budget, a claim fills it), so it is connected once all three exist,
// before any job is submitted.
func (d *Dispatcher) Connect(rec Recorder, room RoomWatcher) {
	d.recorder, d.room = rec, room
}

// fullLocked reports whether the global budget is spent.
func (d *Dispatcher) fullLocked() bool {
	return d.heldJobs >= d.opts.MaxHeldJobs || d.heldBytes >= d.opts.MaxHeldBytes
}

func (d *Dispatcher) laneLocked(endpoint string) *lane {
	l := d.lanes[endpoint]
	if l == nil {
		l = &lane{name: endpoint, cap: d.Capacity(endpoint)}
		d.lanes[endpoint] = l
	}
	return l
}

// Capacity is lane's in-flight cap: how many attempts of unfinished
// ingests it makes before it waits for one to commit (see canStart).
func (d *Dispatcher) Capacity(lane string) int { return max(1, d.opts.Capacity(lane)) }

// Reserve promises room for one job on endpoint, for the fast path. It
// reports false when the lane is full (the delivery then waits in the
// queue table) or the dispatcher is stopping.
func (d *Dispatcher) Reserve(endpoint string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return false
	}
	l := d.laneLocked(endpoint)
	limit := l.limit()
	if time.Since(l.lastOK) < DrainWindow && d.heldJobs < d.opts.MaxHeldJobs/2 && d.heldBytes < d.opts.MaxHeldBytes/2 {
		limit = drainingLaneLimit(l.cap)
	}
	if l.held() >= limit || d.fullLocked() {
		return false
	}
	l.reserved++
	d.heldJobs++
	return true
}

// Submit adds a job; reserved says it uses a reservation made by Reserve.
// A job submitted while stopping is released at once.
func (d *Dispatcher) Submit(j *Job, reserved bool) {
	d.mu.Lock()
	l := d.laneLocked(j.Key())
	if reserved && l.reserved > 0 {
		l.reserved--
		d.heldJobs--
	}
	d.heldJobs++
	d.heldBytes += len(j.Payload)
	if j.DeliveryID != 0 {
		d.heldIDs[j.DeliveryID]++
	}
	if d.stopping {
		d.dropIdleLocked(j.Key(), l)
		d.mu.Unlock()
		d.recorder.Record(Outcome{Job: j, Result: Released(j)})
		return
	}
	l.queue = append(l.queue, j)
	d.pumpLocked(l)
	d.mu.Unlock()
}

// dropIdleLocked forgets a lane that holds nothing, so a million per-row
// endpoint names do not accumulate lanes; one that delivered within
// DrainWindow stays a while, so that it still counts as draining when
// its next events come (Room forgets it then).
func (d *Dispatcher) dropIdleLocked(name string, l *lane) {
	if l.idle() && !l.starved && time.Since(l.lastOK) >= DrainWindow {
		delete(d.lanes, name)
	}
}

// Room returns, per endpoint with a lane, how many more jobs it can take
// (endpoints not listed can take LaneLimit of their max_in_flight), and
// how many jobs the dispatcher can take in all.
func (d *Dispatcher) Room() (map[string]int, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]int, len(d.lanes))
	for name, l := range d.lanes {
		if d.dropIdleLocked(name, l); d.lanes[name] == nil {
			continue // a lane not listed is claimed up to its endpoint's cap
		}
		out[name] = max(0, l.limit()-l.held())
	}
	total := max(0, d.opts.MaxHeldJobs-d.heldJobs)
	if d.stopping || d.heldBytes >= d.opts.MaxHeldBytes {
		total = 0
	}
	return out, total
}

// Recorded releases a job's share of the global budget once its outcome
// is recorded (or dropped): until then its payload is still in memory, and
// an instance that cannot record must not keep claiming.
func (d *Dispatcher) Recorded(j *Job) {
	d.mu.Lock()
	d.heldJobs--
	d.heldBytes -= len(j.Payload)
	if id := j.ID(); d.heldIDs[id] > 1 {
		d.heldIDs[id]--
	} else {
		delete(d.heldIDs, id)
	}
	if _, r := j.UnderWay(); r != 0 {
		d.forgetUnderWayLocked(r)
	}
	d.mu.Unlock()
}

// Stopping reports whether Stop has begun.
func (d *Dispatcher) Stopping() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopping
}

// pumpLocked starts queued jobs while the lane has free slots and there
// are global ones; a lane left waiting for a global slot is served, in
// turn, when one frees.
func (d *Dispatcher) pumpLocked(l *lane) {
	for l.canStart() {
		if d.inFlight >= d.opts.MaxConcurrency {
			if !l.starved {
				l.starved = true
				d.starved = append(d.starved, l)
			}
			return
		}
		d.startLocked(l)
	}
}

// startLocked starts the lane's next job.
func (d *Dispatcher) startLocked(l *lane) {
	j := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	l.inFlight++
	d.inFlight++
	select {
	case d.tasks <- task{l, j}:
	default:
		d.running.Add(1)
		go d.work(l, j)
	}
}

// work makes j's attempt and then those handed to it, until it has been
// idle for workerIdle or the dispatcher stops.
func (d *Dispatcher) work(l *lane, j *Job) {
	defer d.running.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		d.run(l, j)
		idle.Reset(workerIdle)
		select {
		case t := <-d.tasks:
			l, j = t.l, t.j
		case <-idle.C:
			return
		case <-d.quit:
			return
		}
	}
}

// pumpStarvedLocked hands freed global slots to waiting lanes, one job a
// lane at a time, round-robin.
func (d *Dispatcher) pumpStarvedLocked() {
	for d.inFlight < d.opts.MaxConcurrency && len(d.starved) > 0 {
		l := d.starved[0]
		d.starved[0] = nil
		d.starved = d.starved[1:]
		l.starved = false
		if !l.canStart() {
			d.dropIdleLocked(l.name, l)
			continue
		}
		d.startLocked(l)
		if l.canStart() {
			l.starved = true
			d.starved = append(d.starved, l)
		}
	}
}

func (d *Dispatcher) run(l *lane, j *Job) {
	var res state.Result
	func() {
		defer func() {
			if p := recover(); p != nil {
				// A bug must not take the relay down or lose the event:
				// count it as a failed attempt, to be retried.
				res = state.Result{DeliveryID: j.DeliveryID, Endpoint: j.Endpoint, Lane: j.Lane, Status: postboxtype.DeliveryFailed,
					Attempted: true, Delay: time.Minute, At: time.Now(), CommitToDeliveryMS: -1,
					LastError: fmt.Sprintf("internal error: %v", p)}
				debug.PrintStack()
			}
		}()
		if j.Ingest != nil && d.withheld(j, &res) {
			return
		}
		res = d.opts.Execute(d.attemptCx, j)
	}()
	if j.Ingest != nil {
		// Only a job whose ingest may not have written it yet has a use
		// for its result (TakeDelivered).
		done := res
		j.result.Store(&done)
	}
	d.mu.Lock()
	l.inFlight--
	d.inFlight--
	// An attempt made before its ingest committed cannot be recorded until
	// it has, and counts until then (see canStart). One whose ingest has
	// committed meanwhile (most, in a catch-up) has nothing to wait for; if
	// it commits between this test and AfterFinish, that runs ingested at
	// once.
	ahead := j.Ingest != nil && !j.Ingest.Finished()
	if ahead {
		l.awaiting++
	}
	if res.Status == postboxtype.DeliveryDelivered {
		l.lastOK = time.Now()
	}
	if !d.stopping {
		if len(d.starved) > 0 {
			d.pumpStarvedLocked()
		}
		d.pumpLocked(l)
	}
	low := l.low()
	d.dropIdleLocked(j.Key(), l)
	d.mu.Unlock()
	if ahead {
		j.Ingest.AfterFinish(func() { d.ingested(l) })
	}
	d.recorder.Record(Outcome{Job: j, Result: res})
	if low {
		d.notifyFree()
	}
}

// withheld reports whether j, which depends on an ingest, must not be
// attempted, and then sets res to its release: its ingest did not write
// its delivery, or the dispatcher stopped while it waited for an ingest
// that may never commit. It is kept out of run's frame, which every
// attempt's goroutine starts with: inlined there, it made the stacks of
// attempts outgrow their first size (docs/benchmarks.md).
//
//go:noinline
func (d *Dispatcher) withheld(j *Job, res *state.Result) bool {
	tx := j.Ingest
	stopped := false
	if tx.Uncertain() {
		// Another instance may be bringing the same events: an attempt
		// now could repeat its. Wait for the outcome.
		_ = tx.Wait(d.attemptCx)
		stopped = !tx.Finished()
	}
	if stopped || wasted(tx, j) {
		*res = Released(j)
		return true
	}
	return false
}

// ingested gives back the room of an attempt whose ingest has finished,
// and starts what waited for it.
func (d *Dispatcher) ingested(l *lane) {
	d.mu.Lock()
	l.awaiting--
	if !d.stopping {
		d.pumpLocked(l)
	}
	low := l.low()
	d.dropIdleLocked(l.name, l)
	d.mu.Unlock()
	if low {
		d.notifyFree()
	}
}

func (d *Dispatcher) notifyFree() {
	if d.room != nil {
		d.room.LaneFreed()
	}
}

// Stop starts no more attempts, releases the queued ones, and waits for
// those in flight. When ctx ends first, their contexts are cancelled (the
// attempts then return released results) and Stop waits for them to return.
func (d *Dispatcher) Stop(ctx context.Context) {
	d.mu.Lock()
	if !d.stopping {
		close(d.quit) // idle attempt goroutines return, busy ones after their attempt
	}
	d.stopping = true
	var queued []*Job
	for _, l := range d.lanes {
		queued = append(queued, l.queue...)
		l.queue = nil
		l.starved = false
	}
	d.starved = nil
	d.mu.Unlock()
	for _, j := range queued {
		d.recorder.Record(Outcome{Job: j, Result: Released(j)})
	}
	done := make(chan struct{})
	go func() {
		d.running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		d.cancel()
		<-done
	}
	d.cancel()
}

// InFlight returns the number of attempts running.
func (d *Dispatcher) InFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inFlight
}
