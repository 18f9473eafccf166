// Package dispatch runs delivery attempts in memory: one lane per endpoint,
// each with its own bounded number of attempts in flight and a small queue,
// so a slow or failing endpoint only ever occupies its own slots.
//
// Jobs arrive two ways: straight from ingestion (the fast path: the
// ingester reserves a slot before it writes the delivery as in_flight), or
// claimed from the queue table. Each finished attempt is handed to the
// OnOutcome callback, which records it.
package dispatch

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Job is one delivery attempt to make.
type Job struct {
	// DeliveryID is the delivery's id; 0 for a job submitted before its
	// ingest inserted the delivery, which learns it from Assign (see ID).
	DeliveryID int64
	Endpoint   string
	// Lane is the job's lane when it is not its endpoint's own: the
	// endpoint and its row URL's host (config.Config.Lane). Lanes, not
	// endpoints, hold in-flight caps, breakers, pauses and rate limits.
	Lane        string
	Attempt     int // the number of this attempt, from 1
	EventID     string
	URL         string // the row's own URL ("" for the endpoint's)
	EventType   string
	Payload     []byte
	Headers     []byte
	CreatedAt   time.Time
	CommittedAt time.Time // zero when unknown
	// Message: written with outbox.Emit, delivered only while
	// outbox_messages is on (execute.Resolve).
	Message bool
	// Received is when the stream had the row, for a first attempt started
	// from the stream (zero for the others).
	Received time.Time
	// Ingest, when not nil, is the transaction that writes this delivery;
	// its result can be recorded only once that has committed.
	Ingest *Ingest
	// Probe marks the one attempt that tests a half-open circuit breaker.
	Probe bool
	// EventPK and Range name an event under way (DeliveryID 0), whose
	// delivery the recorder writes once (store.RecordUnderWay).
	EventPK, Range int64

	assigned atomic.Int64 // the id Assign gave a job submitted before its insert
	// The event and range AssignUnderWay gave a job submitted before its
	// insert, whose event was written under way.
	assignedEvent, assignedRange atomic.Int64
	// result is the attempt's outcome once it has finished (set before
	// OnOutcome, for a job with an Ingest); written, that its ingest wrote
	// it with the delivery (TakeDelivered).
	result  atomic.Pointer[state.Result]
	written atomic.Bool
}

// TakeDelivered returns the outcome of a first attempt that has already
// delivered, for the ingest that has not yet inserted its delivery to
// write it delivered at once, with its attempt, rather than in flight for
// the recorder to update: one row version and its index entries instead
// of two. The job is marked written (Written); its outcome still goes to
// the recorder for the endpoint's health and statistics. It reports false
// for a job not finished, not delivered, or taken already.
func (j *Job) TakeDelivered() (state.Result, bool) {
	r := j.result.Load()
	if r == nil || r.Status != postboxtype.DeliveryDelivered || !r.Attempted || !r.Sampled || j.Ingest == nil || j.Ingest.Finished() {
		return state.Result{}, false
	}
	if !j.written.CompareAndSwap(false, true) {
		return state.Result{}, false
	}
	return *r, true
}

// Written reports whether the job's ingest wrote its outcome with the
// delivery (TakeDelivered). Once the job's Ingest has finished it is
// final.
func (j *Job) Written() bool { return j.written.Load() }

// ID is the job's delivery id: DeliveryID, or for a job submitted before
// its ingest inserted it, the id Assign gave it (0 until then, and for
// good when its event had been ingested already). Once its Ingest has
// finished the id is final.
func (j *Job) ID() int64 {
	if j.DeliveryID != 0 {
		return j.DeliveryID
	}
	return j.assigned.Load()
}

// UnderWay is the event and range of a job whose event is under way
// (its delivery not written yet): EventPK and Range, or for a job
// submitted before its ingest, those AssignUnderWay gave it. Range is 0
// for any other job. Once its Ingest has finished they are final.
func (j *Job) UnderWay() (eventPK, rangeID int64) {
	if j.Range != 0 {
		return j.EventPK, j.Range
	}
	return j.assignedEvent.Load(), j.assignedRange.Load()
}

