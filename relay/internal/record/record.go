// Package record is the recorder: it buffers the outcomes of attempts and
// writes them to the queue table in batches (deliveries, attempts' latency,
// endpoint health in one transaction), fenced by this instance's claims.
//
// An attempt that started on the fast path may finish before the ingest
// transaction that writes its delivery has committed; its outcome waits
// for that transaction (registered on it, never on a goroutine of its own)
// without holding up the others. It is written whatever the transaction's
// outcome: a failed commit may have committed after all. An attempt that
// delivered before that transaction wrote its delivery was written with it
// (dispatch.Job.TakeDelivered); the recorder then only counts its latency
// and its endpoint's health.
package record

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// ProbeMarginDefault is how long after a breaker's cooldown the claimer
// wakes for its probe, so the database's clock agrees it is due.
const ProbeMarginDefault = 20 * time.Millisecond

// Recorder bounds.
const (
	// MaxBatchDefault bounds the results written in one transaction.
	MaxBatchDefault = 1000
	// FinalDrainDefault bounds the last drain after Stop.
	FinalDrainDefault = 10 * time.Second
	// LingerDefault is how long the recorder gathers outcomes before it
	// writes them, unless LingerBatchDefault are waiting or one of them
	// is a probe's or an ordered endpoint's (whose next delivery waits for
	// it). Recording is off the delivery path, and a write of one result
	// costs as many statements as a write of many (docs/benchmarks.md). A
	// breaker reacts to its streak at once regardless (protect.Observe).
	LingerDefault      = 50 * time.Millisecond
	LingerBatchDefault = 100
)

// Budget is the dispatcher's memory budget (dispatch.Dispatcher): a job
// holds its share until its outcome is written or dropped. The
// dispatcher also keeps the retries the recorder writes as this
// instance's (dispatch.Dispatcher.KeepRetry).
type Budget interface {
	Recorded(j *dispatch.Job)
	CanKeepRetry() bool
	KeepRetry(lane string, id int64, due time.Time)
}

// Health is what the recorder needs of endpoint protection: the breaker
// function applied in the results' transaction, and the changes it made.
type Health interface {
	Apply(cur store.Health, rs []state.Result) store.Health
	Recorded(changes []store.HealthChange, probed []string, now time.Time)
}

// Claimer is what the recorder tells the claimer: retries scheduled,
// deliveries released to the queue, and room freed.
type Claimer interface {
	Queued()
	// LaneFreed wakes the claimer only if its last cycle left work behind.
	LaneFreed()
	RetryAt(t time.Time)
	// RetriesKept says the dispatcher keeps new retries.
	RetriesKept()
	// BreakersClosed returns the lanes' parked deliveries to the queue.
	BreakersClosed(lanes []string)
}

// Recorder writes outcomes. Start it, hand it outcomes (Record), Stop it.
type Recorder struct {
	env    *service.Env
	log    zerolog.Logger
	disp   Budget
	health Health
	claim  Claimer
	loops  service.Loops
	hard   context.Context // Start's: bounds every write, also the final drain

	mu       sync.Mutex
	outcomes []dispatch.Outcome
	wake     service.Signal

	hist *store.Histograms // the loop's alone
}

// New returns a Recorder.
func New(env *service.Env, disp Budget, health Health, claim Claimer) *Recorder {
	return &Recorder{env: env, log: env.Logger("record"), disp: disp, health: health, claim: claim, wake: service.NewSignal(),
		hist: store.NewHistograms()}
}

// Start runs the recording loop; ctx bounds every write.
func (r *Recorder) Start(ctx context.Context) error {
	r.hard = ctx
	return r.loops.Start(ctx, r.loop)
}

// Stop records what is buffered (allowing FinalDrainDefault) and returns
// when the loop has. Stop it after the dispatcher and the ingester: an
// outcome added after the final drain is not recorded (its delivery
// returns to the queue with this instance's lease).
func (r *Recorder) Stop() { r.loops.Stop() }

// Record queues a finished attempt for recording
// (dispatch.Recorder). It never blocks.
func (r *Recorder) Record(o dispatch.Outcome) {
	r.mu.Lock()
	r.outcomes = append(r.outcomes, o)
	r.mu.Unlock()
	r.wake.Notify()
}

