// Package maintain is the relay's housekeeping, one service with three
// loops:
//
//   - the heartbeat keeps this instance registered (which keeps its claims
//     its own), returns the deliveries of instances that died to the queue,
//     and purges ingested outbox rows past their retention;
//   - telemetry keeps the metrics' gauges current and, on whichever
//     instance holds the upkeep lock, refreshes the endpoints'
//     percentiles, purges what is past its retention and logs alert
//     changes once for all instances;
//   - the secrets watcher reloads the configuration when a secrets file
//     changes (a Kubernetes secret rotated in place).
package maintain

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Cadences and bounds.
const (
	// HeartbeatDefault is how often an instance heartbeats and releases
	// dead instances' claims; HeartbeatMin the shortest (a third of a very
	// short lease).
	HeartbeatDefault = time.Second
	HeartbeatMin     = 100 * time.Millisecond
	// OutboxPurgeIntervalDefault is how often ingested outbox rows are
	// purged.
	OutboxPurgeIntervalDefault = 10 * time.Second
	// ReleaseBatchDefault bounds one statement.
	ReleaseBatchDefault = 5000
	// PurgeWindowDefault is how many outbox rows one statement of the
	// purge looks at; PurgeWindowsDefault how many such statements one
	// purge runs at most: a retained outbox filling at up to their product
	// per OutboxPurgeIntervalDefault (10,000 rows a second) is kept to its
	// retention.
	PurgeWindowDefault  = 5000
	PurgeWindowsDefault = 20
	// TelemetryFirstDefault is when the gauges are first set after start.
	TelemetryFirstDefault = time.Second
	// TelemetryIntervalDefault is the cadence of gauges and alerts.
	TelemetryIntervalDefault = 15 * time.Second
	// UpkeepIntervalDefault is the cadence of percentiles and purges.
	UpkeepIntervalDefault = time.Minute
	// SecretsPollDefault is how often secrets files are checked.
	SecretsPollDefault = 2 * time.Second
)

// upkeepLock is the advisory lock whose holder refreshes percentiles,
// purges, and logs alert changes for all instances.
const upkeepLock = 0x706f7374626f79 // "postboy"

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
	// otherwise), which the telemetry loop watches (walsenderWatch).
	WalsenderCPU func() (pid int, c proc.CPU, ok bool)
}

// Maintainer runs the housekeeping loops. Start it, Stop it.
type Maintainer struct {
	env   *service.Env
	log   zerolog.Logger
	deps  Deps
	loops service.Loops
}

// New returns a Maintainer.
func New(env *service.Env, deps Deps) *Maintainer {
	return &Maintainer{env: env, log: env.Logger("maintain"), deps: deps}
}

// Start runs the heartbeat, telemetry and secrets loops.
func (m *Maintainer) Start(ctx context.Context) error {
	return m.loops.Start(ctx, m.heartbeatLoop, m.telemetryLoop, m.watchSecrets)
}

// Stop ends the loops and waits for them.
func (m *Maintainer) Stop() { m.loops.Stop() }

