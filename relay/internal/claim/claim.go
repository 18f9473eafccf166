// Package claim is the claimer: it claims due deliveries from the queue
// table (FOR UPDATE SKIP LOCKED, under this instance's lease) as far as
// the dispatcher has room, and hands them over, with the deliveries the
// ingester kept in flight by id. It wakes when the ingester queued or kept
// rows it could not hand over in memory, when a lane frees while a
// backlog exists, when a retry falls due (one this instance scheduled,
// one another instance said it scheduled, or the earliest the queue held
// when a claim left nothing due behind), when any instance NOTIFYs (a
// replay, another instance's queued rows), and on the slow sweep that
// catches the rest (expired leases). A wake claims from the queue table
// only when it may hold work for a lane with room.
package claim

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// Claim bounds.
const (
	// MaxClaimDefault bounds one claim statement.
	MaxClaimDefault = 1000
	// StaleClaimDefault is how long a delivery stays claimed by this
	// instance, unchanged and not held by its dispatcher, before the
	// sweep returns it to the queue. It only needs to outlast the moment
	// between a claim's commit and its hand-over.
	StaleClaimDefault = 10 * time.Second
	// MaxDueDefault bounds the heap of retry times; beyond it, the sweep
	// finds the retries.
	MaxDueDefault = 100000
	// MaxStaleDefault bounds the deliveries one sweep's rescue looks at.
	// A kept backlog (see dispatch.Dispatcher.ReserveKeep) is in flight
	// and unchanged for as long as it waits: without a bound each sweep
	// would read all of it. A lost claim beyond the bound is found once
	// the backlog has shrunk.
	MaxStaleDefault = 10000
	// MaxStaleRangesDefault bounds the ranges of events under way one
	// sweep looks at for those this instance lost track of.
	MaxStaleRangesDefault = 100
	// RetryClaimGapDefault is the least time between two claims woken by
	// retries falling due: retries due apart are claimed together, each
	// at most this late. A storm of failing partners schedules hundreds
	// of retries a second, and a claim for each moment one falls due kept
	// a claim statement running back to back; a backoff of seconds
	// (full jitter, base 30 s by default) does not need them sooner.
	RetryClaimGapDefault = 100 * time.Millisecond
)

// Dispatcher is what the claimer needs of the dispatcher
// (dispatch.Dispatcher): room to fill and a place to submit claims, the
// deliveries the ingest kept by id, and which deliveries and events under
// way it still holds, for the sweep to find those no one does.
type Dispatcher interface {
	Stopping() bool
	// Room is, per lane it has, how many more jobs it takes, and how many
	// it takes in all.
	Room() (map[string]int, int)
	Submit(j *dispatch.Job, reserved bool)

	// KeptCount is how many deliveries the ingest kept by id;
	// LanesWithKept the lanes that have some; HandOverKept hands them
	// over as far as their lanes have room, and all of those of release.
	KeptCount() int
	LanesWithKept() []string
	HandOverKept(release map[string]bool) map[string][]dispatch.Kept
	// NextRetryDue is when the earliest retry the recorder kept falls
	// due; HandOverDueRetries hands over those due, to load or to return
	// to the queue (see dispatch.Dispatcher.KeepRetry).
	NextRetryDue() (time.Time, bool)
	HandOverDueRetries(now time.Time, all bool, keep func(lane string) bool) (map[string][]int64, []int64)

	// DeliveriesNotHeld and RangesNotHeld return those of ids and ranges
	// the dispatcher holds nothing of.
	DeliveriesNotHeld(ids []int64) []int64
	RangesNotHeld(ranges []int64) []int64
	// ForgetUnderWay says the claimer no longer holds these events under
	// way (one range per event); TakeFinishedRanges hands over the ranges
	// that hold no event of this instance's any more, to be swept.
	ForgetUnderWay(ranges []int64)
	TakeFinishedRanges() []int64
}

