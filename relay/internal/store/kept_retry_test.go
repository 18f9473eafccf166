package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestKeptRetriesAreTheirOwnersAlone: a retry recorded with Keep stays
// failed and its instance's: no claim, probe of the next retry or park
// takes it, its owner reads it back by id and records its next attempt,
// and when the owner is gone it returns to the queue at its own time, not
// at once.
func TestKeptRetriesAreTheirOwnersAlone(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 3)
	require.NoError(t, s.Heartbeat(ctx, s.Pool, store.Instance{ID: "ghost"}, time.Second, false))
	claimed, err := s.Claim(ctx, "ghost", 3, nil, nil, 3, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	ids := []int64{claimed[0].DeliveryID, claimed[1].DeliveryID, claimed[2].DeliveryID}

	same := func(cur store.Health, _ []state.Result) store.Health { return cur }
	rs := make([]state.Result, 3)
	for i, id := range ids {
		rs[i] = state.Result{DeliveryID: id, Endpoint: "ep", Attempt: 1, Status: postboxtype.DeliveryFailed, Delay: 30 * time.Second,
			Attempted: true, Sampled: true, At: time.Now(), CommitToDeliveryMS: -1, ErrorClass: "connection", LastError: "connection refused",
			Keep: i < 2}
	}
	_, err = s.RecordResults(ctx, "ghost", rs, same, nil)
	require.NoError(t, err)
	owners := func() map[int64]string {
		rows, err := s.Pool.Query(ctx, `SELECT id, coalesce(lease_owner, '') FROM postbox.deliveries WHERE status = 'failed'`)
		require.NoError(t, err)
		defer rows.Close()
		out := map[int64]string{}
		for rows.Next() {
			var id int64
			var owner string
			require.NoError(t, rows.Scan(&id, &owner))
			out[id] = owner
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, map[int64]string{ids[0]: "ghost", ids[1]: "ghost", ids[2]: ""}, owners(), "failed, the first two kept")

	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET next_attempt_at = now() + CASE WHEN lease_owner IS NULL
		THEN interval '20 seconds' ELSE interval '10 seconds' END`)
	require.NoError(t, err)
	in, ok, err := s.NextRetryIn(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, in, 15*time.Second, "the next retry in the queue is the one not kept")
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	got, err := s.Claim(ctx, "me", 3, nil, nil, 3, nil)
	require.NoError(t, err)
	require.Len(t, got, 1, "only the retry not kept is claimed")
	require.Equal(t, ids[2], got[0].DeliveryID)
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.endpoint_health SET state = 'open', opened_at = now() WHERE endpoint = 'ep'`)
	require.NoError(t, err)
	parked, err := s.Park(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, parked, "a kept retry is not parked")
	_, err = s.Pool.Exec(ctx, `DELETE FROM postbox.endpoint_health`)
	require.NoError(t, err)

	loaded, err := s.LoadOwned(ctx, "ghost", ids[:2])
	require.NoError(t, err)
	require.Len(t, loaded, 2, "its owner reads its kept retries back")
	none, err := s.LoadOwned(ctx, "me", ids[:2])
	require.NoError(t, err)
	require.Empty(t, none, "no one else does")
	rs[0].Status, rs[0].Attempt, rs[0].Keep, rs[0].ErrorClass, rs[0].LastError = postboxtype.DeliveryDelivered, 2, false, "", ""
	_, err = s.RecordResults(ctx, "ghost", rs[:1], same, nil)
	require.NoError(t, err)
	var status string
	var attempts int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT status, attempt_count FROM postbox.deliveries WHERE id = $1`, ids[0]).Scan(&status, &attempts))
	require.Equal(t, "delivered", status, "the kept retry's attempt is recorded")
	require.Equal(t, 2, attempts)

	// Its owner gone, the other kept retry returns to the queue due when
	// it was, an hour from now.
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET next_attempt_at = now() + interval '1 hour' WHERE id = $1`, ids[1])
	require.NoError(t, err)
	dead, err := s.DeadOwners(ctx)
	require.NoError(t, err)
	require.Empty(t, dead, "the ghost's registration is current")
	require.Eventually(t, func() bool {
		dead, err := s.DeadOwners(ctx)
		return err == nil && len(dead) == 1 && dead[0] == "ghost"
	}, 10*time.Second, 20*time.Millisecond, "the ghost, gone, still holds a kept retry")
	n, err := s.ReleaseAbandonedOf(ctx, []string{"ghost"}, 100, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var owner *string
	var later bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT lease_owner, next_attempt_at > now() + interval '50 minutes' FROM postbox.deliveries WHERE id = $1`,
		ids[1]).Scan(&owner, &later))
	require.Nil(t, owner)
	require.True(t, later, "queued at its own time")
}
