package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestKeptDeliveriesAreNoOrderedHeadUntilClaimed: a delivery an ingest
// writes in flight (kept) is marked so, whether one event's statement,
// several events' or a copy wrote it, and stays out of deliveries_live_order
// while it is in flight; returned to the queue it is its endpoint's head
// again, and once claimed in flight it holds the endpoint's later
// deliveries back, as an ordered endpoint's head must.
func TestKeptDeliveriesAreNoOrderedHeadUntilClaimed(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	ic := ingestConn(t, s)
	batch := func(n int, status postboxtype.DeliveryState) []store.NewEvent {
		evs := make([]store.NewEvent, n)
		for i := range evs {
			evs[i] = store.NewEvent{
				OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "partners", URL: "http://a.test/pb", Payload: []byte(`{}`)}},
				Status:    status,
			}
		}
		return evs
	}
	for _, n := range []int{1, 2, store.CopyEventsMin} { // one event's statement, many events', a copy
		got, err := ic.Insert(ctx, batch(n, postboxtype.DeliveryInFlight), false)
		require.NoError(t, err)
		require.Len(t, got, n)
	}
	_, err := ic.Insert(ctx, batch(2, postboxtype.DeliveryPending), false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	kept := 1 + 2 + store.CopyEventsMin

	var marked, indexed int
	require.NoError(t, s.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE kept AND status = 'in_flight' AND lease_owner = 'me'),
		       count(*) FILTER (WHERE status IN ('pending', 'failed') OR (status = 'in_flight' AND NOT kept))
		FROM postbox.deliveries`).Scan(&marked, &indexed))
	require.Equal(t, kept, marked, "every delivery written in flight is marked kept")
	require.Equal(t, 2, indexed, "only the queued ones are in deliveries_live_order")

	claimed, err := s.ClaimOrdered(ctx, "me", []string{"partners"})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "the oldest queued delivery, the kept ones being in memory")
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'pending', lease_owner = NULL WHERE id = $1`, claimed[0].DeliveryID)
	require.NoError(t, err)

	// The instance gives its kept deliveries back: the first one written
	// is the head now, claimed alone, and holds the rest back.
	n, err := s.ReleaseOwned(ctx, "me", nil)
	require.NoError(t, err)
	require.EqualValues(t, kept, n)
	var first int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT min(id) FROM postbox.deliveries`).Scan(&first))
	claimed, err = s.ClaimOrdered(ctx, "me", []string{"partners"})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, first, claimed[0].DeliveryID, "the endpoint's oldest delivery")
	var stillKept bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT kept FROM postbox.deliveries WHERE id = $1`, first).Scan(&stillKept))
	require.False(t, stillKept, "a claim clears the mark")
	claimed, err = s.ClaimOrdered(ctx, "me", []string{"partners"})
	require.NoError(t, err)
	require.Empty(t, claimed, "the claimed head holds its endpoint back")
}