// Protection is what the claimer needs of endpoint protection: a fresh
// view of held-back endpoints before each claim, and the probes due.
type Protection interface {
	Refresh(ctx context.Context) error
	// Invalidate makes the next Refresh read the database.
	Invalidate()
	ClaimProbes(ctx context.Context) []store.Claimed
	// Blocked reports whether a lane takes no new work now.
	Blocked(lane string, now time.Time) bool
}

// Claimer claims from the queue table. Start it, Stop it.
type Claimer struct {
	env   *service.Env
	log   zerolog.Logger
	disp  Dispatcher
	prot  Protection
	loops service.Loops
	// hard is Start's context: a claim statement under way when Stop
	// comes runs to its end under it and its deliveries are handed over,
	// so none is left claimed by no one.
	hard context.Context

	wake    service.Signal
	backlog atomic.Bool // the queue table may hold due deliveries
	// due holds when retries fall due: this instance's, and those other
	// instances said they scheduled or the queue showed (see nextRetry);
	// retime makes claimLoop set its timer again after an addition from
	// elsewhere, without a claim cycle.
	due    dueTimes
	retime service.Signal
	// waiting holds the lanes that were full at the last claim: the queue
	// may hold their work. claimLoop's alone.
	waiting map[string]bool
	// watchFree says a freed lane wakes a cycle: from the moment a cycle
	// reads the lanes' room until it has recorded waiting, and while
	// waiting is not empty.
	watchFree atomic.Bool

	// held, when set, names the endpoints whose events wait (rows of
	// postbox.endpoints disabled or invalid): the claim leaves them.
	held func() []string

	mu     sync.Mutex
	closed []string // lanes whose breaker closed: their parked deliveries are due
	sweeps int      // park's count, claimLoop's alone
}

// New returns a Claimer feeding disp.
func New(env *service.Env, disp Dispatcher, prot Protection) *Claimer {
	return &Claimer{env: env, log: env.Logger("claim"), disp: disp, prot: prot, wake: service.NewSignal(), retime: service.NewSignal(), waiting: map[string]bool{}}
}

// HoldFor sets the endpoints the claim leaves in the queue (see held);
// call it before Start, and Queued when they may have changed.
func (c *Claimer) HoldFor(held func() []string) { c.held = held }

// Start runs the claim loop and the LISTEN loop. It claims once at once,
// for deliveries an earlier run left queued.
func (c *Claimer) Start(ctx context.Context) error {
	c.hard = ctx
	c.backlog.Store(true)
	c.wake.Notify()
	return c.loops.Start(ctx, c.claimLoop, c.listenLoop)
}

// Stop ends both loops and waits for them; a claim under way finishes
// first.
func (c *Claimer) Stop() { c.loops.Stop() }

// Queued says the queue table has new due work: claim now.
func (c *Claimer) Queued() {
	c.backlog.Store(true)
	c.wake.Notify()
}

// Wake asks for a cycle that hands over kept deliveries: it claims from
// the queue table only if something queued work, or a lane that was full
// at the last claim has room now.
func (c *Claimer) Wake() { c.wake.Notify() }

// LaneFreed says a lane drained to half (dispatch.RoomWatcher; the
// recorder says it too): claim if the queue may hold more, or hand over
// kept deliveries.
func (c *Claimer) LaneFreed() {
	if c.backlog.Load() || c.watchFree.Load() || c.disp.KeptCount() > 0 {
		c.wake.Notify()
	}
}

// BreakersClosed says these lanes' breakers closed: their parked
// deliveries are due again (see store.Park), at the next cycle.
func (c *Claimer) BreakersClosed(lanes []string) {
	c.mu.Lock()
	c.closed = append(c.closed, lanes...)
	c.mu.Unlock()
	c.Queued()
}

// UnparkAllEvery is how many sweeps go by between unparks that look at
// every parked lane (a minute at the default sweep_interval; the first
// sweep is one of them).
const UnparkAllEvery = 12

