package portal

import (
	"sync"
	"time"
)

// limiter counts events per key in fixed one-minute windows: coarse, but
// enough to keep one link or address from hammering sign-in, exports or
// resends.
type limiter struct {
	mu  sync.Mutex
	now func() time.Time
	win time.Time
	n   map[string]int
}

// limiterKeys bounds the map between windows (many addresses at once
// share the excess: still limited, never unbounded memory).
const limiterKeys = 10000

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, n: map[string]int{}}
}

// allow counts one event for key and reports whether it is within max
// this minute.
func (l *limiter) allow(key string, max int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.now().Truncate(time.Minute)
	if !w.Equal(l.win) {
		l.win, l.n = w, map[string]int{}
	}
	if _, ok := l.n[key]; !ok && len(l.n) >= limiterKeys {
		key = "overflow"
	}
	l.n[key]++
	return l.n[key] <= max
}