// Key is the job's lane key: its Lane, or its endpoint's.
func (j *Job) Key() string {
	return state.LaneKey(j.Endpoint, j.Lane)
}

// Ingest tracks an ingest transaction that jobs depend on.
type Ingest struct {
	done chan struct{}
	// live reports whether the transaction may still commit: while it
	// does not, an attempt waits for its outcome (see Dispatcher.run).
	live func() bool

	mu       sync.Mutex
	err      error
	finished bool
	after    []func()
}

// NewIngest returns an unfinished Ingest. live, when not nil, reports
// whether the transaction may still commit: for the ingest of a stream,
// whether this instance still holds the lead it streams under. While it
// does not (the instance was paused, or cut off from the database, long
// enough for another to take over and bring the same events), the jobs
// that depend on the transaction start no attempt until it has finished.
func NewIngest(live func() bool) *Ingest { return &Ingest{done: make(chan struct{}), live: live} }

// Finish marks the transaction committed (nil) or failed, and runs what
// AfterFinish registered.
func (i *Ingest) Finish(err error) {
	i.mu.Lock()
	i.err, i.finished = err, true
	after := i.after
	i.after = nil
	close(i.done)
	i.mu.Unlock()
	for _, f := range after {
		f()
	}
}

// AfterFinish runs f once the transaction has finished: at once when it
// has, else from Finish, in the finishing goroutine (so f must not block).
func (i *Ingest) AfterFinish(f func()) {
	i.mu.Lock()
	if !i.finished {
		i.after = append(i.after, f)
		i.mu.Unlock()
		return
	}
	i.mu.Unlock()
	f()
}

// Done is closed when the transaction has finished.
func (i *Ingest) Done() <-chan struct{} { return i.done }

// uncertain reports whether the transaction has not finished and may
// never commit (see NewIngest).
func (i *Ingest) uncertain() bool {
	return i.live != nil && !i.Finished() && !i.live()
}

// wasted reports whether the transaction finished without writing j's
// delivery or its event under way: it failed (the stream brings the event
// again, to this instance or another), or found the event ingested before.
func (i *Ingest) wasted(j *Job) bool {
	if !i.Finished() {
		return false
	}
	_, r := j.UnderWay()
	return i.Err() != nil || j.ID() == 0 && r == 0
}

// Finished reports whether the transaction has finished.
func (i *Ingest) Finished() bool {
	select {
	case <-i.done:
		return true
	default:
		return false
	}
}

// Err is the transaction's outcome once Done is closed.
func (i *Ingest) Err() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.err
}

