package relay

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// claimLoop claims due deliveries from the queue table when woken: by the
// ingester (rows it could not hand over in memory), by a freed slot while
// a backlog exists, by the timer of the earliest retry this instance
// scheduled, and by the slow sweep that catches everything else (other
// instances' retries, expired leases).
func (r *Relay) claimLoop(ctx context.Context) {
	sweep := time.NewTicker(r.cfg.Load().SweepInterval.D())
	defer sweep.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failures := 0
	for {
		if next, ok := r.due.next(); ok {
			timer.Reset(max(time.Until(next), time.Millisecond))
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.claimWake:
		case <-timer.C:
			r.due.popDue(time.Now())
		case <-sweep.C:
		}
		n, err := r.claimOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			wait := retryWait(failures)
			r.log.Warn().Err(err).Dur("retry_in", wait).Msg("claim failed")
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			r.wakeClaimer()
			continue
		}
		failures = 0
		r.backlog.Store(n)
	}
}

// claimOnce claims what the dispatcher has room for and submits it. It
// reports whether the queue may hold more: it claimed something, or the
// dispatcher had no room to claim at all.
func (r *Relay) claimOnce(ctx context.Context) (bool, error) {
	if r.disp.Stopping() {
		return false, nil
	}
	cfg := r.cfg.Load()
	unhealthy, err := r.store.UnhealthyEndpoints(ctx)
	if err != nil {
		return false, err
	}
	r.guard.replace(unhealthy)
	r.claimProbes(ctx)
	free, total := r.disp.Free()
	if total == 0 {
		return true, nil
	}
	var ordered []string
	for name, ep := range cfg.ConfiguredEndpoints() {
		if ep.Ordered {
			ordered = append(ordered, name)
		}
		if _, ok := free[name]; !ok {
			free[name] = dispatch.LaneLimit(ep.MaxInFlight)
		}
	}
	defaultFree := dispatch.LaneLimit(cfg.Endpoint("").MaxInFlight)
	claimed, err := r.store.Claim(ctx, r.owner, defaultFree, free, min(total, 1000), ordered)
	if err != nil {
		return false, err
	}
	heads, err := r.store.ClaimOrdered(ctx, r.owner, ordered)
	if err != nil {
		return false, err
	}
	for _, c := range append(claimed, heads...) {
		r.disp.Submit(jobFromClaim(c), false)
	}
	return len(claimed)+len(heads) > 0, nil
}

// onOutcome queues a finished attempt for recording. It never blocks.
func (r *Relay) onOutcome(o dispatch.Outcome) {
	r.outMu.Lock()
	r.outcomes = append(r.outcomes, o)
	r.outMu.Unlock()
	select {
	case r.outWake <- struct{}{}:
	default:
	}
}

func (r *Relay) takeOutcomes(limit int) []dispatch.Outcome {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	n := min(limit, len(r.outcomes))
	batch := make([]dispatch.Outcome, n)
	copy(batch, r.outcomes[:n])
	r.outcomes = append(r.outcomes[:0], r.outcomes[n:]...)
	return batch
}

// recordLoop writes results in batches until stop is closed; then it
// records what is left (allowing a few seconds) and returns. Writes use
// the relay's hard context, so a graceful stop never cuts one short.
func (r *Relay) recordLoop(stop <-chan struct{}) {
	for {
		final := false
		select {
		case <-r.outWake:
		case <-stop:
			final = true
		}
		ctx, cancel := r.hardCtx, context.CancelFunc(func() {})
		if final {
			ctx, cancel = context.WithTimeout(r.hardCtx, 10*time.Second)
		}
		for {
			batch := r.takeOutcomes(1000)
			if len(batch) == 0 {
				break
			}
			r.record(ctx, batch, final)
		}
		cancel()
		if final {
			return
		}
	}
}

