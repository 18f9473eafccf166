package maintain

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
)

// The lane pruner drops the health and rate rows of a row URL's lane idle
// for delivery_retention, as the leader; an endpoint's own rows stay.
func TestLanePrunerDropsIdleLanes(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(c *config.Config) { c.DeliveryRetention = time.Hour })
	ctx := context.Background()
	for _, lane := range []string{"rows" + config.LaneSep + "idle.example:443", "shop"} {
		_, err := tb.st.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, last_success_at) VALUES ($1, now() - interval '2 hours')`, lane)
		require.NoError(t, err)
		_, err = tb.st.Pool.Exec(ctx, `INSERT INTO postbox.rate_buckets (endpoint, tokens, updated_at) VALUES ($1, 1, now() - interval '2 hours')`, lane)
		require.NoError(t, err)
	}
	u := newLanePruner(tb.env, newLeader(tb.env, new(sync.Mutex)))
	require.Equal(t, IdleLanesIntervalDefault, u.runEvery)
	u.first, u.interval = 0, tick
	require.NoError(t, u.Start(ctx))
	defer u.Stop()
	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM postbox.endpoint_health`) == 1 &&
			count(t, tb.st, `SELECT count(*) FROM postbox.rate_buckets WHERE endpoint = 'shop'`) == 1 &&
			count(t, tb.st, `SELECT count(*) FROM postbox.rate_buckets`) == 1
	}, wait, tick)
}