// ParkBatchesDefault is how many batches of store.ParkBatchDefault one
// sweep parks at most: a deep backlog behind a breaker that just opened
// is parked over a few sweeps, in short statements.
const ParkBatchesDefault = 5

// RetryAt remembers when a retry this instance scheduled falls due.
func (c *Claimer) RetryAt(t time.Time) { c.due.add(t) }

// RetriesKept says the dispatcher keeps new retries (the recorder kept
// them): time the next cycle for the earliest, without a claim.
func (c *Claimer) RetriesKept() { c.retime.Notify() }

func (c *Claimer) claimLoop(ctx context.Context) {
	sweep := time.NewTicker(c.env.Config().SweepInterval)
	defer sweep.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failures := 0
	var lastDue time.Time // when the timer last found retries due
	for {
		next, ok := c.due.next()
		if kept, has := c.disp.NextRetryDue(); has && (!ok || kept.Before(next)) {
			next, ok = kept, true
		}
		if ok {
			timer.Reset(max(time.Until(next), time.Until(lastDue.Add(RetryClaimGapDefault)), time.Millisecond))
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case <-ctx.Done():
			return
		case <-c.retime:
			continue
		case <-c.env.NotAlone: // the retries kept go back to the queue
		case <-c.wake:
		case <-timer.C:
			lastDue = time.Now()
			if c.due.popDue(lastDue) {
				c.backlog.Store(true) // a retry in the queue is due
			}
		case <-sweep.C:
			c.rescue(c.hard)
			c.sweepUnderWay(c.hard)
			c.park(c.hard)
			c.backlog.Store(true) // the safety net: other instances' work
		}
		more, err := c.claimOnce(c.hard)
		c.env.Faults.Observe("claimer", err)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.backlog.Store(true)
			failures++
			wait := service.RetryWait(failures)
			c.log.Warn().Err(err).Dur("retry_in", wait).Msg("claim failed")
			if !service.Sleep(ctx, wait) {
				return
			}
			c.wake.Notify()
			continue
		}
		failures = 0
		if more {
			c.backlog.Store(true)
		}
	}
}