// Wait blocks until the transaction finished and returns its error.
func (i *Ingest) Wait(ctx context.Context) error {
	select {
	case <-i.done:
		return i.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Outcome is a finished (or released) job and its result.
type Outcome struct {
	Job    *Job
	Result state.Result
}

// Options configure a Dispatcher.
type Options struct {
	// Capacity is an endpoint's max_in_flight.
	Capacity func(endpoint string) int
	// Execute makes one attempt. Its context is cancelled only when a
	// shutdown runs out of grace; it should then return a released result.
	Execute func(ctx context.Context, j *Job) state.Result
	// OnOutcome receives every finished job. It must not block for long,
	// and must call Recorded once the outcome is recorded or dropped.
	OnOutcome func(Outcome)
	// OnFree is called (without locks held) when a lane has drained to
	// half its limit, so the queue can be claimed from in batches.
	OnFree func()
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

// Dispatcher runs attempts, endpoint by endpoint.
type Dispatcher struct {
	opts      Options
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
	kept     int     // across lanes, reservations included
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

type lane struct {
	name     string
	cap      int
	inFlight int
	reserved int
	queue    []*Job
	// awaiting are attempts made whose ingest has not finished (see
	// canStart).
	awaiting int
	starved  bool      // in Dispatcher.starved
	lastOK   time.Time // when an attempt of the lane last delivered
	// kept are deliveries written in flight for this instance, or events
	// under way (Kept.Range), held by id alone (see ReserveKeep), oldest
	// first; keepReserved are promised to events being ingested.
	kept         []Kept
	keepReserved int
}

// canStart reports whether the lane's next job may start now: a free
// slot, and, for a job whose ingest has not finished, fewer than
// AheadLimit attempts already made that wait for an ingest. Those cannot
// be recorded until it commits, and a crash before then repeats them all:
// the fast path may start attempts before the commit, for the latency of
// live events, but a lane that answers quickly must not run through its
// whole buffer ahead of a slow ingest. At most AheadLimit(cap) + cap - 1
// attempts a lane are then outstanding at a crash beyond what the queue
// table shows in flight.
func (l *lane) canStart() bool {
	if l.inFlight >= l.cap || len(l.queue) == 0 {
		return false
	}
	j := l.queue[0]
	return j.Ingest == nil || l.awaiting < AheadLimit(l.cap) || j.Ingest.Finished()
}

// AheadLimit is how many finished attempts a lane with in-flight cap c may
// have waiting for their ingest's commit before its next attempt waits
// for it too. Under full insert load (8 producers, about 2,000 events/s
// over 10 endpoints) an ingest's write takes 5-20 ms and the walsender
// sends in bursts, so a lane gets more than c events within one commit:
// at c, 0.9-3 % of first attempts waited more than 20 ms (up to 200) for
// a commit, at 3 × c 0.06-0.8 %. The delivery p99 was over 50 ms in 13
// of 14 runs at c (46-127 ms), under it in 12 of 25 at 3 × c (22-121 ms;
// alternating runs, the rest mostly the walsender's). The cost is what a
// crash repeats near that load: a kill -9 at about 1,600 events/s
// repeated 7-78 deliveries in six runs at 3 × c, 0-27 in six at c. A
// lane at a live rate rarely has c attempts ahead, so the limit seldom
// binds there: at 1,000 events/s a kill repeated 1-51 with either, mostly
// what the recorder's linger held.
func AheadLimit(c int) int { return 3 * c }

// low reports whether the lane has drained to half its limit (to half its
// kept limit while it keeps deliveries): room for the claimer to fill.
func (l *lane) low() bool {
	return l.held() <= l.limit()/2 || len(l.kept) > 0 && l.held() <= l.keptLimit()/2
}

// held is how many jobs the lane holds or has promised room for, in
// memory, with the attempts still waiting for their ingest; kept
// deliveries wait outside it.
func (l *lane) held() int { return l.inFlight + l.reserved + len(l.queue) + l.awaiting }

// keptLimit is how many jobs the lane may hold once its kept deliveries
// are read back (KeptLaneLimit).
func (l *lane) keptLimit() int { return KeptLaneLimit(l.cap) }

// KeptLaneLimit is how many jobs a lane with in-flight cap c may hold once
// its kept deliveries are read back: twice LaneLimit, so that each read
// brings many (they were kept because the lane drains) and the claimer
// wakes for them half as often. In a catch-up of 100,000 events, reads
// of LaneLimit cost PostgreSQL a fifth more CPU per event, mostly in the
// claimer's cycles, than reads of twice as many; four times as many saved
// no more and held more memory.
func KeptLaneLimit(c int) int { return 2 * LaneLimit(c) }

// idle reports whether the lane holds nothing at all.
func (l *lane) idle() bool { return l.held() == 0 && len(l.kept) == 0 && l.keepReserved == 0 }

// limit is how many jobs a lane may hold: its in-flight cap plus a buffer
// of four times as many, so a slot that frees is refilled without a
// database round trip and claims come in batches.
func (l *lane) limit() int { return LaneLimit(l.cap) }

// LaneLimit is how many jobs a lane with in-flight cap c may hold.
func LaneLimit(c int) int { return 5 * c }

// DrainingLaneLimit is how many jobs the fast path may give a lane with
// in-flight cap c that is draining: it delivered within DrainWindow.
// During a catch-up the ingest outruns the attempts; every event the fast
// path takes is written in flight once, where one left to the queue is
// written pending and claimed (a second write of its row and its
// indexes). A lane that hangs or fails delivers nothing, so it never holds
// more than LaneLimit; nor does any lane once the dispatcher holds half
// its budget, which stays for claims and the other lanes.
func DrainingLaneLimit(c int) int { return 50 * c }

// DrainWindow is how recent a lane's last delivery must be for it to
// count as draining.
const DrainWindow = time.Second

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
		underWay: map[int64]int{}, tasks: make(chan task), quit: make(chan struct{})}
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
		limit = DrainingLaneLimit(l.cap)
	}
	if l.held() >= limit || d.fullLocked() {
		return false
	}
	l.reserved++
	d.heldJobs++
	return true
}

// Unreserve gives back a reservation that will not be used.
func (d *Dispatcher) Unreserve(endpoint string) {
	d.mu.Lock()
	if l := d.lanes[endpoint]; l != nil && l.reserved > 0 {
		l.reserved--
		d.heldJobs--
		d.dropIdleLocked(endpoint, l)
	}
	d.mu.Unlock()
	d.notifyFree()
}

// ReserveKeep promises room for one delivery of lane to be kept by id:
// for the ingest, when Reserve refused it a slot. A lane that drains
// (delivered within DrainWindow) is then better served by its delivery
// written in flight for this instance, its id kept in memory and its
// event read back by id once the lane has room (TakeKept), than by the
// queue: that costs the claim's second write of the row and its indexes.
// The ingest keeps deliveries only while no other instance could claim
// them instead. It reports false when the lane does not drain, the
// dispatcher keeps MaxKept already, or it is stopping.
func (d *Dispatcher) ReserveKeep(lane string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping || d.kept >= d.opts.MaxKept {
		return false
	}
	l := d.laneLocked(lane)
	if time.Since(l.lastOK) >= DrainWindow {
		d.dropIdleLocked(lane, l)
		return false
	}
	l.keepReserved++
	d.kept++
	return true
}

// Keep turns a reservation of ReserveKeep into a kept delivery or event
// under way, once the transaction that wrote it has committed; with id 0
// it gives the reservation back.
func (d *Dispatcher) Keep(lane string, k Kept) {
	id := k.ID
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.lanes[lane]
	if l == nil || l.keepReserved == 0 {
		return
	}
	l.keepReserved--
	if id == 0 || d.stopping {
		d.kept--
		d.dropIdleLocked(lane, l)
		return
	}
	l.kept = append(l.kept, k)
	if k.Range != 0 {
		d.underWay[k.Range]++
	}
}

// Kept is a delivery kept by id, or with Range, an event under way kept
// by its id (no delivery is written yet).
type Kept struct {
	ID, Range int64
}

// Kept is how many deliveries are kept by id, reservations included.
func (d *Dispatcher) Kept() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kept
}