// heartbeatLoop keeps this instance registered on a connection it holds
// for its whole life (its liveness: see store.Heartbeat), returns
// deliveries of instances that died to the queue, and purges ingested
// outbox rows.
func (m *Maintainer) heartbeatLoop(ctx context.Context) {
	var live *pgx.Conn
	defer func() {
		if live != nil {
			_ = live.Close(context.WithoutCancel(ctx))
		}
	}()
	tick := time.NewTicker(HeartbeatInterval(m.env.Config().Lease))
	defer tick.Stop()
	var lastPurge time.Time
	var purgeFrom int64            // where the outbox purge goes on (an outbox id)
	gone := map[string]time.Time{} // releaseAbandoned's
	for {
		cfg := m.env.Config()
		st := m.env.Store
		if live == nil {
			live = m.liveConn(ctx)
		}
		var err error
		if live != nil {
			err = st.Heartbeat(ctx, live, m.env.Instance(m.deps.Streaming()), cfg.Lease, true)
			if err != nil && (live.IsClosed() || !store.Answered(err)) {
				// The connection is gone (or in doubt): another, which
				// takes the instance's lock again. One that the server
				// answered with an error (read-only) stays: it holds
				// the lock.
				_ = live.Close(context.WithoutCancel(ctx))
				live = nil
			}
		}
		if live == nil {
			// Without its connection the instance still renews its
			// registration (the lease), from the pool.
			err = st.Heartbeat(ctx, m.env.Pool(), m.env.Instance(m.deps.Streaming()), cfg.Lease, false)
		}
		if err == nil {
			// Unknown after a failure: what was last seen stands (a
			// stale "alone" only shares a backlog later, it loses none).
			var peers int
			if peers, err = st.Peers(ctx, m.env.Owner); err == nil && m.env.SetAlone(peers == 0) {
				msg := "other instances are alive: a backlog the lanes cannot hold goes to the queue, for any of them"
				if peers == 0 {
					msg = "no other instance is alive: a backlog the lanes cannot hold is kept in flight by this one"
				}
				m.log.Info().Int("peers", peers).Msg(msg)
			}
		}
		m.env.Faults.Observe("heartbeat", err)
		if err != nil && ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("heartbeat failed")
		}
		if n, err := releaseAbandoned(ctx, st, gone, time.Now(), cfg.Lane); err != nil && ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("releasing abandoned deliveries failed")
		} else if n > 0 {
			m.log.Info().Int64("deliveries", n).Msg("returned deliveries of a stopped instance to the queue")
			m.deps.Queued()
		}
		// With outbox_retention 0 the ingest deletes the rows it ingests,
		// but an application's commit can be streamed a moment before it
		// becomes visible to other sessions, and the delete then misses
		// its row: the purge picks such rows up.
		if time.Since(lastPurge) >= OutboxPurgeIntervalDefault {
			lastPurge = time.Now()
			var err error
			purgeFrom, err = purgeOutbox(ctx, st, cfg.OutboxRetention, purgeFrom, PurgeWindowDefault, PurgeWindowsDefault)
			if err != nil && ctx.Err() == nil {
				m.log.Warn().Err(err).Msg("purging the outbox failed")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// purgeOutbox purges the outbox window by window from the id after, up
// to windows of them, while each deletes rows and finds more to look at.
// It returns where the next purge goes on: 0 once it reached the rows
// still to be kept, where it stopped otherwise (also after an error). A
// window that deleted nothing ends the purge: the rows there are not
// ingested yet (a backlog the stream has still to bring), and the next
// purge, an interval later, looks at the window after them.
func purgeOutbox(ctx context.Context, st *store.Store, retention time.Duration, after int64, window, windows int) (int64, error) {
	for range windows {
		n, next, err := st.PurgeIngestedOutbox(ctx, retention, after, window)
		if err != nil {
			return after, err
		}
		if after = next; after == 0 || n == 0 {
			break
		}
	}
	return after, nil
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

// HeartbeatInterval is how often an instance heartbeats and looks for
// dead instances' claims: every second, or a third of a shorter lease.
func HeartbeatInterval(lease time.Duration) time.Duration {
	return max(min(HeartbeatDefault, lease/3), HeartbeatMin)
}

// liveConn opens the connection whose backend stands for this instance's
// life, taken out of the pool so that no idle timeout closes it. The
// server is asked to probe it often (where it is TCP), so a host that
// vanishes without closing it is noticed within seconds too.
func (m *Maintainer) liveConn(ctx context.Context) *pgx.Conn {
	c, err := m.env.Pool().Acquire(ctx)
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
			m.log.Debug().Err(err).Str("statement", set).Msg("liveness connection setting refused")
		}
	}
	return conn
}

// telemetryLoop keeps the gauges current and runs the upkeep where this
// instance holds the lock.
func (m *Maintainer) telemetryLoop(ctx context.Context) {
	var lastUpkeep time.Time
	var walsender walsenderWatch
	t := time.NewTimer(TelemetryFirstDefault)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(TelemetryIntervalDefault)
		if m.deps.WalsenderCPU != nil {
			pid, c, ok := m.deps.WalsenderCPU()
			walsender.observe(m.log, pid, c, ok, m.env.Config().CPUBatch, time.Now())
		}
		s, eps, alerts, err := LoadState(ctx, m.env, false)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn().Err(err).Msg("telemetry failed")
			}
			continue
		}
		m.env.Metrics.Observe(s, eps, alerts)
		m.env.Metrics.Streaming(m.deps.Streaming())
		upkeep := time.Since(lastUpkeep) >= UpkeepIntervalDefault
		if err := m.asLeader(ctx, func(ctx context.Context) error {
			if upkeep {
				lastUpkeep = time.Now()
				if err := m.upkeep(ctx); err != nil {
					return err
				}
			}
			changes, err := telemetry.RecordAlerts(ctx, m.env.Pool(), alerts)
			for _, c := range changes {
				if c.Alert.Firing {
					m.log.Warn().Str("alert", c.Alert.Name).Str("subject", c.Alert.Subject).Msg("ALERT: " + c.Alert.Detail)
				} else {
					m.log.Info().Str("alert", c.Alert.Name).Str("subject", c.Alert.Subject).Msg("alert cleared: " + c.Alert.Detail)
				}
			}
			return err
		}); err != nil && ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("telemetry upkeep failed")
		}
	}
}