// claimOnce hands over kept deliveries and claims what the dispatcher has
// room for and submits it, when the queue table may hold due deliveries
// for a lane with room: something queued work (backlog), or a lane that
// was full at the last claim (waiting) has room now. It reports whether
// the queue may hold more for any lane: it filled a lane or its limit
// (see filledALane), or claimed an ordered endpoint's head, or the
// dispatcher had no room at all. A cycle that only hands over kept
// deliveries (a lane freed while the ingest kept a backlog, which fills
// the lanes) claims nothing: in a catch-up that was most cycles, each a
// claim statement that found almost nothing and cost PostgreSQL more to
// plan than to run.
func (c *Claimer) claimOnce(ctx context.Context) (bool, error) {
	if c.disp.Stopping() {
		return false, nil
	}
	cfg := c.env.Config()
	if err := c.prot.Refresh(ctx); err != nil {
		return false, err
	}
	c.mu.Lock()
	closed := c.closed
	c.closed = nil
	c.mu.Unlock()
	if len(closed) > 0 {
		// The sweep unparks what this misses (park).
		if _, err := c.env.Store.Unpark(ctx, closed, store.ParkBatchDefault, false); err != nil {
			c.log.Warn().Err(err).Msg("could not return the deliveries of closed breakers to the queue; the next sweep will")
		}
	}
	for _, p := range c.prot.ClaimProbes(ctx) {
		j := jobFromClaim(p)
		j.Probe = true
		c.disp.Submit(j, false)
	}
	if err := c.submitKept(ctx); err != nil {
		return true, err
	}
	if err := c.submitRetries(ctx); err != nil {
		return true, err
	}
	// Taken after submitKept, which returns kept deliveries to the queue:
	// a Queued during the claim sets it again for the next cycle.
	queued := c.backlog.Swap(false)
	c.watchFree.Store(true)
	defer func() { c.watchFree.Store(len(c.waiting) > 0) }()
	free, total := c.disp.Room()
	if total == 0 {
		return queued, nil
	}
	if !queued && !c.waitingHaveRoom(free) {
		return false, nil
	}
	var ordered []string
	caps := make(map[string]int, len(cfg.Endpoints))
	for name, ep := range cfg.Endpoints {
		if ep.Ordered {
			ordered = append(ordered, name)
		}
		caps[name] = dispatch.LaneLimit(ep.MaxInFlight)
	}
	// free holds the lanes the dispatcher has; a lane it has not is
	// claimed up to its endpoint's cap.
	defaultFree := dispatch.LaneLimit(cfg.Endpoint("").MaxInFlight)
	skip := ordered
	if c.held != nil {
		// Held endpoints' lanes are passed over like ordered ones, and
		// their events wait pending, no attempt spent, until their row
		// changes (which wakes a claim).
		if held := c.held(); len(held) > 0 {
			skip = append(slices.Clip(ordered), held...)
		}
	}
	claimed, err := c.env.Store.Claim(ctx, c.env.Owner, defaultFree, free, caps, min(total, MaxClaimDefault), skip)
	if err != nil {
		return false, err
	}
	// Handed over before anything else can fail: a claimed delivery no
	// one holds waits for the rescue.
	for _, cl := range claimed {
		c.disp.Submit(jobFromClaim(cl), false)
	}
	heads, err := c.env.Store.ClaimOrdered(ctx, c.env.Owner, ordered)
	for _, cl := range heads {
		c.disp.Submit(jobFromClaim(cl), false)
	}
	// A lane that was full for this claim may have left its work behind:
	// the queue may hold it once the lane has room. (Not the lanes full
	// after it: one that drained a little meanwhile is no less behind.) A
	// lane the claim filled is claimed again anyway: it claimed something.
	clear(c.waiting)
	for lane, n := range free {
		if n <= 0 {
			c.waiting[lane] = true
		}
	}
	more := len(heads) > 0 || len(claimed) >= min(total, MaxClaimDefault) || filledALane(claimed, free, caps, defaultFree)
	if err == nil && !more {
		c.nextRetry(ctx)
	}
	return more, err
}

// nextRetry times a claim for when the earliest retry in the queue not
// yet due falls due, whoever scheduled it. This instance knows when its
// own fall due (RetryAt), and others say when they schedule one
// (store.WakeRetryPayload), but not those scheduled before it listened,
// nor the later ones of a batch (a NOTIFY names the earliest): after a
// claim that left nothing due behind, one probe of an index tells. Each
// retry is so learned of once, by the claim at the time before it.
func (c *Claimer) nextRetry(ctx context.Context) {
	in, ok, err := c.env.Store.NextRetryIn(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug().Err(err).Msg("could not read when the next retry falls due; the sweep claims it")
		}
		return
	}
	if !ok {
		return
	}
	at := time.Now().Add(in)
	if next, known := c.due.next(); !known || at.Before(next) {
		// A later one is learned of when the earlier one is claimed.
		c.due.add(at)
	}
}

// retryElsewhere says another instance scheduled a retry falling due in
// d: claim then, if this instance has room (a wake says so when d is 0).
func (c *Claimer) retryElsewhere(d time.Duration) {
	if d <= 0 {
		c.Queued()
		return
	}
	c.due.add(time.Now().Add(d))
	c.retime.Notify()
}

// filledALane reports whether a claim took as many as it could of some
// lane (its cap as claimSQL reads it): that lane's queue may hold more
// that is due. A claim that filled neither a lane nor its limit took all
// that was due when it ran; what falls due later wakes a claim of its own
// (RetryAt, Queued, the sweep). Before, any claim that took something
// asked for another at once: beside a storm of failing partners, whose
// retries fall due a few at a time, the claimer ran claim after claim,
// each finding a handful.
func filledALane(claimed []store.Claimed, free, caps map[string]int, defaultFree int) bool {
	n := map[string]int{}
	for _, cl := range claimed {
		lane := cl.Key()
		n[lane]++
		limit, ok := free[lane]
		if !ok {
			if limit, ok = caps[cl.Endpoint]; !ok {
				limit = defaultFree
			}
		}
		if n[lane] >= limit {
			return true
		}
	}
	return false
}

