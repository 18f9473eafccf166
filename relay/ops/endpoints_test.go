package ops_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestWriteEndpointsNamesTheActor: a write made for the console's
// session is logged under it, a delete too, and another under the
// session's role; refusals are typed.
func TestWriteEndpointsNamesTheActor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	cfg, err := config.Default().Resolve()
	require.NoError(t, err)

	res, err := ops.WriteEndpoints(ctx, pool, cfg, "console:s1", ops.WriteInsert,
		[]ops.EndpointWrite{{Name: "a", Set: map[string]ops.Value{"url": {Text: "https://a.example/"}}}})
	require.NoError(t, err)
	require.Equal(t, "created", res[0].Op)
	_, err = ops.WriteEndpoints(ctx, pool, cfg, "", ops.WriteUpdate,
		[]ops.EndpointWrite{{Name: "a", Set: map[string]ops.Value{"timeout": {Text: "5 seconds"}}}})
	require.NoError(t, err)
	deleted, err := ops.DeleteEndpoint(ctx, pool, "console:s2", "a")
	require.NoError(t, err)
	require.True(t, deleted)
	changes, err := ops.EndpointHistory(ctx, pool, "a", 0)
	require.NoError(t, err)
	var role string
	require.NoError(t, pool.QueryRow(ctx, `SELECT session_user::text`).Scan(&role))
	require.Len(t, changes, 3)
	for i, want := range []string{"insert console:s1", "update " + role, "delete console:s2"} {
		require.Equal(t, want, changes[i].Op+" "+changes[i].Actor)
	}

	_, err = ops.WriteEndpoints(ctx, pool, cfg, "", ops.WriteInsert,
		[]ops.EndpointWrite{{Name: "b", Set: map[string]ops.Value{"url": {Text: "https://b.example/{payload.x"}}}})
	var invalid *ops.InvalidError
	require.True(t, errors.As(err, &invalid), "%v", err)
	require.Equal(t, "b", invalid.Name)
	_, err = ops.WriteEndpoints(ctx, pool, cfg, "", ops.WriteInsert,
		[]ops.EndpointWrite{{Name: "b", Set: map[string]ops.Value{"timeout": {Text: "0 seconds"}}}})
	var refused *ops.RefusedError
	require.True(t, errors.As(err, &refused), "%v", err)
	require.Equal(t, "timeout", refused.Column)
	_, err = ops.WriteEndpoints(ctx, pool, cfg, "", ops.WriteUpdate,
		[]ops.EndpointWrite{{Name: "nosuch", Set: map[string]ops.Value{"enabled": {Text: "false"}}}})
	require.ErrorIs(t, err, ops.ErrNoEndpoint)
}
