package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// Heartbeat cadence.
const (
	// HeartbeatDefault is how often an instance heartbeats and looks for
	// dead instances' claims; HeartbeatMin the shortest (a third of a very
	// short lease).
	HeartbeatDefault = time.Second
	HeartbeatMin     = 100 * time.Millisecond
)

// heartbeatInterval is how often an instance heartbeats and looks for dead
// instances' claims: every second, or a third of a shorter lease.
func heartbeatInterval(lease time.Duration) time.Duration {
	return max(min(HeartbeatDefault, lease/3), HeartbeatMin)
}

// heartbeat keeps this instance registered on a connection it holds for
// its whole life (its liveness: see store.Heartbeat), and notes whether
// other instances are alive (service.Env.Alone).
type heartbeat struct {
	periodic
	env       *service.Env
	log       zerolog.Logger
	turn      *sync.Mutex // the liveness duties' (see New)
	streaming func() bool
	live      *pgx.Conn // the loop's alone
}

func newHeartbeat(env *service.Env, turn *sync.Mutex, streaming func() bool) *heartbeat {
	h := &heartbeat{env: env, log: env.Logger("maintain"), turn: turn, streaming: streaming}
	h.interval = heartbeatInterval(env.Config().Lease)
	return h
}

// Start runs the heartbeat at once, then every interval.
func (h *heartbeat) Start(ctx context.Context) error {
	return h.loops.Start(ctx, func(ctx context.Context) {
		defer func() {
			if h.live != nil {
				_ = h.live.Close(context.WithoutCancel(ctx))
				h.live = nil
			}
		}()
		every(ctx, 0, h.interval, h.beat)
	})
}

// beat renews the registration, on the connection for life where it can.
func (h *heartbeat) beat(ctx context.Context) {
	h.turn.Lock()
	defer h.turn.Unlock()
	cfg := h.env.Config()
	st := h.env.Store
	if h.live == nil {
		h.live = h.liveConn(ctx)
	}
	var err error
	if h.live != nil {
		err = st.Heartbeat(ctx, h.live, h.env.Instance(h.streaming()), cfg.Lease, true)
		if err != nil && (h.live.IsClosed() || !store.Answered(err)) {
			// The connection is gone (or in doubt): another, which takes
			// the instance's lock again. One that the server answered
			// with an error (read-only) stays: it holds the lock.
			_ = h.live.Close(context.WithoutCancel(ctx))
			h.live = nil
		}
	}
	if h.live == nil {
		// Without its connection the instance still renews its
		// registration (the lease), from the pool.
		err = st.Heartbeat(ctx, h.env.Pool(), h.env.Instance(h.streaming()), cfg.Lease, false)
	}
	if err == nil {
		// Unknown after a failure: what was last seen stands (a stale
		// "alone" only shares a backlog later, it loses none).
		var peers int
		if peers, err = st.Peers(ctx, h.env.Owner); err == nil && h.env.SetAlone(peers == 0) {
			msg := "other instances are alive: a backlog the lanes cannot hold goes to the queue, for any of them"
			if peers == 0 {
				msg = "no other instance is alive: a backlog the lanes cannot hold is kept in flight by this one"
			}
			h.log.Info().Int("peers", peers).Msg(msg)
		}
	}
	h.env.Faults.Observe("heartbeat", err)
	if err != nil && ctx.Err() == nil {
		h.log.Warn().Err(err).Msg("heartbeat failed")
	}
}

// liveConn opens the connection whose backend stands for this instance's
// life, taken out of the pool so that no idle timeout closes it. The
// server is asked to probe it often (where it is TCP), so a host that
// vanishes without closing it is noticed within seconds too.
func (h *heartbeat) liveConn(ctx context.Context) *pgx.Conn {
	c, err := h.env.Pool().Acquire(ctx)
	if err != nil {
		return nil
	}
	conn := c.Hijack()
	for _, set := range []string{
		"SET application_name = 'postbox liveness'",
		"SET tcp_keepalives_idle = 2", "SET tcp_keepalives_interval = 1", "SET tcp_keepalives_count = 2",
		"SET tcp_user_timeout = 5000",
	} {
		if _, err := conn.Exec(ctx, set); err != nil {
			h.log.Debug().Err(err).Str("statement", set).Msg("liveness connection setting refused")
		}
	}
	return conn
}
