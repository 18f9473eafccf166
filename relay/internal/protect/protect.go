package protect

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// ProbeIdleRecheckDefault is how long an endpoint whose breaker was due a
// probe but had nothing queued waits before it is looked at again: ten
// thousand dead endpoints with nothing to send cost one statement now and
// then, not one query each per claim cycle.
const ProbeIdleRecheckDefault = 2 * time.Second

// RefreshIntervalDefault is the shortest time between two reads of the
// endpoints held back: claim cycles come faster than breakers change, and
// a claim checks the database's view itself.
const RefreshIntervalDefault = 250 * time.Millisecond

// StreakHoldDefault is how long a local failure streak holds an endpoint
// without the shared breaker confirming it.
const StreakHoldDefault = 2 * time.Second

// Protection is this instance's view of which endpoints are held back, and
// its share of their rate limits.
type Protection struct {
	env *service.Env
	log zerolog.Logger

	mu        sync.RWMutex
	unhealthy map[string]store.Health
	probing   map[string]bool // endpoints whose probe this instance has in flight
	// idle holds, per endpoint due a probe that had nothing queued, when
	// to look again (ProbeIdleRecheckDefault).
	idle map[string]time.Time
	// refreshed is when the view was last read from the database.
	refreshed time.Time
	// streaks counts this instance's own consecutive failures per
	// endpoint. Recording results takes a round trip, and fast failures
	// would meanwhile empty an endpoint's whole buffer into a receiver
	// that is down; a local streak at the threshold holds the endpoint
	// until the shared breaker speaks (or StreakHoldDefault passes).
	streaks map[string]streak

	limit limiter
}

type streak struct {
	n    int
	last time.Time
}

// New returns a Protection with nothing held back.
func New(env *service.Env) *Protection {
	return &Protection{
		env:       env,
		log:       env.Logger("protect"),
		unhealthy: map[string]store.Health{},
		probing:   map[string]bool{},
		idle:      map[string]time.Time{},
		streaks:   map[string]streak{},
		limit:     limiter{s: env.Store, buckets: map[string]*bucket{}},
	}
}