// KeptLanes returns the lanes that have kept deliveries.
func (d *Dispatcher) KeptLanes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for name, l := range d.lanes {
		if len(l.kept) > 0 {
			out = append(out, name)
		}
	}
	return out
}

// TakeKept hands over, per lane, the kept deliveries that fit the room
// the lane has, oldest first, and for the lanes in all every kept
// delivery regardless of room. The caller submits them (or returns them
// to the queue).
func (d *Dispatcher) TakeKept(all map[string]bool) map[string][]Kept {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kept == 0 {
		return nil
	}
	out := map[string][]Kept{}
	for name, l := range d.lanes {
		n := len(l.kept)
		if !all[name] {
			n = min(n, l.keptLimit()-l.held())
		}
		if n <= 0 {
			continue
		}
		out[name] = slices.Clone(l.kept[:n])
		l.kept = append(l.kept[:0], l.kept[n:]...)
		d.kept -= n
		d.dropIdleLocked(name, l)
	}
	return out
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
		d.opts.OnOutcome(Outcome{Job: j, Result: Released(j)})
		return
	}
	l.queue = append(l.queue, j)
	d.pumpLocked(l)
	d.mu.Unlock()
}

// dropIdleLocked forgets a lane that holds nothing, so a million per-row
// endpoint names do not accumulate lanes; one that delivered within
// DrainWindow stays a while, so that it still counts as draining when
// its next events come (Free forgets it then).
func (d *Dispatcher) dropIdleLocked(name string, l *lane) {
	if l.idle() && !l.starved && time.Since(l.lastOK) >= DrainWindow {
		delete(d.lanes, name)
	}
}

// Free returns, per endpoint with a lane, how many more jobs it can take
// (endpoints not listed can take LaneLimit of their max_in_flight), and
// how many jobs the dispatcher can take in all.
func (d *Dispatcher) Free() (map[string]int, int) {
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
		d.letGoLocked(r)
	}
	d.mu.Unlock()
}

