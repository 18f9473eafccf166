package policy

import (
	"time"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Breaker is an endpoint's circuit breaker, the seed's state machine:
//
//	          threshold consecutive failures
//	closed ───────────────────────────────────▶ open ◀──────────┐
//	   ▲                                          │              │ probe fails:
//	   │ probe succeeds:                          │ cooldown     │ cooldown × 2,
//	   │ cooldown reset                           ▼ passed       │ up to max_cooldown
//	   └──────────────────────────────────── half_open ─────────┘
//	                                       (exactly one probe)
//
// While open or half-open no attempts start except the probe: queued
// events wait without spending attempts. The state lives in
// postbox.endpoint_health and changes under that row's lock, so every
// instance shares one breaker per endpoint; this type is the pure
// transition logic.
type Breaker struct {
	State    postboxtype.BreakerState
	Failures int // consecutive
	OpenedAt time.Time
	Cooldown time.Duration // the current one, doubled by failed probes
}

// BreakerSettings are an endpoint's breaker parameters.
type BreakerSettings struct {
	Threshold   int
	Cooldown    time.Duration
	MaxCooldown time.Duration
	// SlowP95 marks an endpoint whose p95 latency is above 5 s: each of its
	// failures holds a worker for a whole timeout, so it trips at half the
	// threshold.
	SlowP95 bool
	// Jitter, when set, returns floats in [0,1): each cooldown is shortened
	// by up to a quarter at random, so that probes cannot fall into step
	// with an endpoint that fails on a period of its own (every probe
	// landing in its bad phase, forever).
	Jitter func() float64
}

// jittered is d shortened by up to a quarter at random (d when s has no
// Jitter).
func (s BreakerSettings) jittered(d time.Duration) time.Duration {
	if s.Jitter == nil {
		return d
	}
	return d - time.Duration(float64(d)*0.25*s.Jitter())
}

// SlowP95 is the p95 latency above which the threshold is halved.
const SlowP95 = 5 * time.Second

// EffectiveThreshold is the threshold in force for these settings.
func (s BreakerSettings) EffectiveThreshold() int {
	t := max(1, s.Threshold)
	if s.SlowP95 {
		t = max(1, t/2)
	}
	return t
}

// ProbeDue reports whether an open breaker's cooldown has passed, so one
// probe may be attempted.
func (b Breaker) ProbeDue(now time.Time) bool {
	return b.State == postboxtype.BreakerOpen && !now.Before(b.OpenedAt.Add(b.Cooldown))
}

// Record applies one attempt's outcome at now and returns the new state.
func (b Breaker) Record(failed bool, now time.Time, s BreakerSettings) Breaker {
	if b.State == "" {
		b.State = postboxtype.BreakerClosed
	}
	if b.Cooldown <= 0 {
		b.Cooldown = s.Cooldown
	}
	if !failed {
		// Any success is evidence of health: the probe's, or a straggler
		// that was in flight when the breaker opened.
		return Breaker{State: postboxtype.BreakerClosed, Cooldown: s.Cooldown}
	}
	b.Failures++
	switch b.State {
	case postboxtype.BreakerClosed:
		if b.Failures >= s.EffectiveThreshold() {
			b.State, b.OpenedAt, b.Cooldown = postboxtype.BreakerOpen, now, s.jittered(s.Cooldown)
		}
	case postboxtype.BreakerHalfOpen:
		b.State, b.OpenedAt = postboxtype.BreakerOpen, now
		b.Cooldown = s.jittered(min(2*b.Cooldown, s.MaxCooldown))
	}
	// Open: failures of attempts that were already in flight change nothing.
	return b
}
