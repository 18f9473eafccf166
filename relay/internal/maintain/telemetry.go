package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Telemetry cadence.
const (
	// TelemetryFirstDefault is when the gauges are first set after start,
	// and when the leader's duties first look (see upkeep).
	TelemetryFirstDefault = time.Second
	// TelemetryIntervalDefault is the cadence of gauges and alerts, and
	// how often the leader's duties look.
	TelemetryIntervalDefault = 15 * time.Second
)

// telemetryFlusher keeps the metrics' gauges current and, on the leader,
// records the alerts' states and logs their changes once for all
// instances.
type telemetryFlusher struct {
	periodic
	env       *service.Env
	log       zerolog.Logger
	turn      *sync.Mutex // shared with the leader's duties (see New)
	lead      *leader
	streaming func() bool
}

func newTelemetry(env *service.Env, turn *sync.Mutex, lead *leader, streaming func() bool) *telemetryFlusher {
	t := &telemetryFlusher{env: env, log: env.Logger("maintain"), turn: turn, lead: lead, streaming: streaming}
	t.first, t.interval = TelemetryFirstDefault, TelemetryIntervalDefault
	return t
}

// Start runs the service.
func (t *telemetryFlusher) Start(ctx context.Context) error { return t.start(ctx, t.flush) }

func (t *telemetryFlusher) flush(ctx context.Context) {
	t.turn.Lock()
	s, eps, alerts, err := LoadState(ctx, t.env, false)
	t.turn.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn().Err(err).Msg("telemetry failed")
		}
		return
	}
	t.env.Metrics.Observe(s, eps, alerts)
	t.env.Metrics.Streaming(t.streaming())
	if err := t.lead.do(ctx, func(ctx context.Context) error {
		changes, err := telemetry.RecordAlerts(ctx, t.env.Pool(), alerts)
		for _, c := range changes {
			if c.Alert.Firing {
				t.log.Warn().Str("alert", c.Alert.Name).Str("subject", c.Alert.Subject).Msg("ALERT: " + c.Alert.Detail)
			} else {
				t.log.Info().Str("alert", c.Alert.Name).Str("subject", c.Alert.Subject).Msg("alert cleared: " + c.Alert.Detail)
			}
		}
		return err
	}); err != nil && ctx.Err() == nil {
		t.log.Warn().Err(err).Msg("telemetry upkeep failed")
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
	s.InvalidEndpoints = telemetry.InvalidEndpoints(cfg)
	return s, eps, telemetry.Evaluate(s, eps, cfg.Alerts), nil
}
