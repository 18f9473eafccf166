package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestOverlongEndpointNameIsAnInvalidRow: a row naming an endpoint longer
// than store.MaxEndpointLen bytes, with a URL of its own, is never
// attempted: a dead letter with reason invalid_row, whether reconciled
// (written before any slot) or streamed, stored under the cut name; its
// outbox row is purged once ingested as any other's is.
func TestOverlongEndpointNameIsAnInvalidRow(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	ctx := context.Background()
	_, err := tb.pool.Exec(ctx, outbox.SchemaSQL(tb.resolved(t).Table))
	require.NoError(t, err)
	insert := func(endpoint string) string {
		var id string
		require.NoError(t, tb.pool.QueryRow(ctx, `INSERT INTO postbox.outbox (endpoint, url) VALUES ($1, $2) RETURNING event_id::text`,
			endpoint, rc.URL+"/hook").Scan(&id))
		return id
	}
	ascii, accents := strings.Repeat("x", 5000), strings.Repeat("é", 1000) // 2,000 bytes
	atEdge := strings.Repeat("y", store.MaxEndpointLen)
	reconciled := insert(ascii)
	tb.start(t, relay.Options{})
	streamed, fine := insert(accents), insert(atEdge)
	tb.waitSettled(t, 3, 30*time.Second)

	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, fine).Status, "a name of exactly the limit is delivered")
	require.Equal(t, 1, rc.count(), "only that one reached the receiver")
	for id, name := range map[string]string{reconciled: ascii, streamed: accents} {
		d := tb.delivery(t, id)
		require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
		require.Zero(t, d.Attempts)
		require.True(t, strings.HasPrefix(d.LastError, "invalid_row: the endpoint name is "), d.LastError)
		var stored string
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT endpoint FROM postbox.events WHERE event_id = $1`, id).Scan(&stored))
		require.Equal(t, store.StoredEndpoint(name), stored)
		require.Len(t, []rune(stored), store.MaxEndpointLen+1)
	}
	waitUntil(t, 30*time.Second, "the outbox purged", func() bool {
		var n int
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.outbox`).Scan(&n))
		return n == 0
	})
}
