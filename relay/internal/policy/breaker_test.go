package policy_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

func TestBreakerStateMachine(t *testing.T) {
	t.Parallel()
	s := policy.BreakerSettings{Threshold: 3, Cooldown: time.Minute, MaxCooldown: 5 * time.Minute}
	now := time.Unix(1_800_000_000, 0)
	var b policy.Breaker
	require.True(t, b.OK())

	b = b.Record(true, now, s)
	b = b.Record(true, now, s)
	require.True(t, b.OK(), "two failures stay below the threshold")
	b = b.Record(false, now, s)
	require.Zero(t, b.Failures, "a success resets the streak")
	for range 3 {
		b = b.Record(true, now, s)
	}
	require.Equal(t, postboxtype.BreakerOpen, b.State, "threshold consecutive failures open it")
	require.False(t, b.OK())
	require.False(t, b.ProbeDue(now.Add(59*time.Second)))
	require.True(t, b.ProbeDue(now.Add(time.Minute)))
	require.Equal(t, now.Add(time.Minute), b.ReopensAt())

	// Stragglers failing while open change nothing.
	b2 := b.Record(true, now.Add(time.Second), s)
	require.Equal(t, b.OpenedAt, b2.OpenedAt)
	require.Equal(t, b.Cooldown, b2.Cooldown)

	// The probe fails: the cooldown doubles each time, up to the cap.
	at := now
	for _, want := range []time.Duration{2, 4, 5, 5} {
		at = at.Add(b.Cooldown)
		b.State = postboxtype.BreakerHalfOpen // the probe's claim made it half-open
		b = b.Record(true, at, s)
		require.Equal(t, postboxtype.BreakerOpen, b.State)
		require.Equal(t, want*time.Minute, b.Cooldown)
		require.Equal(t, at, b.OpenedAt)
	}
	// The probe succeeds: closed, the cooldown back to its base.
	b.State = postboxtype.BreakerHalfOpen
	b = b.Record(false, at.Add(b.Cooldown), s)
	require.Equal(t, postboxtype.BreakerClosed, b.State)
	require.Equal(t, time.Minute, b.Cooldown)
	require.True(t, b.OK())
}

func TestSlowEndpointsTripAtHalfTheThreshold(t *testing.T) {
	t.Parallel()
	s := policy.BreakerSettings{Threshold: 10, Cooldown: time.Minute, MaxCooldown: time.Hour, SlowP95: true}
	require.Equal(t, 5, s.EffectiveThreshold())
	var b policy.Breaker
	for range 5 {
		b = b.Record(true, time.Now(), s)
	}
	require.Equal(t, postboxtype.BreakerOpen, b.State)
	require.Equal(t, 1, policy.BreakerSettings{Threshold: 1, SlowP95: true}.EffectiveThreshold())
}

// With Jitter, each cooldown is shortened by up to a quarter at random,
// never lengthened past the cap, so probes do not fall into step with an
// endpoint that fails periodically.
func TestBreakerCooldownsAreJittered(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	s := policy.BreakerSettings{Threshold: 1, Cooldown: 10 * time.Second, MaxCooldown: 10 * time.Second, Jitter: rng.Float64}
	now := time.Unix(1_800_000_000, 0)
	seen := map[time.Duration]bool{}
	var b policy.Breaker
	b = b.Record(true, now, s)
	for range 50 {
		require.Equal(t, postboxtype.BreakerOpen, b.State)
		require.LessOrEqual(t, b.Cooldown, s.MaxCooldown)
		require.GreaterOrEqual(t, b.Cooldown, s.MaxCooldown*3/4)
		seen[b.Cooldown.Truncate(100*time.Millisecond)] = true
		now = now.Add(b.Cooldown)
		b.State = postboxtype.BreakerHalfOpen
		b = b.Record(true, now, s)
	}
	require.Greater(t, len(seen), 10, "the cooldowns vary")
}
