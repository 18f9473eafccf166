package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Telemetry cadences.
const (
	telemetryInterval = 15 * time.Second // gauges and alerts
	upkeepInterval    = time.Minute      // percentiles and purges
)

// upkeepLock is the advisory lock whose holder refreshes percentiles,
// purges, and logs alert changes for all instances.
const upkeepLock = 0x706f7374626f79 // "postboy"

// telemetryLoop keeps the metrics' gauges current and, on whichever
// instance holds the upkeep lock, refreshes the endpoints' percentiles,
// purges what is past its retention, and logs alert changes once.
func (r *Relay) telemetryLoop(ctx context.Context) {
	var lastUpkeep time.Time
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(telemetryInterval)
		alerts, err := r.observe(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn().Err(err).Msg("telemetry failed")
			}
			continue
		}
		upkeep := time.Since(lastUpkeep) >= upkeepInterval
		if err := r.asLeader(ctx, func(ctx context.Context) error {
			if upkeep {
				lastUpkeep = time.Now()
				if err := r.upkeep(ctx); err != nil {
					return err
				}
			}
			changes, err := telemetry.RecordAlerts(ctx, r.pool, alerts)
			for _, c := range changes {
				if c.Alert.Firing {
					r.log.Warn().Str("alert", c.Alert.Name).Str("subject", c.Alert.Subject).Msg("ALERT: " + c.Alert.Detail)
				} else {
					r.log.Info().Str("alert", c.Alert.Name).Str("subject", c.Alert.Subject).Msg("alert cleared: " + c.Alert.Detail)
				}
			}
			return err
		}); err != nil && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("telemetry upkeep failed")
		}
	}
}

// observe sets the gauges and returns the alerts' states.
func (r *Relay) observe(ctx context.Context) ([]telemetry.Alert, error) {
	s, eps, alerts, err := r.loadState(ctx, false)
	if err != nil {
		return nil, err
	}
	r.metrics.Observe(s, eps, alerts)
	r.metrics.Streaming(r.Streaming())
	return alerts, nil
}

// loadState reads the health summary (with the last hour's delivery
// statistics when full) and the endpoints' stored figures, and evaluates
// the alerts on them.
func (r *Relay) loadState(ctx context.Context, full bool) (telemetry.Summary, []telemetry.EndpointStats, []telemetry.Alert, error) {
	cfg := r.cfg.Load()
	load := telemetry.LoadQueueSummary
	if full {
		load = telemetry.LoadSummary
	}
	s, err := load(ctx, r.pool, cfg.Slot)
	if err != nil {
		return s, nil, nil, err
	}
	eps, err := telemetry.LoadStoredEndpoints(ctx, r.pool)
	if err != nil {
		return s, nil, nil, err
	}
	return s, eps, telemetry.Evaluate(s, eps, cfg.Alerts), nil
}

// upkeep refreshes percentiles and purges what is past its retention.
func (r *Relay) upkeep(ctx context.Context) error {
	cfg := r.cfg.Load()
	if err := telemetry.RefreshPercentiles(ctx, r.pool); err != nil {
		return err
	}
	var errs []error
	if n, err := r.store.PurgeSamples(ctx, telemetry.Window); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		r.log.Debug().Int64("rows", n).Msg("purged latency samples")
	}
	if n, err := r.store.PurgeHistograms(ctx, telemetry.Window); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		r.log.Debug().Int64("rows", n).Msg("purged latency histograms")
	}
	if n, err := r.store.PurgeDeliveries(ctx, cfg.DeliveryRetention.D()); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		r.log.Debug().Int64("rows", n).Msg("purged finished deliveries")
	}
	if n, err := r.store.PurgeEvents(ctx, cfg.EventRetention.D()); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		r.log.Debug().Int64("rows", n).Msg("purged events")
	}
	return errors.Join(errs...)
}

// asLeader runs f if this instance gets the upkeep lock now.
func (r *Relay) asLeader(ctx context.Context, f func(context.Context) error) error {
	conn, err := r.pool.Acquire(ctx)
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
	defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, int64(upkeepLock)) }()
	return f(ctx)
}

// ready is the admin listener's readiness check.
func (r *Relay) ready(ctx context.Context) error {
	if r.pool == nil {
		return errors.New("database not connected yet")
	}
	if err := r.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	cfg := r.cfg.Load()
	st, err := wal.Slot(ctx, r.pool, cfg.Slot)
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
	if r.pool == nil {
		return nil, errors.New("database not connected yet")
	}
	s, _, alerts, err := r.loadState(ctx, true)
	if err != nil {
		return nil, err
	}
	s.Alerts = telemetry.Firing(alerts)
	return s, nil
}
