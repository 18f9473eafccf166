package maintain

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// RetentionIntervalDefault is how often the leader purges what is past its
// retention.
const RetentionIntervalDefault = time.Minute

// newRetentionCleaner returns the leader's duty that purges attempts,
// latency histograms, finished deliveries and events past their retention.
func newRetentionCleaner(env *service.Env, lead *leader) *upkeep {
	log := env.Logger("maintain")
	return newUpkeep(env, lead, RetentionIntervalDefault, func(ctx context.Context) error { return cleanRetention(ctx, env, log) })
}

// cleanRetention runs each purge, whatever the others' errors.
func cleanRetention(ctx context.Context, env *service.Env, log zerolog.Logger) error {
	cfg := env.Config()
	st := env.Store
	purges := []struct {
		what  string
		purge func() (int64, error)
	}{
		{"attempts", func() (int64, error) { return st.PurgeAttempts(ctx, max(cfg.AttemptRetention, telemetry.Window)) }},
		{"latency histograms", func() (int64, error) { return st.PurgeHistograms(ctx, telemetry.Window) }},
		{"finished deliveries", func() (int64, error) { return st.PurgeDeliveries(ctx, cfg.DeliveryRetention) }},
		{"events", func() (int64, error) { return st.PurgeEvents(ctx, cfg.EventRetention) }},
		{"report rollups", func() (int64, error) { return st.PurgeReport(ctx, cfg.ReportRetention) }},
		{"partners' resend notes", func() (int64, error) { return st.PurgePortalReplays(ctx) }},
		{"report deltas (folded)", func() (int64, error) { return st.CompactReport(ctx) }},
		// Not a purge: report_sum as reloaded, for the ingest's trigger.
		{"report_sum fields", func() (int64, error) { return 0, st.SyncReportFields(ctx, cfg.ReportSum) }},
	}
	var errs []error
	for _, p := range purges {
		if n, err := p.purge(); err != nil {
			errs = append(errs, err)
		} else if n > 0 {
			log.Debug().Int64("rows", n).Msg("purged " + p.what)
		}
	}
	return errors.Join(errs...)
}