// waitingHaveRoom reports whether a lane full at the last claim has room
// now, or has left the dispatcher (which then claims it up to its cap).
func (c *Claimer) waitingHaveRoom(free map[string]int) bool {
	for lane := range c.waiting {
		if n, ok := free[lane]; !ok || n > 0 {
			return true
		}
	}
	return false
}

// submitKept submits the deliveries the ingest kept by id (see
// dispatch.Dispatcher.ReserveKeep) as far as their lanes have room, read
// back by id: they are this instance's in flight already. It returns to
// the queue those of lanes that take no work now (an open breaker, a
// pause: the queue parks or holds them), and all of them once another
// instance has registered, which can then claim them too.
func (c *Claimer) submitKept(ctx context.Context) error {
	lanes := c.disp.LanesWithKept()
	if len(lanes) == 0 {
		return nil
	}
	alone, now := c.env.Alone(), c.env.Now()
	release := map[string]bool{}
	for _, lane := range lanes {
		if !alone || c.prot.Blocked(lane, now) {
			release[lane] = true
		}
	}
	var load, back []int64
	var under, underBack keptEvents
	for lane, ks := range c.disp.HandOverKept(release) {
		for _, k := range ks {
			switch {
			case k.Range != 0 && release[lane]:
				underBack.add(lane, k)
			case k.Range != 0:
				under.add(lane, k)
			case release[lane]:
				back = append(back, k.ID)
			default:
				load = append(load, k.ID)
			}
		}
	}
	if len(underBack.events) > 0 {
		// Until this succeeds they are in no one's memory but in this
		// instance's range: the sweep of its ranges queues them.
		_, err := c.env.Store.QueueUnderWay(ctx, c.env.Owner, underBack.events, underBack.ranges, underBack.lanes)
		c.disp.ForgetUnderWay(underBack.ranges)
		if err != nil {
			return err
		}
		c.backlog.Store(true)
	}
	for len(under.events) > 0 {
		n := min(len(under.events), MaxClaimDefault)
		got, err := c.env.Store.LoadUnderWay(ctx, c.env.Owner, under.events[:n], under.ranges[:n])
		if err != nil {
			c.disp.ForgetUnderWay(under.ranges) // as above
			return err
		}
		lanes := make(map[int64]string, n)
		for i, pk := range under.events[:n] {
			lanes[pk] = under.lanes[i]
		}
		for _, cl := range got {
			if l := lanes[cl.EventPK]; l != cl.Endpoint {
				cl.Lane = l
			}
			delete(lanes, cl.EventPK)
			c.disp.Submit(jobFromClaim(cl), false)
		}
		// Those not read have a delivery already, or their range was
		// swept (this instance was thought dead): not this instance's.
		var gone []int64
		for i, pk := range under.events[:n] {
			if _, ok := lanes[pk]; ok {
				gone = append(gone, under.ranges[i])
			}
		}
		c.disp.ForgetUnderWay(gone)
		under.events, under.ranges, under.lanes = under.events[n:], under.ranges[n:], under.lanes[n:]
	}
	for len(back) > 0 {
		// Until this succeeds they are no one's: the sweep's rescue
		// returns them to the queue.
		n := min(len(back), store.ParkBatchDefault)
		if _, err := c.env.Store.Rescue(ctx, c.env.Owner, back[:n]); err != nil {
			return err
		}
		c.backlog.Store(true)
		back = back[n:]
	}
	for len(load) > 0 {
		n := min(len(load), MaxClaimDefault)
		got, err := c.env.Store.LoadOwned(ctx, c.env.Owner, load[:n])
		if err != nil {
			return err // the rescue's, as above
		}
		for _, cl := range got {
			c.disp.Submit(jobFromClaim(cl), false)
		}
		load = load[n:]
	}
	return nil
}

