package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestEventsUnderWayAreInFlight: events an instance holds under way (no
// delivery written yet, named by its range) count in flight in the
// summary and both endpoint views, are found by a search for in_flight,
// and tell their story as held by that instance. One delivered beside
// them shows the counts are not of every event in the range.
func TestEventsUnderWayAreInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	rows, err := pool.Query(ctx, `
		INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at, ingested_at)
		SELECT gen_random_uuid(), 'kept', '{}', now() - interval '41 minutes', now() - interval '41 minutes', now() - interval '40 minutes'
		FROM generate_series(1, 3) RETURNING id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	exec(t, pool, `INSERT INTO postbox.deliveries (event_pk, endpoint, status, delivered_at) VALUES ($1, 'kept', 'delivered', now())`, ids[0])
	exec(t, pool, `INSERT INTO postbox.under_way (owner, first_event, last_event) VALUES ('relay-a', $1, $2)`, ids[0], ids[2])
	deliveries(t, pool, "other", 1, "")

	s := mustSummary(t, pool, "none")
	require.EqualValues(t, 2, s.InFlight)
	require.EqualValues(t, 1, s.Pending)
	require.NotNil(t, s.OldestPendingAgeSeconds)
	require.Greater(t, *s.OldestPendingAgeSeconds, (30 * time.Minute).Seconds(), "events under way are the oldest undelivered")

	for name, load := range map[string]func(context.Context, telemetry.Querier, string) ([]telemetry.EndpointStats, error){
		"computed": telemetry.LoadEndpoints, "refreshed": telemetry.LoadEndpointsRefreshed,
	} {
		eps, err := load(ctx, pool, "kept")
		require.NoError(t, err, name)
		require.Len(t, eps, 1, name)
		require.EqualValues(t, 2, eps[0].InFlight, name)
	}

	found, err := telemetry.SearchEvents(ctx, pool, telemetry.EventFilter{Status: "in_flight"})
	require.NoError(t, err)
	require.Len(t, found, 2)
	for _, e := range found {
		require.Equal(t, "in_flight", e.Status)
		require.Equal(t, "kept", e.Endpoint)
	}

	var eventID string
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id::text FROM postbox.events WHERE id = $1`, ids[1]).Scan(&eventID))
	stories, err := telemetry.LoadEvent(ctx, pool, eventID)
	require.NoError(t, err)
	require.Len(t, stories, 1)
	require.Equal(t, "relay-a", stories[0].UnderWayAt)
	require.Empty(t, stories[0].Deliveries)

	// A replay leaves it to its owner: no second delivery races the first.
	st := &store.Store{Pool: pool}
	items, n, err := st.Replay(ctx, postboxtype.ReplayFilter{EventIDs: []string{eventID}}, false, 0)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Len(t, items, 1)
	require.True(t, items[0].Queued)
}