// keepRetry reports whether o's retry, if it schedules one, is kept by
// this instance (state.Result.Keep): an instance alone keeps a delivery's
// short retries, unless the attempt was a breaker's probe (whose outcome
// the claimer acts on) or its endpoint delivers in order (the queue holds
// its head). With others running, retries go to the queue, where
// whichever instance is free when one falls due claims it.
func (r *Recorder) keepRetry(o dispatch.Outcome) bool {
	res := &o.Result
	if res.Status != postboxtype.DeliveryFailed || res.DeliveryID == 0 && res.Range == 0 ||
		res.Delay > dispatch.KeepRetryMaxDefault || o.Job.Probe {
		return false
	}
	if r.env.Config().Endpoints[o.Job.Endpoint].Ordered || !r.env.Alone() {
		return false
	}
	return r.disp.CanKeepRetry()
}

// gather reports whether to wait for more outcomes before writing: fewer
// than LingerBatchDefault are waiting, none of them a probe's or an
// ordered endpoint's.
func (r *Recorder) gather() bool {
	cfg := r.env.Config()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.outcomes) >= LingerBatchDefault {
		return false
	}
	for _, o := range r.outcomes {
		if o.Job.Probe || cfg.Endpoints[o.Job.Endpoint].Ordered {
			return false
		}
	}
	return true
}

func (r *Recorder) take(limit int) []dispatch.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(limit, len(r.outcomes))
	batch := make([]dispatch.Outcome, n)
	copy(batch, r.outcomes[:n])
	r.outcomes = append(r.outcomes[:0], r.outcomes[n:]...)
	return batch
}

func (r *Recorder) loop(stop context.Context) {
	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	// Latency counts gathered in memory are written with a batch once
	// due; when no batch comes, on their own.
	flush := time.NewTimer(time.Hour)
	defer flush.Stop()
	for {
		if pending, due := r.hist.Pending(); pending {
			flush.Reset(max(time.Until(due), 0))
		} else {
			flush.Reset(time.Hour)
		}
		final := false
		select {
		case <-flush.C:
			r.flushHistograms(r.hard)
			continue
		case <-r.wake:
			if r.gather() {
				linger.Reset(LingerDefault)
				select {
				case <-linger.C:
				case <-stop.Done():
					final = true
				}
			}
		case <-stop.Done():
			final = true
		}
		ctx, cancel := r.hard, context.CancelFunc(func() {})
		if final {
			ctx, cancel = context.WithTimeout(r.hard, FinalDrainDefault)
		}
		for {
			batch := r.take(MaxBatchDefault)
			if len(batch) == 0 {
				break
			}
			r.record(ctx, batch, final)
		}
		if final {
			r.flushHistograms(ctx)
		}
		cancel()
		if final {
			return
		}
	}
}

// flushHistograms writes the latency counts gathered; if the database
// does not take them now they wait until they are due again.
func (r *Recorder) flushHistograms(ctx context.Context) {
	err := r.env.Store.FlushHistograms(ctx, r.hist)
	r.env.Faults.Observe("recorder", err)
	if err != nil && ctx.Err() == nil {
		r.log.Warn().Err(err).Msg("writing latency histograms failed; trying again when they are next due")
	}
}