// LetGo tells the dispatcher that the caller no longer holds these events
// under way, one range per event: returned to the queue, or found written
// or swept when loaded (see Kept).
func (d *Dispatcher) LetGo(ranges []int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range ranges {
		d.letGoLocked(r)
	}
}

func (d *Dispatcher) letGoLocked(r int64) {
	switch n := d.underWay[r]; {
	case n > 1:
		d.underWay[r] = n - 1
	case n == 1:
		delete(d.underWay, r)
		d.done = append(d.done, r)
	}
}

// TakeDone hands over the ranges of events under way that no longer hold
// any event of this instance's: the claimer sweeps them.
func (d *Dispatcher) TakeDone() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.done
	d.done = nil
	return out
}

// UnheldRanges returns those of ranges of which the dispatcher holds no
// event.
func (d *Dispatcher) UnheldRanges(ranges []int64) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int64
	for _, r := range ranges {
		if d.underWay[r] == 0 {
			out = append(out, r)
		}
	}
	return out
}

// Assign gives a job submitted before its delivery was inserted the id
// the insert returned (0: its event had been ingested before, so the
// delivery is another's and this job's outcome is dropped). The ingester
// calls it before it finishes the job's Ingest.
func (d *Dispatcher) Assign(j *Job, id int64) {
	j.assigned.Store(id)
	if id != 0 {
		d.mu.Lock()
		d.heldIDs[id]++
		d.mu.Unlock()
	}
}

// AssignUnderWay gives a job submitted before its insert the event and
// range of its event, written under way (store.Ingested): the recorder
// writes its delivery with the attempt's outcome. The ingester calls it
// before it finishes the job's Ingest.
func (d *Dispatcher) AssignUnderWay(j *Job, eventPK, rangeID int64) {
	j.assignedEvent.Store(eventPK)
	j.assignedRange.Store(rangeID)
	d.mu.Lock()
	d.underWay[rangeID]++
	d.mu.Unlock()
}

// Unheld returns those of ids the dispatcher does not hold: not submitted
// (nor kept, see ReserveKeep), or recorded already.
func (d *Dispatcher) Unheld(ids []int64) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var kept map[int64]bool
	if d.kept > 0 {
		kept = make(map[int64]bool, len(ids))
		for _, id := range ids {
			kept[id] = false
		}
		for _, l := range d.lanes {
			for _, k := range l.kept {
				if _, ok := kept[k.ID]; ok && k.Range == 0 {
					kept[k.ID] = true
				}
			}
		}
	}
	var out []int64
	for _, id := range ids {
		if d.heldIDs[id] == 0 && !kept[id] {
			out = append(out, id)
		}
	}
	return out
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
	d.opts.OnOutcome(Outcome{Job: j, Result: res})
	if low {
		d.notifyFree()
	}
}

// withheld reports whether j, which depends on an ingest, must not be
// attempted, and then sets res to its release: its ingest did not write
// its delivery, or the dispatcher stopped while it waited for an ingest
// that may never commit. It is
// kept out of run's frame, which every attempt's goroutine starts with:
// inlined there, it made the stacks of attempts outgrow their first size
// (a catch-up spent 8 % of the relay's CPU copying them).
//
//go:noinline
func (d *Dispatcher) withheld(j *Job, res *state.Result) bool {
	tx := j.Ingest
	stopped := false
	if tx.uncertain() {
		// Another instance may be bringing the same events: an attempt
		// now could repeat its. Wait for the outcome.
		_ = tx.Wait(d.attemptCx)
		stopped = !tx.Finished()
	}
	if stopped || tx.wasted(j) {
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
	if d.opts.OnFree != nil {
		d.opts.OnFree()
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
		d.opts.OnOutcome(Outcome{Job: j, Result: Released(j)})
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

// Released is the result that returns a job's delivery to the queue
// without counting an attempt.
func Released(j *Job) state.Result {
	return state.Result{DeliveryID: j.DeliveryID, Endpoint: j.Endpoint, Lane: j.Lane, Status: state.Released,
		At: time.Now(), CommitToDeliveryMS: -1}
}
