package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestPauseHoldsClaimsUntilResumed: an operator's pause without an end
// holds the endpoint's deliveries from every claim, reads back as a time
// (not 'infinity'), is not shortened by a receiver's Retry-After recorded
// meanwhile, and Resume releases the deliveries, dropping none.
func TestPauseHoldsClaimsUntilResumed(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "held", 3)
	queue(t, s, "fine", 2)
	require.NoError(t, s.Pause(ctx, "held", time.Time{}))

	unhealthy, err := s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, postboxtype.PauseIndefinite, unhealthy["held"].PausedUntil.UTC())
	require.Equal(t, postboxtype.BreakerClosed, unhealthy["held"].State)
	claimed, err := s.Claim(ctx, "me", 10, nil, nil, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"fine": 2}, count(claimed))

	// An attempt that was in flight when the pause came back with 429 and
	// Retry-After: 1s. Its result extends pauses, never shortens them.
	prot := protection(t, s)
	var id int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT id FROM postbox.deliveries WHERE endpoint = 'held' ORDER BY id LIMIT 1`).Scan(&id))
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'in_flight', lease_owner = 'me' WHERE id = $1`, id)
	require.NoError(t, err)
	now := time.Now()
	changes, err := s.RecordResults(ctx, "me", []state.Result{{
		DeliveryID: id, Endpoint: "held", Status: postboxtype.DeliveryFailed, Delay: time.Second, Attempted: true, Sampled: true, Attempt: 1,
		Pause: time.Second, StatusCode: 429, LastError: "http 429", At: now, CommitToDeliveryMS: -1,
	}}, prot.Apply, nil)
	require.NoError(t, err)
	require.Len(t, changes, 1)
	require.Equal(t, postboxtype.PauseIndefinite, changes[0].New.PausedUntil.UTC())
	unhealthy, err = s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, postboxtype.PauseIndefinite, unhealthy["held"].PausedUntil.UTC(), "the manual pause stands")

	// A pause with an end replaces it.
	until := now.Add(time.Hour).Truncate(time.Microsecond)
	require.NoError(t, s.Pause(ctx, "held", until))
	unhealthy, err = s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	require.True(t, until.Equal(unhealthy["held"].PausedUntil))

	require.NoError(t, s.Resume(ctx, "held"))
	unhealthy, err = s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	require.NotContains(t, unhealthy, "held")
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET next_attempt_at = now() WHERE endpoint = 'held'`)
	require.NoError(t, err)
	claimed, err = s.Claim(ctx, "me", 10, nil, nil, 100, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"held": 3}, count(claimed), "every held delivery, the retried one too")
}