// record writes a batch, retrying while the database is unreachable.
func (r *Recorder) record(ctx context.Context, batch []dispatch.Outcome, final bool) {
	results := make([]state.Result, 0, len(batch))
	recorded := make([]*dispatch.Job, 0, len(batch))
	for _, o := range batch {
		tx := o.Job.Ingest
		if tx != nil {
			select {
			case <-tx.Done():
			default:
				if !final {
					// Back in the buffer once its ingest has finished.
					tx.AfterFinish(func() { r.Record(o) })
					continue
				}
			}
			if err := tx.Wait(ctx); err != nil && ctx.Err() != nil {
				r.disp.Recorded(o.Job) // stopping, and the ingest never finished
				continue
			}
		}
		// An event under way is named by its event and range (final once
		// its ingest, if any, has finished, as it has here): its delivery
		// is written with this outcome.
		o.Result.EventPK, o.Result.Range = o.Job.UnderWay()
		if tx != nil {
			// An ingest that failed either rolled back (its delivery does
			// not exist, and the write below changes nothing; the stream
			// brings the event again) or committed unbeknownst to us (the
			// connection died with the COMMIT under way): then the
			// delivery is in flight under this instance, which lives on,
			// and only this result ever releases it.
			//
			// A job submitted before its insert learnt its id from it. It
			// has none when the insert never returned (the ingest failed:
			// the stream brings the event again) or found the event
			// ingested before (its event_id repeated): its attempt, made
			// meanwhile with the same webhook-id, is not recorded. One
			// whose event was written under way has its event and range
			// instead.
			if o.Result.DeliveryID = o.Job.ID(); o.Result.DeliveryID == 0 && o.Result.Range == 0 {
				r.disp.Recorded(o.Job)
				continue
			}
			o.Result.Written = o.Job.Written()
		}
		o.Result.Keep = r.keepRetry(o)
		results = append(results, o.Result)
		recorded = append(recorded, o.Job)
	}
	defer func() {
		for _, j := range recorded {
			r.disp.Recorded(j)
		}
	}()
	if len(results) == 0 {
		return
	}
	var changes []store.HealthChange
	for attempt := 1; ; attempt++ {
		var err error
		// Other instances, told of the retries this batch schedules,
		// claim them when due if this one has no room then.
		changes, err = r.env.Store.RecordResultsTelling(ctx, r.env.Owner, results, r.health.Apply, r.hist, !r.env.Alone())
		r.env.Faults.Observe("recorder", err)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			r.log.Error().Err(err).Int("results", len(results)).
				Msg("results not recorded; those deliveries return to the queue when their leases expire")
			return
		}
		wait := service.RetryWait(attempt)
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("recording results failed")
		service.Sleep(ctx, wait)
	}
	now := time.Now()
	var probed []string
	for _, j := range recorded {
		if j.Probe {
			probed = append(probed, j.Key())
		}
	}
	r.health.Recorded(changes, probed, now)
	for _, c := range changes {
		// A breaker that (re)opened: claim its probe the moment it is due,
		// not at the next sweep.
		if c.New.State == postboxtype.BreakerOpen && !c.New.OpenedAt.Equal(c.Old.OpenedAt) {
			r.claim.RetryAt(c.New.OpenedAt.Add(c.New.Cooldown + ProbeMarginDefault))
		}
	}
	kept := false
	for _, res := range results {
		r.env.Metrics.Recorded(telemetry.Outcome{Endpoint: res.Endpoint, Status: res.Status, Sampled: res.Sampled,
			ResponseMS: res.ResponseMS, CommitToDeliveryMS: res.CommitToDeliveryMS, StreamToAttempt: res.StreamToAttempt})
		switch res.Status {
		case postboxtype.DeliveryFailed:
			if id := max(res.DeliveryID, res.WrittenAs); res.Keep && id != 0 {
				r.disp.KeepRetry(res.Key(), id, now.Add(res.Delay))
				kept = true
				continue
			}
			r.claim.RetryAt(now.Add(res.Delay))
		case state.Released:
			r.claim.Queued()
		}
	}
	if kept {
		r.claim.RetriesKept()
	}
	// The room the results free is worth a claim cycle when the last one
	// left work behind (the claimer knows), when an ordered endpoint's
	// next delivery may now be due, or when a breaker closed. A cycle
	// after every batch regardless would cost a claim query per batch
	// even while the fast path takes every event.
	wake := false
	var closed []string
	for _, c := range changes {
		if c.Old.State != postboxtype.BreakerClosed && c.New.State == postboxtype.BreakerClosed {
			closed = append(closed, c.New.Endpoint)
		}
	}
	if len(closed) > 0 {
		r.claim.BreakersClosed(closed) // wakes it
	}
	cfg := r.env.Config()
	for _, j := range recorded {
		// Only configured endpoints are claimed in order (see the claimer).
		if cfg.Endpoints[j.Endpoint].Ordered {
			wake = true
			break
		}
	}
	if wake {
		r.claim.Queued() // the next head of an ordered endpoint may be due
	} else {
		r.claim.LaneFreed()
	}
}