// LoadState reads the health summary (with the last hour's delivery
// statistics when full) and the endpoints' stored figures, and evaluates
// the alerts on them.
func LoadState(ctx context.Context, env *service.Env, full bool) (telemetry.Summary, []telemetry.EndpointStats, []telemetry.Alert, error) {
	cfg := env.Config()
	load := telemetry.LoadQueueSummary
	if full {
		load = telemetry.LoadSummary
	}
	s, err := load(ctx, env.Pool(), cfg.Slot)
	if err != nil {
		return s, nil, nil, err
	}
	eps, err := telemetry.LoadStoredEndpoints(ctx, env.Pool())
	if err != nil {
		return s, nil, nil, err
	}
	return s, eps, telemetry.Evaluate(s, eps, cfg.Alerts), nil
}

// upkeep refreshes percentiles and purges what is past its retention.
func (m *Maintainer) upkeep(ctx context.Context) error {
	cfg := m.env.Config()
	st := m.env.Store
	if err := telemetry.RefreshPercentiles(ctx, m.env.Pool()); err != nil {
		return err
	}
	purges := []struct {
		what  string
		purge func() (int64, error)
	}{
		{"attempts", func() (int64, error) { return st.PurgeAttempts(ctx, max(cfg.AttemptRetention, telemetry.Window)) }},
		{"latency histograms", func() (int64, error) { return st.PurgeHistograms(ctx, telemetry.Window) }},
		{"finished deliveries", func() (int64, error) { return st.PurgeDeliveries(ctx, cfg.DeliveryRetention) }},
		{"events", func() (int64, error) { return st.PurgeEvents(ctx, cfg.EventRetention) }},
		{"idle lanes", func() (int64, error) { return st.PurgeIdleLanes(ctx, cfg.DeliveryRetention, config.LaneSep) }},
	}
	var errs []error
	for _, p := range purges {
		if n, err := p.purge(); err != nil {
			errs = append(errs, err)
		} else if n > 0 {
			m.log.Debug().Int64("rows", n).Msg("purged " + p.what)
		}
	}
	return errors.Join(errs...)
}

// asLeader runs f if this instance gets the upkeep lock now.
func (m *Maintainer) asLeader(ctx context.Context, f func(context.Context) error) error {
	conn, err := m.env.Pool().Acquire(ctx)
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

// watchSecrets reloads the configuration when a secrets file changes, so
// a rotation needs no restart and no signal.
func (m *Maintainer) watchSecrets(ctx context.Context) {
	type stamp struct {
		mod  time.Time
		size int64
	}
	read := func() map[string]stamp {
		out := map[string]stamp{}
		for _, f := range m.env.Config().SecretFiles {
			if fi, err := os.Stat(f); err == nil {
				out[f] = stamp{fi.ModTime(), fi.Size()}
			}
		}
		return out
	}
	seen := read()
	tick := time.NewTicker(SecretsPollDefault)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := read()
		changed := len(now) != len(seen)
		for f, s := range now {
			if seen[f] != s {
				changed = true
			}
		}
		if !changed {
			continue
		}
		seen = now
		file := m.env.Config().File
		next, err := file.Resolve()
		if err == nil {
			err = m.deps.Reload(next)
		}
		if err != nil {
			m.log.Error().Err(err).Msg("a secrets file changed but does not load; keeping the secrets in use")
			continue
		}
		m.log.Info().Msg("signing secrets reloaded: a secrets file changed")
	}
}
