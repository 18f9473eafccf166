package protect

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// Limiter timing.
const (
	// TokenStaleDefault is how long tokens taken from the shared bucket
	// stay usable by this instance.
	TokenStaleDefault = time.Second
	// TokenRecheckMin is the shortest wait before asking the bucket again.
	TokenRecheckMin = 5 * time.Millisecond
)

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
	takenAt time.Time // when; unused tokens go stale after TokenStaleDefault
	waiters atomic.Int32
}

// prune forgets the buckets no attempt waits on whose tokens have gone
// stale: the shared bucket in the database keeps the endpoint's pace.
func (l *limiter) prune(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ep, b := range l.buckets {
		if b.waiters.Load() == 0 && b.mu.TryLock() {
			if now.Sub(b.takenAt) >= TokenStaleDefault {
				delete(l.buckets, ep)
			}
			b.mu.Unlock()
		}
	}
}

// burst is how many events a rate may send at once: one second's worth,
// at least one, at most the rate's own count.
func burst(r config.Rate) float64 {
	return float64(max(1, min(r.N, int(r.PerSecond()+0.999999))))
}

// Wait blocks until endpoint may send one event under rate, or ctx ends.
// Above the rate an event waits, holding only its own endpoint's slot.
func (p *Protection) Wait(ctx context.Context, endpoint string, rate config.Rate) error {
	l := &p.limit
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
		if b.tokens > 0 && time.Since(b.takenAt) < TokenStaleDefault {
			b.tokens--
			return nil
		}
		got, next, err := l.s.TakeTokens(ctx, endpoint, int(b.waiters.Load()), rate.PerSecond(), burst(rate))
		if err != nil {
			return err
		}
		if got > 0 {
			b.tokens, b.takenAt = got-1, time.Now()
			return nil
		}
		b.mu.Unlock()
		t := time.NewTimer(max(next, TokenRecheckMin))
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
