package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClaimKeepsItsPlan: the claim runs on a plan kept across runs
// (claimPlans), not one planned at each run, as the planner otherwise did
// for a prepared statement's first five runs and whenever the generic plan
// looked dearer.
func TestClaimKeepsItsPlan(t *testing.T) {
	t.Parallel()
	s := setupConns(t, 1) // one session: its prepared statements are the claim's
	ctx := context.Background()
	queue(t, s, "ep", 3)
	for range 3 {
		claimed, err := s.Claim(ctx, "me", 10, nil, nil, 100, nil)
		require.NoError(t, err)
		require.Len(t, claimed, 3)
		_, err = s.Pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'pending', lease_owner = NULL WHERE status = 'in_flight'`)
		require.NoError(t, err)
	}
	var generic, custom int64
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE '%pending_lanes%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&generic, &custom))
	require.Equal(t, int64(0), custom, "claims planned at their run")
	require.Equal(t, int64(3), generic)
}
