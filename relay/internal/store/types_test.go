package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// TestStatesScanAsTypes: the states stored as text come back as the
// state package's types.
func TestStatesScanAsTypes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 1)
	claimed, err := s.Claim(ctx, "me", 1, nil, 1, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	open := func(cur store.Health, rs []state.Result) store.Health {
		require.Equal(t, state.BreakerClosed, cur.State, "an endpoint without a row is closed")
		require.Len(t, rs, 1)
		cur.State, cur.OpenedAt, cur.Cooldown = state.BreakerOpen, rs[0].At, time.Minute
		return cur
	}
	changes, err := s.RecordResults(ctx, "me", []state.Result{{
		DeliveryID: claimed[0].DeliveryID, Endpoint: "ep", Status: state.DeadLetter, Attempted: true,
		Signal: state.SignalFailure, StatusCode: 500, LastError: "http 500", At: time.Now(), CommitToDeliveryMS: -1,
	}}, open)
	require.NoError(t, err)
	require.Len(t, changes, 1)

	unhealthy, err := s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, state.BreakerOpen, unhealthy["ep"].State)

	items, _, err := s.Replay(ctx, store.ReplayFilter{Endpoint: "ep"}, true, 0)
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.Equal(t, state.DeadLetter, items[0].LastStatus)
	require.False(t, items[0].Queued)

	_, n, err := s.Replay(ctx, store.ReplayFilter{Endpoint: "ep"}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	items, _, err = s.Replay(ctx, store.ReplayFilter{Endpoint: "ep"}, true, 0)
	require.NoError(t, err)
	require.Equal(t, state.Pending, items[0].LastStatus)
	require.True(t, items[0].Queued, "a waiting delivery is not replayed again")
}