// record writes a batch, retrying while the database is unreachable. An
// outcome whose delivery row is still being ingested waits for that
// transaction without holding up the others; if the ingest failed, the
// delivery does not exist and the stream will bring the event again.
func (r *Relay) record(ctx context.Context, batch []dispatch.Outcome, final bool) {
	results := make([]state.Result, 0, len(batch))
	recorded := make([]*dispatch.Job, 0, len(batch))
	waiting := map[*dispatch.Ingest][]dispatch.Outcome{}
	for _, o := range batch {
		if tx := o.Job.Ingest; tx != nil {
			select {
			case <-tx.Done():
				if err := tx.Wait(ctx); err != nil {
					r.log.Debug().Str("event_id", o.Job.EventID).Err(err).Msg("result dropped: its ingest did not commit")
					r.disp.Recorded(o.Job)
					continue
				}
			default:
				if !final {
					waiting[tx] = append(waiting[tx], o)
					continue
				}
				if err := tx.Wait(ctx); err != nil {
					r.disp.Recorded(o.Job)
					continue
				}
			}
		}
		results = append(results, o.Result)
		recorded = append(recorded, o.Job)
	}
	defer func() {
		for _, j := range recorded {
			r.disp.Recorded(j)
		}
	}()
	for tx, os := range waiting {
		go func() {
			_ = tx.Wait(r.hardCtx)
			for _, o := range os {
				r.onOutcome(o)
			}
		}()
	}
	if len(results) == 0 {
		return
	}
	var changes []store.HealthChange
	for attempt := 1; ; attempt++ {
		var err error
		changes, err = r.store.RecordResults(ctx, r.owner, results, r.applyHealth)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			r.log.Error().Err(err).Int("results", len(results)).
				Msg("results not recorded; those deliveries return to the queue when their leases expire")
			return
		}
		wait := retryWait(attempt)
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("recording results failed")
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	now := time.Now()
	r.guard.update(changes, now)
	r.logTransitions(changes)
	for _, j := range recorded {
		if j.Probe {
			r.guard.setProbing(j.Endpoint, false)
		}
	}
	for _, res := range results {
		r.metrics.Recorded(res)
		switch res.Status {
		case state.Failed:
			r.due.add(now.Add(res.Delay))
		case state.Released:
			r.backlog.Store(true)
		}
	}
	r.wakeClaimer()
}

// maintainLoop keeps this instance registered (which keeps its claims
// its own), returns deliveries of instances that died to the queue, and
// purges ingested outbox rows past their retention.
func (r *Relay) maintainLoop(ctx context.Context) {
	cfg := r.cfg.Load()
	tick := time.NewTicker(max(cfg.Lease.D()/3, 100*time.Millisecond))
	defer tick.Stop()
	for {
		cfg = r.cfg.Load()
		if err := r.store.Heartbeat(ctx, r.instance(), cfg.Lease.D()); err != nil && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("heartbeat failed")
		}
		if n, err := r.store.ReleaseAbandoned(ctx, 5000); err != nil && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("releasing abandoned deliveries failed")
		} else if n > 0 {
			r.log.Info().Int64("deliveries", n).Msg("returned deliveries of a stopped instance to the queue")
			r.backlog.Store(true)
			r.wakeClaimer()
		}
		// With outbox_retention 0 the ingest deletes the rows it ingests,
		// but an application's commit can be streamed a moment before it
		// becomes visible to other sessions, and the delete then misses
		// its row: the purge picks such rows up.
		if _, err := r.store.PurgeIngestedOutbox(ctx, cfg.OutboxRetention.D(), 5000); err != nil && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("purging the outbox failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// dueTimes is a min-heap of the times this instance's retries fall due.
type dueTimes struct {
	mu sync.Mutex
	h  timeHeap
}

// maxDue bounds the heap; beyond it, the sweep finds the retries.
const maxDue = 100000

func (d *dueTimes) add(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.h) < maxDue {
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

func (d *dueTimes) popDue(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.h) > 0 && !d.h[0].After(now) {
		heap.Pop(&d.h)
	}
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

// listenLoop wakes the claimer when any instance (or a replay) queues
// work: a LISTEN on its own connection, reconnecting with backoff. The
// sweep remains the safety net if notifications are lost.
func (r *Relay) listenLoop(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		conn, err := r.pool.Acquire(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+store.WakeChannel)
			for err == nil {
				attempt = 1
				_, err = conn.Conn().WaitForNotification(ctx)
				if err == nil {
					r.backlog.Store(true)
					r.wakeClaimer()
				}
			}
			// The connection had a LISTEN: do not give it back to the pool.
			_ = conn.Conn().Close(context.Background())
			conn.Release()
		}
		if ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryWait(attempt)):
		}
	}
}
