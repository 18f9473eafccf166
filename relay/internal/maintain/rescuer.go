package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// ReleaseBatchDefault bounds one statement of the rescuer.
const ReleaseBatchDefault = 5000

// rescuer returns to the queue the deliveries of instances that died, at
// the heartbeat's cadence.
type rescuer struct {
	periodic
	env    *service.Env
	log    zerolog.Logger
	turn   *sync.Mutex // the liveness duties' (see New)
	queued func()
	gone   map[string]time.Time // releaseAbandoned's
}

func newRescuer(env *service.Env, turn *sync.Mutex, queued func()) *rescuer {
	r := &rescuer{env: env, log: env.Logger("maintain"), turn: turn, queued: queued, gone: map[string]time.Time{}}
	r.interval = heartbeatInterval(env.Config().Lease)
	return r
}

// Start runs the rescuer at once, then every interval.
func (r *rescuer) Start(ctx context.Context) error { return r.start(ctx, r.rescue) }

func (r *rescuer) rescue(ctx context.Context) {
	r.turn.Lock()
	defer r.turn.Unlock()
	n, err := releaseAbandoned(ctx, r.env.Store, r.gone, time.Now(), r.env.Config().Lane)
	if err != nil && ctx.Err() == nil {
		r.log.Warn().Err(err).Msg("releasing abandoned deliveries failed")
	} else if n > 0 {
		r.log.Info().Int64("deliveries", n).Msg("returned deliveries of a stopped instance to the queue")
		r.queued()
	}
}

// releaseAbandoned returns to the queue the deliveries of instances this
// one has seen gone (store.DeadOwners) at every sweep for
// store.LifeGraceDefault at least; gone maps each owner so seen to when it
// was first seen gone. An instance alive but cut off for a moment can look
// gone: after a read-only spell its heartbeats are older than the grace,
// and when its connection for life is cut as the spell ends, it holds its
// lock again only at its next heartbeat. Released then, the deliveries it
// is attempting would be attempted again by another instance. Waiting a
// grace more leaves it the time to come back; a crashed instance's
// deliveries return a grace later than they would at once.
func releaseAbandoned(ctx context.Context, st *store.Store, gone map[string]time.Time, now time.Time, lane store.LaneFunc) (int64, error) {
	owners, err := st.DeadOwners(ctx)
	if err != nil {
		return 0, err
	}
	still := make(map[string]bool, len(owners))
	var confirmed []string
	for _, o := range owners {
		still[o] = true
		since, seen := gone[o]
		switch {
		case !seen:
			gone[o] = now
		case now.Sub(since) >= store.LifeGraceDefault:
			confirmed = append(confirmed, o)
		}
	}
	for o := range gone {
		if !still[o] {
			delete(gone, o)
		}
	}
	return st.ReleaseAbandonedOf(ctx, confirmed, ReleaseBatchDefault, lane)
}
