package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// deadAt answers 500 to requests for path dead, 200 to the others.
func deadAt(dead string) func(int, received) int {
	return func(_ int, r received) int {
		if r.Path == dead {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}
}

// waitApplied waits until endpoint_state holds name at the revision
// postbox.endpoints has, and returns that revision.
func (tb *testBundle) waitApplied(t *testing.T, name string) int64 {
	t.Helper()
	ctx := context.Background()
	var rev int64
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT revision FROM postbox.endpoints WHERE name = $1`, name).Scan(&rev))
	waitUntil(t, 5*time.Second, name+" applied", func() bool {
		var n int
		_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.endpoint_state WHERE name = $1 AND revision = $2`, name, rev).Scan(&n)
		return n == 1
	})
	return rev
}

// TestReplayFollowsTheEndpointsCurrentURL: a dead letter of a table
// endpoint, replayed after an UPDATE of its url, goes to the new url, and
// its attempt records the revision of that update, not the one its
// first attempt used. A file endpoint's dead letter, replayed after a
// reload that changed its url, goes to the new one too.
func TestReplayFollowsTheEndpointsCurrentURL(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, deadAt("/old"))
	ctx := context.Background()
	one := 1
	tb.endpoint(t, "filed", rc.URL+"/old", func(ec *config.EndpointConfig) { ec.MaxAttempts = &one })
	r := tb.start(t, relay.Options{})
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, max_attempts) VALUES ('tabled', $1, 1)`, rc.URL+"/old")
	first := tb.waitApplied(t, "tabled")
	ids := tb.insert(t, outbox.Event{Endpoint: "tabled", Payload: json.RawMessage(`{}`)}, outbox.Event{Endpoint: "filed", Payload: json.RawMessage(`{}`)})
	for _, id := range ids {
		waitUntil(t, 10*time.Second, "a dead letter", func() bool { return tb.status(id) == postboxtype.DeliveryDeadLetter })
	}

	tb.exec(t, `UPDATE postbox.endpoints SET url = $1 WHERE name = 'tabled'`, rc.URL+"/new")
	second := tb.waitApplied(t, "tabled")
	require.Greater(t, second, first)
	tb.endpoint(t, "filed", rc.URL+"/new", func(ec *config.EndpointConfig) { ec.MaxAttempts = &one })
	require.NoError(t, r.Reload(tb.resolved(t)))

	_, n, err := ops.Replay(ctx, tb.pool, tb.resolved(t), postboxtype.ReplayFilter{DeadLetters: true}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, id := range ids {
		waitUntil(t, 10*time.Second, "the replay delivered", func() bool { return tb.status(id) == postboxtype.DeliveryDelivered })
	}
	paths := map[string][]string{}
	for _, got := range rc.requests() {
		paths[got.ID] = append(paths[got.ID], got.Path)
	}
	require.Equal(t, []string{"/old", "/new"}, paths[ids[0]], "the table endpoint's")
	require.Equal(t, []string{"/old", "/new"}, paths[ids[1]], "the file endpoint's")

	rows, err := tb.pool.Query(ctx, `SELECT endpoint_revision FROM postbox.all_attempts WHERE endpoint = 'tabled' ORDER BY started_at`)
	require.NoError(t, err)
	var revs []int64
	for rows.Next() {
		var rev int64
		require.NoError(t, rows.Scan(&rev))
		revs = append(revs, rev)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{first, second}, revs, "each attempt records the revision it used")
}
