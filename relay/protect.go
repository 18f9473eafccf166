package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// guard is this instance's view of which endpoints are held back: breakers
// not closed and pauses receivers asked for. The database is the truth
// (shared by every instance); guard is refreshed from it on every claim
// cycle and from each recorded batch.
type guard struct {
	mu        sync.RWMutex
	unhealthy map[string]store.Health
	probing   map[string]bool // endpoints whose probe this instance has in flight
	// streaks counts this instance's own consecutive failures per
	// endpoint. Recording results takes a round trip, and fast failures
	// would meanwhile empty an endpoint's whole buffer into a receiver
	// that is down; a local streak at the threshold holds the endpoint
	// until the shared breaker speaks (or streakHold passes).
	streaks map[string]streak
}

type streak struct {
	n    int
	last time.Time
}

// streakHold is how long a local failure streak holds an endpoint without
// the shared breaker confirming it.
const streakHold = 2 * time.Second

func newGuard() *guard {
	return &guard{unhealthy: map[string]store.Health{}, probing: map[string]bool{}, streaks: map[string]streak{}}
}

// observe counts an attempt's signal in the local streak.
func (g *guard) observe(endpoint string, sig state.Signal, now time.Time) {
	if sig == state.SignalNone {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if sig == state.SignalSuccess {
		delete(g.streaks, endpoint)
		return
	}
	s := g.streaks[endpoint]
	g.streaks[endpoint] = streak{n: s.n + 1, last: now}
}

func (g *guard) replace(m map[string]store.Health) {
	g.mu.Lock()
	g.unhealthy = m
	g.mu.Unlock()
}

// update applies a batch's health changes.
func (g *guard) update(changes []store.HealthChange, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range changes {
		if c.New.State != state.BreakerClosed || c.New.PausedUntil.After(now) {
			g.unhealthy[c.New.Endpoint] = c.New
		} else {
			delete(g.unhealthy, c.New.Endpoint)
		}
	}
}

func (g *guard) get(endpoint string) (store.Health, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	h, ok := g.unhealthy[endpoint]
	return h, ok
}

// holdUntil reports whether an attempt for endpoint must wait, and until
// when (zero: until the probe decides). A probe job passes a half-open
// breaker that this instance probes.
func (g *guard) holdUntil(endpoint string, threshold int, probe bool, owner string, now time.Time) (bool, time.Time) {
	g.mu.RLock()
	h, ok := g.unhealthy[endpoint]
	s := g.streaks[endpoint]
	g.mu.RUnlock()
	if !probe && s.n >= threshold && now.Sub(s.last) < streakHold {
		return true, time.Time{}
	}
	if !ok {
		return false, time.Time{}
	}
	if h.PausedUntil.After(now) {
		return true, h.PausedUntil
	}
	switch h.State {
	case state.BreakerOpen:
		return true, h.OpenedAt.Add(h.Cooldown)
	case state.BreakerHalfOpen:
		if probe && h.ProbeOwner == owner {
			return false, time.Time{}
		}
		return true, time.Time{}
	}
	return false, time.Time{}
}

// blocked reports whether endpoint takes no new work now (fast path).
func (g *guard) blocked(endpoint string, now time.Time) bool {
	h, ok := g.get(endpoint)
	return ok && (h.State != state.BreakerClosed || h.PausedUntil.After(now))
}

func (g *guard) setProbing(endpoint string, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if on {
		g.probing[endpoint] = true
	} else {
		delete(g.probing, endpoint)
	}
}

// probeCandidates are the endpoints this instance may try to probe: open
// with the cooldown passed, or half-open with a prober that is gone or is
// this instance without a probe in flight.
func (g *guard) probeCandidates(owner string, now time.Time) []probeCandidate {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var out []probeCandidate
	for name, h := range g.unhealthy {
		if g.probing[name] || h.PausedUntil.After(now) {
			continue
		}
		b := policy.Breaker{State: h.State, OpenedAt: h.OpenedAt, Cooldown: h.Cooldown}
		switch {
		case b.ProbeDue(now):
			out = append(out, probeCandidate{endpoint: name})
		case h.State == state.BreakerHalfOpen:
			out = append(out, probeCandidate{endpoint: name, retry: h.ProbeOwner == owner})
		}
	}
	return out
}

type probeCandidate struct {
	endpoint string
	retry    bool
}

// applyHealth is the store.HealthFunc: it runs the endpoint's breaker over
// the batch's results and records streaks and pauses.
func (r *Relay) applyHealth(cur store.Health, rs []state.Result) store.Health {
	ep := r.cfg.Load().Endpoint(cur.Endpoint)
	settings := policy.BreakerSettings{
		Threshold:   ep.FailureThreshold,
		Cooldown:    ep.Cooldown,
		MaxCooldown: ep.MaxCooldown,
		SlowP95:     time.Duration(cur.P95MS*float64(time.Millisecond)) > policy.SlowP95,
	}
	b := policy.Breaker{State: cur.State, Failures: cur.ConsecutiveFailures, OpenedAt: cur.OpenedAt, Cooldown: cur.Cooldown}
	if b.Cooldown <= 0 {
		b.Cooldown = ep.Cooldown
	}
	next := cur
	for _, res := range rs {
		if res.Pause > 0 {
			if until := res.At.Add(res.Pause); until.After(next.PausedUntil) {
				next.PausedUntil = until
			}
		}
		switch res.Signal {
		case state.SignalSuccess:
			b = b.Record(false, res.At, settings)
			next.LastSuccessAt = res.At
		case state.SignalFailure:
			b = b.Record(true, res.At, settings)
		}
		// Every failed attempt is the endpoint's latest failure, also one
		// (a 401, a template error) that says nothing about its health.
		if res.Attempted && res.Status != state.Delivered {
			next.LastFailureAt, next.LastError, next.LastStatusCode = res.At, res.LastError, res.StatusCode
		}
	}
	next.State, next.ConsecutiveFailures, next.OpenedAt, next.Cooldown = b.State, b.Failures, b.OpenedAt, b.Cooldown
	next.FailureThreshold = settings.EffectiveThreshold()
	if next.State != state.BreakerHalfOpen {
		next.ProbeOwner = ""
	}
	return next
}

// logTransitions logs each breaker transition once: only the instance
// whose batch made it sees the change.
func (r *Relay) logTransitions(changes []store.HealthChange) {
	for _, c := range changes {
		if c.Old.State == c.New.State {
			continue
		}
		ev := r.log.Info()
		msg := "circuit breaker closed: the endpoint recovered"
		switch c.New.State {
		case state.BreakerOpen:
			ev = r.log.Warn().Int("consecutive_failures", c.New.ConsecutiveFailures).
				Int("threshold", c.New.FailureThreshold).Dur("cooldown", c.New.Cooldown).Str("last_error", c.New.LastError)
			msg = "circuit breaker opened: holding this endpoint's events until a probe succeeds"
			if c.Old.State == state.BreakerHalfOpen {
				msg = "circuit breaker re-opened: the probe failed"
			}
		case state.BreakerHalfOpen:
			msg = "circuit breaker half-open: probing"
		}
		ev.Str("endpoint", c.New.Endpoint).Stringer("from", c.Old.State).Stringer("to", c.New.State).Msg(msg)
	}
}

// claimProbes claims one probe delivery for each endpoint whose breaker
// is due for one, if this instance wins it.
func (r *Relay) claimProbes(ctx context.Context) {
	now := time.Now()
	for _, pc := range r.guard.probeCandidates(r.owner, now) {
		ordered := r.cfg.Load().Endpoint(pc.endpoint).Ordered
		c, ok, err := r.store.ClaimProbe(ctx, r.owner, pc.endpoint, pc.retry, ordered)
		if err != nil {
			r.log.Warn().Err(err).Str("endpoint", pc.endpoint).Msg("claiming a probe failed")
			continue
		}
		if !ok {
			continue
		}
		h, _ := r.guard.get(pc.endpoint)
		h.State, h.ProbeOwner = state.BreakerHalfOpen, r.owner
		r.guard.mu.Lock()
		r.guard.unhealthy[pc.endpoint] = h
		r.guard.mu.Unlock()
		r.guard.setProbing(pc.endpoint, true)
		r.log.Info().Str("endpoint", pc.endpoint).Str("event_id", c.EventID).Msg("circuit breaker half-open: probing with one delivery")
		j := jobFromClaim(c)
		j.Probe = true
		r.disp.Submit(j, false)
	}
}

func jobFromClaim(c store.Claimed) *dispatch.Job {
	return &dispatch.Job{
		DeliveryID: c.DeliveryID, Endpoint: c.Endpoint, Attempt: c.AttemptCount + 1,
		EventID: c.EventID, URL: c.URL, EventType: c.EventType, Payload: c.Payload, Headers: c.Headers,
		CreatedAt: c.CreatedAt, CommittedAt: c.CommittedAt,
	}
}

// limiter hands out tokens from the shared buckets of rate-limited
// endpoints. Waiters of one endpoint take tokens from the database
// together, so a burst costs one round trip, not one per event.
type limiter struct {
	s       *store.Store
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	mu      sync.Mutex
	tokens  int       // taken from the shared bucket, not yet used
	takenAt time.Time // when; unused tokens go stale after a second
	waiters atomic.Int32
}

func newLimiter(s *store.Store) *limiter { return &limiter{s: s, buckets: map[string]*bucket{}} }

// Burst is how many events a rate may send at once: one second's worth,
// at least one, at most the rate's own count.
func Burst(r config.Rate) float64 {
	return float64(max(1, min(r.N, int(r.PerSecond()+0.999999))))
}

// wait blocks until endpoint may send one event under rate, or ctx ends.
func (l *limiter) wait(ctx context.Context, endpoint string, rate config.Rate) error {
	l.mu.Lock()
	b := l.buckets[endpoint]
	if b == nil {
		b = &bucket{}
		l.buckets[endpoint] = b
	}
	l.mu.Unlock()
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if b.tokens > 0 && time.Since(b.takenAt) < time.Second {
			b.tokens--
			return nil
		}
		got, next, err := l.s.TakeTokens(ctx, endpoint, int(b.waiters.Load()), rate.PerSecond(), Burst(rate))
		if err != nil {
			return err
		}
		if got > 0 {
			b.tokens, b.takenAt = got-1, time.Now()
			return nil
		}
		b.mu.Unlock()
		t := time.NewTimer(max(next, 5*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			b.mu.Lock()
			return ctx.Err()
		case <-t.C:
		}
		b.mu.Lock()
	}
}
