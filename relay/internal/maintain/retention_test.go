package maintain

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// The retention cleaner purges attempts, latency histograms, finished
// deliveries, events and endpoint tombstones past their retention, as the leader; attempts are
// kept for the telemetry window at least.
func TestRetentionCleanerPurgesWhatIsPastItsRetention(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(c *config.Config) {
		c.AttemptRetention, c.DeliveryRetention, c.EventRetention = 0, time.Hour, time.Hour
	})
	ctx := context.Background()
	_, err := tb.st.Pool.Exec(ctx, `INSERT INTO postbox.attempts (endpoint, duration_ms, outcome, started_at)
		VALUES ('ep', 12, 'delivered', now() - $1 * interval '1 second'), ('ep', 15, 'delivered', now())`, (telemetry.Window + time.Hour).Seconds())
	require.NoError(t, err)
	queue(t, tb.st, 2)
	_, err = tb.st.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'delivered', delivered_at = now() - interval '2 hours',
		updated_at = now() - interval '2 hours' WHERE id = (SELECT min(id) FROM postbox.deliveries)`)
	require.NoError(t, err)
	_, err = tb.st.Pool.Exec(ctx, `UPDATE postbox.events SET ingested_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, err = tb.st.Pool.Exec(ctx, `INSERT INTO postbox.endpoint_state (name, row, revision, lsn, written_at)
		VALUES ('old', 'null', 1, '0/1', now() - $1 * interval '1 second'), ('young', 'null', 1, '0/1', now())`,
		(EndpointTombstoneRetentionDefault + time.Hour).Seconds())
	require.NoError(t, err)

	u := newRetentionCleaner(tb.env, newLeader(tb.env, new(sync.Mutex)))
	require.Equal(t, RetentionIntervalDefault, u.runEvery)
	u.first, u.interval = 0, tick
	require.NoError(t, u.Start(ctx))
	defer u.Stop()
	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM postbox.attempts`) == 1 &&
			count(t, tb.st, `SELECT count(*) FROM postbox.latency_histogram`) == 1 &&
			count(t, tb.st, `SELECT count(*) FROM postbox.deliveries`) == 1 &&
			count(t, tb.st, `SELECT count(*) FROM postbox.events`) == 1 &&
			count(t, tb.st, `SELECT count(*) FROM postbox.endpoint_state`) == 1
	}, wait, tick, "the old attempt and its bin, the delivered delivery and its event, the old tombstone; the pending one's event and the young tombstone stay")
}
