package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// ReleaseBatchDefault bounds one statement of the rescuer.
const ReleaseBatchDefault = 5000

// rescuer returns to the queue the deliveries of instances that died, at
// the heartbeat's cadence: at once those of an instance of this host whose
// process it sees gone (proc.Gone), the others by the heartbeat rule.
type rescuer struct {
	periodic
	env    *service.Env
	log    zerolog.Logger
	turn   *sync.Mutex // the liveness duties' (see New)
	queued func()
	gone   map[string]time.Time // releaseAbandoned's
	proven map[string]bool      // releaseAbandoned's: owners proven gone
}

func newRescuer(env *service.Env, turn *sync.Mutex, queued func()) *rescuer {
	r := &rescuer{env: env, log: env.Logger("maintain"), turn: turn, queued: queued,
		gone: map[string]time.Time{}, proven: map[string]bool{}}
	r.interval = heartbeatInterval(env.Config().Lease)
	return r
}

// Start runs the rescuer at once, then every interval.
func (r *rescuer) Start(ctx context.Context) error { return r.start(ctx, r.rescue) }

func (r *rescuer) rescue(ctx context.Context) {
	r.turn.Lock()
	defer r.turn.Unlock()
	r.prove(ctx, proc.Self())
	n, err := releaseAbandoned(ctx, r.env.Store, r.gone, r.proven, time.Now(), r.env.Config().Lane)
	if err != nil && ctx.Err() == nil {
		r.log.Warn().Err(err).Msg("releasing abandoned deliveries failed")
	} else if n > 0 {
		r.log.Info().Int64("deliveries", n).Msg("returned deliveries of a stopped instance to the queue")
		r.queued()
	}
}

// prove looks at the processes of the other instances registered from
// me's host, boot and pid namespace, and ends the registration of those
// that are gone (proc.Gone: the pid no longer runs, or runs another
// process), marking them proven for releaseAbandoned. A free advisory
// lock, or an ended connection, is no such proof: a connection cut while
// its process lives looks the same.
func (r *rescuer) prove(ctx context.Context, me proc.Process) {
	near, err := r.env.Store.Neighbours(ctx, me, r.env.Owner)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("looking for gone instances of this host failed")
		}
		return
	}
	gone := map[string]proc.Process{}
	for id, p := range near {
		if proc.Gone(p) {
			gone[id] = p
		}
	}
	expired, err := r.env.Store.ExpireGone(ctx, gone)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("ending the registration of gone instances of this host failed")
		}
		return
	}
	for _, id := range expired {
		r.proven[id] = true
		r.log.Info().Str("instance", id).Int("pid", gone[id].PID).
			Msg("the process of an instance of this host is gone (same boot, its pid no longer runs it): its claims return at once, without the heartbeat rule's grace")
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
//
// The owners in proven (see rescuer.prove) cannot come back: their
// processes are gone. Their deliveries return at their first sight.
func releaseAbandoned(ctx context.Context, st *store.Store, gone map[string]time.Time, proven map[string]bool, now time.Time, lane store.LaneFunc) (int64, error) {
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
		case proven[o]:
			confirmed = append(confirmed, o)
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
	for o := range proven {
		if !still[o] {
			delete(proven, o)
		}
	}
	return st.ReleaseAbandonedOf(ctx, confirmed, ReleaseBatchDefault, lane)
}
