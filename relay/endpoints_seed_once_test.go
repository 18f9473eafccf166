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
)

// seedLine is the log line of a seed of endpoint_state.
const seedLine = "seeded the applied endpoints from postbox.endpoints"

// TestFirstStartRecordsTheSeed: a true first start (no checkpoint row,
// no slot, endpoint rows written before) seeds endpoint_state and records
// it; the next start does not seed again, though the first start's
// reconciliation of the outbox (owed as it made the slot) is still owed.
func TestFirstStartRecordsTheSeed(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	ctx := context.Background()
	_, err := relay.Migrate(ctx, tb.pool, tb.resolved(t))
	require.NoError(t, err)
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url) VALUES ('a', $1), ('b', $1)`, rc.URL+"/p")
	var checkpoints int
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.checkpoints`).Scan(&checkpoints))
	require.Zero(t, checkpoints, "a true first start")

	r := tb.start(t, relay.Options{})
	tb.insert(t, outbox.Event{Endpoint: "a", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "delivered", func() bool { return rc.count() == 1 })
	require.Equal(t, 1, strings.Count(tb.logs.String(), seedLine))
	var seeded bool
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT endpoints_seeded FROM postbox.checkpoints`).Scan(&seeded))
	require.True(t, seeded, "the seed is recorded")
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	// The first start owed the outbox a reconciliation (it made the slot);
	// stopped before that finished, it leaves the debt recorded. Recorded
	// here whatever the race, as the seed has paid its part of it.
	tb.exec(t, `UPDATE postbox.checkpoints SET reconcile_pending = true`)

	tb.start(t, relay.Options{})
	tb.insert(t, outbox.Event{Endpoint: "b", Payload: json.RawMessage(`{}`)})
	waitUntil(t, 10*time.Second, "delivered after the restart", func() bool { return rc.count() == 2 })
	require.Equal(t, 1, strings.Count(tb.logs.String(), seedLine), "the second start does not seed")
}
