package maintain

import (
	"context"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// PercentilesIntervalDefault is how often the leader refreshes the
// endpoints' stored latency percentiles.
const PercentilesIntervalDefault = time.Minute

// newPercentiles returns the leader's duty that refreshes the endpoints'
// stored latency percentiles from the window's histograms.
func newPercentiles(env *service.Env, lead *leader) *upkeep {
	return newUpkeep(env, lead, PercentilesIntervalDefault, func(ctx context.Context) error {
		return telemetry.RefreshPercentiles(ctx, env.Pool())
	})
}