// Observe counts an attempt's signal in the endpoint's local streak.
func (p *Protection) Observe(endpoint string, sig state.Signal, now time.Time) {
	if sig == state.SignalNone {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if sig == state.SignalSuccess {
		delete(p.streaks, endpoint)
		return
	}
	s := p.streaks[endpoint]
	p.streaks[endpoint] = streak{n: s.n + 1, last: now}
}

// Invalidate makes the next Refresh read the database, however recent
// the view (a pause or resume was announced).
func (p *Protection) Invalidate() {
	p.mu.Lock()
	p.refreshed = time.Time{}
	p.mu.Unlock()
}

// Refresh replaces the view of held-back endpoints with the database's,
// unless it was read less than RefreshIntervalDefault ago.
func (p *Protection) Refresh(ctx context.Context) error {
	p.mu.RLock()
	fresh := time.Since(p.refreshed) < RefreshIntervalDefault
	p.mu.RUnlock()
	if fresh {
		return nil
	}
	m, err := p.env.Store.UnhealthyEndpoints(ctx)
	if err != nil {
		return err
	}
	now, wall := p.env.Now(), time.Now()
	p.mu.Lock()
	p.unhealthy, p.refreshed = m, wall
	for ep, until := range p.idle {
		if _, held := m[ep]; !held || !wall.Before(until) {
			delete(p.idle, ep)
		}
	}
	// A streak that holds nothing any more is forgotten, so endpoints
	// that failed once and were never heard of again cost nothing.
	for ep, s := range p.streaks {
		if now.Sub(s.last) >= StreakHoldDefault {
			delete(p.streaks, ep)
		}
	}
	p.mu.Unlock()
	p.limit.prune(now)
	return nil
}

// Hold reports whether an attempt in lane (an endpoint, or an endpoint
// and a row URL's host: config.Config.Lane) must wait, and until when
// (zero: until the probe decides). A probe job passes a half-open breaker
// that this instance probes. A pause of the endpoint holds all its lanes.
func (p *Protection) Hold(lane string, threshold int, probe bool, now time.Time) (bool, time.Time) {
	p.mu.RLock()
	h, ok := p.unhealthy[lane]
	s := p.streaks[lane]
	whole := p.endpointPauseLocked(lane)
	p.mu.RUnlock()
	if !probe && s.n >= threshold && now.Sub(s.last) < StreakHoldDefault {
		return true, time.Time{}
	}
	if whole.After(now) {
		return true, whole
	}
	if !ok {
		return false, time.Time{}
	}
	if h.PausedUntil.After(now) {
		return true, h.PausedUntil
	}
	switch h.State {
	case postboxtype.BreakerOpen:
		return true, h.OpenedAt.Add(h.Cooldown)
	case postboxtype.BreakerHalfOpen:
		if probe && h.ProbeOwner == p.env.Owner {
			return false, time.Time{}
		}
		return true, time.Time{}
	}
	return false, time.Time{}
}

// Blocked reports whether lane takes no new work now (the fast path asks
// before it reserves a slot).
func (p *Protection) Blocked(lane string, now time.Time) bool {
	p.mu.RLock()
	h, ok := p.unhealthy[lane]
	whole := p.endpointPauseLocked(lane)
	p.mu.RUnlock()
	return whole.After(now) || ok && (h.State != postboxtype.BreakerClosed || h.PausedUntil.After(now))
}

// endpointPauseLocked is the pause of the endpoint lane belongs to when
// lane is one of its row URLs' hosts (zero otherwise).
func (p *Protection) endpointPauseLocked(lane string) time.Time {
	if name := p.env.Config().NameOf(lane); name != lane {
		return p.unhealthy[name].PausedUntil
	}
	return time.Time{}
}

// Apply is the store.HealthFunc: it runs the endpoint's breaker over a
// batch's results and records pauses and the latest failure.
func (p *Protection) Apply(cur store.Health, rs []state.Result) store.Health {
	cfg := p.env.Config()
	ep := cfg.Endpoint(cfg.NameOf(cur.Endpoint)) // cur.Endpoint is a lane key
	settings := policy.BreakerSettings{
		Threshold:   ep.FailureThreshold,
		Cooldown:    ep.Cooldown,
		MaxCooldown: ep.MaxCooldown,
		SlowP95:     time.Duration(cur.P95MS*float64(time.Millisecond)) > policy.SlowP95,
		Jitter:      p.env.Rand,
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
		if res.Attempted && res.Status != postboxtype.DeliveryDelivered {
			next.LastFailureAt, next.LastError, next.LastStatusCode = res.At, res.LastError, res.StatusCode
		}
	}
	next.State, next.ConsecutiveFailures, next.OpenedAt, next.Cooldown = b.State, b.Failures, b.OpenedAt, b.Cooldown
	next.FailureThreshold = settings.EffectiveThreshold()
	if next.State != postboxtype.BreakerHalfOpen {
		next.ProbeOwner = ""
	}
	return next
}

// Recorded applies a recorded batch's health changes, logs each breaker
// transition once (only the instance whose batch made it sees it), and
// ends the probes of the given endpoints.
func (p *Protection) Recorded(changes []store.HealthChange, probed []string, now time.Time) {
	p.mu.Lock()
	for _, c := range changes {
		if c.New.State != postboxtype.BreakerClosed || c.New.PausedUntil.After(now) {
			p.unhealthy[c.New.Endpoint] = c.New
		} else {
			delete(p.unhealthy, c.New.Endpoint)
		}
	}
	for _, ep := range probed {
		delete(p.probing, ep)
	}
	p.mu.Unlock()
	for _, c := range changes {
		p.logTransition(c)
	}
}

func (p *Protection) logTransition(c store.HealthChange) {
	if c.Old.State == c.New.State {
		return
	}
	ev := p.log.Info()
	msg := "circuit breaker closed: the endpoint recovered"
	switch c.New.State {
	case postboxtype.BreakerOpen:
		ev = p.log.Warn().Int("consecutive_failures", c.New.ConsecutiveFailures).
			Int("threshold", c.New.FailureThreshold).Dur("cooldown", c.New.Cooldown).Str("last_error", c.New.LastError)
		msg = "circuit breaker opened: holding this endpoint's events until a probe succeeds"
		if c.Old.State == postboxtype.BreakerHalfOpen {
			msg = "circuit breaker re-opened: the probe failed"
		}
	case postboxtype.BreakerHalfOpen:
		msg = "circuit breaker half-open: probing"
	}
	ev.Str("endpoint", c.New.Endpoint).Stringer("from", c.Old.State).Stringer("to", c.New.State).Msg(msg)
}

// probeCandidate is an endpoint this instance may try to probe.
type probeCandidate struct {
	endpoint string
	retry    bool // half-open with this instance's probe lost
}

// probeCandidates are the endpoints open with the cooldown passed, or
// half-open with a prober that is gone or is this instance without a
// probe in flight.
func (p *Protection) probeCandidates(now time.Time) []probeCandidate {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []probeCandidate
	for name, h := range p.unhealthy {
		if p.probing[name] || h.PausedUntil.After(now) || p.endpointPauseLocked(name).After(now) || now.Before(p.idle[name]) {
			continue
		}
		b := policy.Breaker{State: h.State, OpenedAt: h.OpenedAt, Cooldown: h.Cooldown}
		switch {
		case b.ProbeDue(now):
			out = append(out, probeCandidate{endpoint: name})
		case h.State == postboxtype.BreakerHalfOpen:
			out = append(out, probeCandidate{endpoint: name, retry: h.ProbeOwner == p.env.Owner})
		}
	}
	return out
}

// ClaimProbes claims one probe delivery for each endpoint whose breaker is
// due for one, where this instance wins it, and returns them: one
// statement for all of them.
func (p *Protection) ClaimProbes(ctx context.Context) []store.Claimed {
	now := time.Now()
	pcs := p.probeCandidates(now)
	if len(pcs) == 0 {
		return nil
	}
	cfg := p.env.Config()
	cands := make([]store.ProbeCandidate, len(pcs))
	for i, pc := range pcs {
		cands[i] = store.ProbeCandidate{Endpoint: pc.endpoint, Retry: pc.retry, Ordered: cfg.Endpoint(cfg.NameOf(pc.endpoint)).Ordered}
	}
	out, err := p.env.Store.ClaimProbes(ctx, p.env.Owner, cands)
	if err != nil {
		p.log.Warn().Err(err).Int("endpoints", len(cands)).Msg("claiming probes failed")
		return nil
	}
	won := make(map[string]bool, len(out))
	p.mu.Lock()
	for _, c := range out {
		lane := c.Key()
		won[lane] = true
		h := p.unhealthy[lane]
		h.State, h.ProbeOwner = postboxtype.BreakerHalfOpen, p.env.Owner
		p.unhealthy[lane] = h
		p.probing[lane] = true
	}
	for _, pc := range pcs {
		if !won[pc.endpoint] {
			p.idle[pc.endpoint] = now.Add(ProbeIdleRecheckDefault)
		}
	}
	p.mu.Unlock()
	for _, c := range out {
		p.log.Info().Str("endpoint", c.Key()).Str("event_id", c.EventID).Msg("circuit breaker half-open: probing with one delivery")
	}
	return out
}
