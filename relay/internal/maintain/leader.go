package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/service"
)

// upkeepLock is the advisory lock whose holder refreshes percentiles,
// purges, and logs alert changes for all instances.
const upkeepLock = 0x706f7374626f79 // "postboy"

// leader runs the duties that one instance does for all: each round, the
// one that gets the upkeep lock does it, the others skip it.
type leader struct {
	env *service.Env
	// turn lets one duty of this instance try the lock at a time (two that
	// tried at once would find each other holding it); telemetry takes it
	// too (see New).
	turn *sync.Mutex
}

func newLeader(env *service.Env, turn *sync.Mutex) *leader { return &leader{env: env, turn: turn} }

// do runs f if this instance gets the upkeep lock now.
func (l *leader) do(ctx context.Context, f func(context.Context) error) error {
	l.turn.Lock()
	defer l.turn.Unlock()
	conn, err := l.env.Pool().Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(upkeepLock)).Scan(&got); err != nil {
		return err
	}
	if !got {
		return nil
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(upkeepLock))
	}()
	return f(ctx)
}

// upkeep is a leader's duty run once an interval, looked at more often: an
// instance that was not the leader takes over within a look of the
// leader's stopping, not an interval.
type upkeep struct {
	periodic
	lead     *leader
	log      zerolog.Logger
	runEvery time.Duration
	last     time.Time
	work     func(context.Context) error
}

// newUpkeep returns the service that runs work as the leader every
// interval, looking every TelemetryIntervalDefault from
// TelemetryFirstDefault on.
func newUpkeep(env *service.Env, lead *leader, interval time.Duration, work func(context.Context) error) *upkeep {
	u := &upkeep{lead: lead, log: env.Logger("maintain"), work: work}
	u.first, u.interval = TelemetryFirstDefault, TelemetryIntervalDefault
	u.runEvery = interval
	return u
}

// Start runs the service.
func (u *upkeep) Start(ctx context.Context) error { return u.start(ctx, u.round) }

func (u *upkeep) round(ctx context.Context) {
	if time.Since(u.last) < u.runEvery {
		return
	}
	if err := u.lead.do(ctx, func(ctx context.Context) error {
		u.last = time.Now()
		return u.work(ctx)
	}); err != nil && ctx.Err() == nil {
		u.log.Warn().Err(err).Msg("telemetry upkeep failed")
	}
}
