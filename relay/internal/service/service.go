// Package service is what postbox's long-running parts share: the small
// environment each is built with (Env), and Loops, which starts a
// service's goroutines and joins every one of them on Stop.
//
// A service has Start(ctx) error and Stop(). The context given to Start
// bounds all of the service's work, including what it finishes after Stop
// (the relay cancels it only when a shutdown runs out of time); Stop asks
// the service to finish and returns once all its goroutines have returned.
package service

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Env is what every service is built with: the database, the current
// configuration, the instance's name, a logger, a clock and the metrics.
type Env struct {
	Store   *store.Store
	Log     zerolog.Logger
	Metrics *telemetry.Metrics
	// Owner is this instance's name in leases and claims.
	Owner string
	// DBName is the database the relay streams from.
	DBName string
	// Now is the clock for timestamps; Rand returns floats in [0,1) for
	// backoff jitter.
	Now  func() time.Time
	Rand func() float64
	// Version is postbox's version, for the instance's registration.
	Version string
	// Faults collects the database faults the services run into.
	Faults *Faults

	// NotAlone is notified when a look finds others alive after none
	// (SetAlone): the claimer returns the retries it kept to the queue.
	NotAlone Signal

	cfg   *atomic.Pointer[config.Config]
	alone atomic.Bool
}

// Alone reports whether the last look found no other instance alive
// (false until one has looked).
func (e *Env) Alone() bool { return e.alone.Load() }

// SetAlone records what the last look found (see Alone), and reports
// whether that changed.
func (e *Env) SetAlone(alone bool) (changed bool) {
	changed = e.alone.Swap(alone) != alone
	if changed && !alone && e.NotAlone != nil {
		e.NotAlone.Notify()
	}
	return changed
}

// NewEnv returns an Env whose Config reads cfg, which the relay swaps on
// reload.
func NewEnv(cfg *atomic.Pointer[config.Config]) *Env { return &Env{cfg: cfg, NotAlone: NewSignal()} }

// Config is the configuration in force now.
func (e *Env) Config() *config.Config { return e.cfg.Load() }

// Pool is the relay's connection pool.
func (e *Env) Pool() *pgxpool.Pool { return e.Store.Pool }

// Logger is the environment's logger for one component.
func (e *Env) Logger(component string) zerolog.Logger {
	return e.Log.With().Str("component", component).Logger()
}

// Instance is this instance's registration row.
func (e *Env) Instance(streaming bool) store.Instance {
	host, _ := os.Hostname()
	in := store.Instance{ID: e.Owner, Hostname: host, PID: os.Getpid(), Version: e.Version, Streaming: streaming, Process: proc.Self()}
	if fs := e.Faults.Current(); len(fs) > 0 {
		in.Fault, in.FaultSince = fs[0].Cause, fs[0].Since
	}
	return in
}

// ErrStarted refuses a second Start.
var ErrStarted = errors.New("service already started")

// Loops runs a service's goroutines: each gets a context that ends on Stop
// (or when Start's context ends), and Stop returns when all have returned.
type Loops struct {
	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// Start runs each loop in its own goroutine.
func (l *Loops) Start(ctx context.Context, loops ...func(ctx context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return ErrStarted
	}
	l.started = true
	ctx, l.cancel = context.WithCancel(ctx)
	for _, f := range loops {
		l.wg.Go(func() { f(ctx) })
	}
	return nil
}

// Go runs one more goroutine under the same ownership (a session's
// helper, say); it must return when ctx ends.
func (l *Loops) Go(f func()) { l.wg.Go(f) }

// Stop ends the loops' contexts and waits for every goroutine.
func (l *Loops) Stop() {
	l.mu.Lock()
	cancel := l.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	l.wg.Wait()
}

// Signal is a wake-up that coalesces: many Notify calls before a receive
// wake the receiver once.
type Signal chan struct{}

// NewSignal returns a Signal.
func NewSignal() Signal { return make(Signal, 1) }

// Notify wakes the receiver without blocking.
func (s Signal) Notify() {
	select {
	case s <- struct{}{}:
	default:
	}
}

// Sleep waits for d or until ctx ends; it reports whether the full time
// passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Retry bounds of RetryWait. The cap is what a fault that has cleared can
// still cost: the wait a loop began before it cleared (the replication
// session's holds back every new event). A try is one statement or one
// connection, so trying every few seconds through a long outage costs the
// database nothing it would notice.
const (
	RetryBaseDefault = 500 * time.Millisecond
	RetryCapDefault  = 5 * time.Second
)

// RetryWait is the wait before retry n (from 1) of a failing database
// operation: RetryBaseDefault doubling to RetryCapDefault, with jitter.
func RetryWait(n int) time.Duration {
	d := RetryBaseDefault << min(max(n, 1)-1, 6)
	d = min(d, RetryCapDefault)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
