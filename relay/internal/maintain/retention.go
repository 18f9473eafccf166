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

// EndpointTombstoneRetentionDefault is how long a deleted endpoint's
// tombstone stays in postbox.endpoint_state. Every live instance reads
// the rows written since its last read each second (its poll, a NOTIFY,
// the gate before an attempt), so a tombstone is passed by all of them
// within seconds; a day also covers an instance stalled (a frozen VM, a
// partition) far past its registration's lease, and costs a row per
// endpoint deleted that day. Instances record no read position, so a
// time bound it is.
const EndpointTombstoneRetentionDefault = 24 * time.Hour

// newRetentionCleaner returns the leader's duty that purges attempts,
// latency histograms, finished deliveries, events and deleted endpoints'
// tombstones past their retention.
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
		{"endpoint tombstones", func() (int64, error) {
			return st.PurgeEndpointTombstones(ctx, EndpointTombstoneRetentionDefault)
		}},
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