// submitRetries submits the retries the recorder kept that are due, read
// back by id as LoadOwned reads the ingest's kept deliveries: no claim
// writes them. It returns to the queue, at their times, those whose lanes
// take no work now or are full, and all of them once another instance has
// registered, which can then claim them too. Those handed over and then
// neither loaded nor returned (the database failed) are this instance's
// in the table still, held by no one: the rescue returns them once
// overdue (StaleOwned).
func (c *Claimer) submitRetries(ctx context.Context) error {
	now, alone := c.env.Now(), c.env.Alone()
	load, back := c.disp.HandOverDueRetries(time.Now(), !alone, func(lane string) bool {
		return !c.prot.Blocked(lane, now)
	})
	for len(back) > 0 {
		n := min(len(back), store.ParkBatchDefault)
		returned, due, err := c.env.Store.ReturnKept(ctx, c.env.Owner, back[:n], !alone)
		if err != nil {
			return err
		}
		// This instance claims them as it claims any retry: now if one
		// is due, else when the earliest is.
		if returned > 0 && due <= 0 {
			c.backlog.Store(true)
		} else if returned > 0 {
			c.due.add(time.Now().Add(due))
		}
		back = back[n:]
	}
	var ids []int64
	for _, l := range load {
		ids = append(ids, l...)
	}
	for len(ids) > 0 {
		n := min(len(ids), MaxClaimDefault)
		got, err := c.env.Store.LoadOwned(ctx, c.env.Owner, ids[:n])
		if err != nil {
			return err
		}
		for _, cl := range got {
			c.disp.Submit(jobFromClaim(cl), false)
		}
		ids = ids[n:]
	}
	return nil
}

// rescue returns to the queue the deliveries this instance has had in
// flight, untouched, for StaleClaimDefault, and does not hold: their claim
// committed although its answer was lost to a broken connection, so no
// attempt of this instance will record them, and as this instance is
// alive no other releases them.
func (c *Claimer) rescue(ctx context.Context) {
	stale, err := c.env.Store.StaleOwned(ctx, c.env.Owner, StaleClaimDefault, MaxStaleDefault)
	if err == nil && len(stale) > 0 {
		if lost := c.disp.DeliveriesNotHeld(stale); len(lost) > 0 {
			var n int64
			if n, err = c.env.Store.Rescue(ctx, c.env.Owner, lost); n > 0 {
				c.log.Warn().Int64("deliveries", n).Msg("returned claims this instance had lost track of to the queue (their claim's answer was lost)")
				c.Queued()
			}
		}
	}
	if err != nil && ctx.Err() == nil {
		c.log.Warn().Err(err).Msg("could not look for lost claims; trying again at the next sweep")
	}
}

// sweepUnderWay deletes the ranges of events under way this instance is
// done with (each event's delivery written), and sweeps those it has had
// for StaleClaimDefault and holds no event of: their ingest committed
// although its answer was lost, so their events are in no one's memory
// and get pending deliveries.
func (c *Claimer) sweepUnderWay(ctx context.Context) {
	ranges := c.disp.TakeFinishedRanges()
	stale, err := c.env.Store.StaleUnderWay(ctx, c.env.Owner, StaleClaimDefault, MaxStaleRangesDefault)
	if err == nil {
		ranges = append(ranges, c.disp.RangesNotHeld(stale)...)
		var n int64
		if n, err = c.env.Store.SweepOwnUnderWay(ctx, c.env.Owner, ranges, c.env.Config().Lane); n > 0 {
			c.log.Warn().Int64("events", n).Msg("queued events under way this instance had lost track of (their ingest's answer was lost)")
			c.Queued()
		}
	}
	if err != nil && ctx.Err() == nil {
		// Done ranges not deleted now are stale at a later sweep.
		c.log.Warn().Err(err).Msg("could not sweep ranges of events under way; trying again at the next sweep")
	}
}

