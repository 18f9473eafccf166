package portal_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/portal"
	"github.com/postbox-relay/postbox/relay/internal/seed"
)

// TestDeliveriesListReadsItsIndex: the partner's list names the
// expression of its index on events (migration 037), so it reads that
// partner's events only, and no other statement is offered the index.
func TestDeliveriesListReadsItsIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ctx := context.Background()
	now := time.Now()
	require.NoError(t, seed.Day(ctx, b.pool, "", 20000, 200, now.Add(-7*24*time.Hour), now))
	require.NoError(t, seed.Analyze(ctx, b.pool))
	rows, err := b.pool.Query(ctx, `EXPLAIN (COSTS OFF) `+portal.DeliveriesSQL,
		seed.Endpoint(7), now.Add(-7*24*time.Hour), nil, "", nil, "", 51)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "events_endpoint_ingested", plan)
}
