package maintain

import (
	"context"
	"time"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/service"
)

// IdleLanesIntervalDefault is how often the leader drops the health and
// rate rows of idle row-URL lanes.
const IdleLanesIntervalDefault = time.Minute

// newLanePruner returns the leader's duty that drops the health and rate
// rows of row-URL lanes idle for delivery_retention, which would otherwise
// pile up, one per host an application ever named.
func newLanePruner(env *service.Env, lead *leader) *upkeep {
	log := env.Logger("maintain")
	return newUpkeep(env, lead, IdleLanesIntervalDefault, func(ctx context.Context) error {
		n, err := env.Store.PurgeIdleLanes(ctx, env.Config().DeliveryRetention, config.LaneSep)
		if err == nil && n > 0 {
			log.Debug().Int64("rows", n).Msg("purged idle lanes")
		}
		return err
	})
}