// park keeps the claim's scans to lanes that may deliver: it parks the
// queued deliveries of lanes whose breaker is open (a claim skips those
// lanes; parked, it need not look at them), and returns to the queue the
// parked deliveries of lanes whose breaker has closed, on any instance. A
// breaker that closes on this instance unparks its lane at once
// (BreakersClosed); this is the safety net, and it parks deep backlogs a
// batch per sweep.
func (c *Claimer) park(ctx context.Context) {
	var parked, unparked int64
	var err error
	for range ParkBatchesDefault {
		var n int64
		if n, err = c.env.Store.Park(ctx, store.ParkBatchDefault); err != nil || n < store.ParkBatchDefault {
			parked += n
			break
		}
		parked += n
	}
	if err == nil {
		// Now and then every parked lane, not only those with a closed
		// breaker: one whose health row was deleted has no breaker left.
		c.sweeps++
		unparked, err = c.env.Store.Unpark(ctx, nil, store.ParkBatchDefault, c.sweeps%UnparkAllEvery == 1)
	}
	if err != nil && ctx.Err() == nil {
		c.log.Warn().Err(err).Msg("could not park or unpark held deliveries; trying again at the next sweep")
	}
	if parked > 0 || unparked > 0 {
		c.log.Debug().Int64("parked", parked).Int64("unparked", unparked).Msg("parked the deliveries of open breakers")
	}
	if unparked > 0 {
		c.backlog.Store(true)
	}
}

// keptEvents are events under way, by id, with their ranges and lanes.
type keptEvents struct {
	events, ranges []int64
	lanes          []string
}

func (k *keptEvents) add(lane string, kept dispatch.Kept) {
	k.events, k.ranges, k.lanes = append(k.events, kept.ID), append(k.ranges, kept.Range), append(k.lanes, lane)
}

func jobFromClaim(c store.Claimed) *dispatch.Job {
	return &dispatch.Job{Event: c.Event, DeliveryID: c.DeliveryID, EventPK: c.EventPK, Range: c.Range, Lane: c.Lane,
		Attempt: c.AttemptCount + 1, CommittedAt: c.CommittedAt}
}

// listenLoop wakes the claimer when any instance (or a replay) queues
// work: a LISTEN on its own connection, reconnecting with backoff. The
// sweep remains the safety net if notifications are lost.
func (c *Claimer) listenLoop(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		conn, err := c.env.Pool().Acquire(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+store.WakeChannel)
			for err == nil {
				attempt = 1
				var n *pgconn.Notification
				n, err = conn.Conn().WaitForNotification(ctx)
				if err == nil {
					if d, owner, ok := store.WakeRetry(n.Payload); ok {
						if owner != c.env.Owner {
							c.retryElsewhere(d)
						}
						continue
					}
					if n.Payload == store.WakeHealth {
						c.prot.Invalidate()
					}
					c.Queued()
				}
			}
			// The connection had a LISTEN: do not give it back to the pool.
			_ = conn.Conn().Close(context.Background())
			conn.Release()
		}
		if ctx.Err() != nil || !service.Sleep(ctx, service.RetryWait(attempt)) {
			return
		}
	}
}

// dueTimes is a min-heap of the times this instance's retries fall due.
type dueTimes struct {
	mu sync.Mutex
	h  timeHeap
}

func (d *dueTimes) add(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.h) < MaxDueDefault {
		heap.Push(&d.h, t)
	}
}

func (d *dueTimes) next() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.h) == 0 {
		return time.Time{}, false
	}
	return d.h[0], true
}

// popDue forgets the times due at now and reports whether there were any.
func (d *dueTimes) popDue(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	popped := false
	for len(d.h) > 0 && !d.h[0].After(now) {
		heap.Pop(&d.h)
		popped = true
	}
	return popped
}

type timeHeap []time.Time

func (h timeHeap) Len() int           { return len(h) }
func (h timeHeap) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h timeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timeHeap) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *timeHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
