package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/internal/maintain"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestEndpointRecreatedAfterItsTombstoneWasPurged: a deleted endpoint's
// events dead-letter while its tombstone is in endpoint_state; the
// leader's purge leaves the tombstone while it is young and removes it
// once past its retention; the endpoint inserted again afterwards is
// applied and delivered to under its new settings.
func TestEndpointRecreatedAfterItsTombstoneWasPurged(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.start(t, relay.Options{})
	ctx := context.Background()
	st := &store.Store{Pool: tb.pool}
	tombstones := func() int {
		var n int
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE name = 'p' AND jsonb_typeof(row) = 'null'`).Scan(&n))
		return n
	}

	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('p', $1)`, rc.URL+"/v1")
	tb.insert(t, outbox.Event{Endpoint: "p", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "delivered to v1", func() bool { return rc.count() == 1 })

	tb.exec(t, `DELETE FROM postbox.endpoints WHERE name = 'p'`)
	gone := tb.insert(t, outbox.Event{Endpoint: "p", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 10*time.Second, "dead-lettered", func() bool { return tb.status(gone) == postboxtype.DeliveryDeadLetter })
	require.True(t, strings.HasPrefix(tb.delivery(t, gone).LastError, "unknown_endpoint"))
	require.Equal(t, 1, tombstones())

	n, err := st.PurgeEndpointTombstones(ctx, maintain.EndpointTombstoneRetentionDefault)
	require.NoError(t, err)
	require.Zero(t, n, "a young tombstone is kept")
	require.Equal(t, 1, tombstones())
	tb.exec(t, `UPDATE postbox.endpoint_state SET written_at = now() - $1 * interval '1 second' WHERE name = 'p'`,
		(maintain.EndpointTombstoneRetentionDefault + time.Minute).Seconds())
	n, err = st.PurgeEndpointTombstones(ctx, maintain.EndpointTombstoneRetentionDefault)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, tombstones())

	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('p', $1)`, rc.URL+"/v2")
	tb.waitApplied(t, "p")
	back := tb.insert(t, outbox.Event{Endpoint: "p", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 10*time.Second, "delivered to v2", func() bool { return tb.status(back) == postboxtype.DeliveryDelivered })
	require.Equal(t, 2, rc.count())
	require.Equal(t, "/v2", rc.requests()[1].Path)
}
