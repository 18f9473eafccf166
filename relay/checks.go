package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/maintain"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

var errNotConnected = errors.New("database not connected yet")

// pool is the relay's pool for the console: nil until Start connected.
func (r *Relay) pool() *pgxpool.Pool {
	if s := r.svc.Load(); s != nil {
		return s.pool
	}
	return nil
}

// ready is the admin listener's readiness check: the database answers, and
// some instance streams the slot without lagging past the alert threshold.
func (r *Relay) ready(ctx context.Context) error {
	if fs := r.faults.Current(); len(fs) > 0 {
		return fmt.Errorf("database fault: %s (%s, since %s)", fs[0].Cause, fs[0].Component, fs[0].Since.UTC().Format(time.RFC3339))
	}
	s := r.svc.Load()
	if s == nil {
		return errNotConnected
	}
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	cfg := r.cfg.Load()
	st, err := wal.Slot(ctx, s.pool, cfg.Slot)
	if err != nil {
		return err
	}
	switch {
	case !st.Exists:
		return fmt.Errorf("replication slot %s does not exist yet", cfg.Slot)
	case !st.Active:
		return fmt.Errorf("no instance streams replication slot %s", cfg.Slot)
	case st.RetainedBytes > int64(cfg.Alerts.SlotLag):
		return fmt.Errorf("replication slot %s lags %d bytes (threshold %d)", cfg.Slot, st.RetainedBytes, int64(cfg.Alerts.SlotLag))
	}
	return nil
}

// status is the admin listener's /status: the summary with its alerts.
func (r *Relay) status(ctx context.Context) (any, error) {
	s := r.svc.Load()
	if s == nil {
		return nil, errNotConnected
	}
	sum, _, alerts, err := maintain.LoadState(ctx, s.env, true)
	if err != nil {
		return nil, err
	}
	sum.Alerts = telemetry.Firing(alerts)
	return struct {
		telemetry.Summary
		// DatabaseFaults are this instance's current ones.
		DatabaseFaults []service.Fault `json:"database_faults,omitempty"`
	}{sum, r.faults.Current()}, nil
}

// warnEmitGrants logs, at start with outbox_messages on, what postbox
// doctor reports as an error: roles beside outbox_message_roles that may
// run pg_logical_emit_message, and so make postbox send a signed event.
// A warning, not a refusal: the grants are the database owner's to fix,
// and the application's emitted events should not wait for it.
func (r *Relay) warnEmitGrants(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) {
	if !cfg.Messages {
		return
	}
	g, err := store.LoadEmitGrants(ctx, pool, cfg.MessageRoles)
	if err != nil {
		r.log.Warn().Err(err).Msg("could not check who may emit postbox messages (postbox doctor does)")
		return
	}
	if w := g.Warning(); w != "" {
		r.log.Warn().Strs("fix", g.Fix).Msg(w + "; run the statements in fix as a superuser (postbox doctor)")
	}
}
