package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/service"
)

// Deps are what maintenance needs of the rest of the relay.
type Deps struct {
	// Streaming reports whether this instance streams (for its
	// registration and the gauge).
	Streaming func() bool
	// Queued says deliveries went back to the queue.
	Queued func()
	// Reload swaps in a configuration (the secrets watcher's).
	Reload func(*config.Config) error
	// WalsenderCPU, when set, reads the CPU of the walsender streaming
	// this instance's session where it runs on this machine (ok false
	// otherwise), which walsenderWatch watches.
	WalsenderCPU func() (pid int, c proc.CPU, ok bool)
}

// duty is one maintenance service.
type duty interface {
	Start(ctx context.Context) error
	Stop()
}

// Maintainer starts the maintenance services and stops them. Start it,
// Stop it.
type Maintainer struct {
	duties []duty
}

// New returns a Maintainer of the services env and deps call for.
//
// The services take turns on the pool's connections, so that maintenance
// holds at most three at once whatever their timing and leaves the rest to
// the data path: the liveness duties (heartbeat, rescuer, outbox purger)
// one between them, telemetry and the leader's duties another, the
// leader's lock a third.
func New(env *service.Env, deps Deps) *Maintainer {
	var liveness, telemetry sync.Mutex
	lead := newLeader(env, &telemetry)
	m := &Maintainer{duties: []duty{
		newHeartbeat(env, &liveness, deps.Streaming),
		newRescuer(env, &liveness, deps.Queued),
		newOutboxPurger(env, &liveness),
		newTelemetry(env, &telemetry, lead, deps.Streaming),
		newPercentiles(env, lead),
		newRetentionCleaner(env, lead),
		newLanePruner(env, lead),
		newSecretsWatcher(env, deps.Reload),
	}}
	if deps.WalsenderCPU != nil {
		m.duties = append(m.duties, newWalsenderWatch(env, deps.WalsenderCPU))
	}
	return m
}

// Start starts each service; if one fails to start, those started are
// stopped and its error returned.
func (m *Maintainer) Start(ctx context.Context) error {
	for i, d := range m.duties {
		if err := d.Start(ctx); err != nil {
			stopAll(m.duties[:i])
			return err
		}
	}
	return nil
}

// Stop stops the services and returns once all their goroutines have.
func (m *Maintainer) Stop() { stopAll(m.duties) }

// stopAll stops the duties together, so that a shutdown waits for the
// slowest of them, not for their sum.
func stopAll(duties []duty) {
	var wg sync.WaitGroup
	for _, d := range duties {
		wg.Go(d.Stop)
	}
	wg.Wait()
}

// periodic is a service whose one loop runs a round first after its start,
// then every interval after that round began.
type periodic struct {
	first, interval time.Duration
	loops           service.Loops
}

// start runs round in the service's loop.
func (p *periodic) start(ctx context.Context, round func(context.Context)) error {
	return p.loops.Start(ctx, func(ctx context.Context) { every(ctx, p.first, p.interval, round) })
}

// Stop ends the loop and waits for it.
func (p *periodic) Stop() { p.loops.Stop() }

// every runs round after first, then every interval after each round
// began, until ctx ends.
func every(ctx context.Context, first, interval time.Duration, round func(context.Context)) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(interval)
		round(ctx)
	}
}
