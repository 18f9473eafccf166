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
	"github.com/postbox-relay/postbox/relay/telemetry"
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

// TestReplayRetargetsRowURLs: a row's url stays its event's target
// through a plain replay; replay with a URL (a template) sends the
// replayed delivery there, and with EndpointURL to the endpoint's url as
// it is then. The events keep their rows' urls; each delivery keeps its
// retarget, which the event's story shows without its query.
func TestReplayRetargetsRowURLs(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, deadAt("/dead"))
	ctx := context.Background()
	tb.start(t, relay.Options{})
	// Settings only: its rows give the url.
	tb.exec(t, `INSERT INTO postbox.endpoints (name, max_attempts) VALUES ('rows', 1)`)
	tb.waitApplied(t, "rows")
	dead := rc.URL + "/dead?cid={payload.click_id}"
	ids := tb.insert(t,
		outbox.Event{Endpoint: "rows", URL: dead, Payload: json.RawMessage(`{"click_id": "c1"}`)},
		outbox.Event{Endpoint: "rows", URL: dead, Payload: json.RawMessage(`{"click_id": "c2"}`)})
	for _, id := range ids {
		waitUntil(t, 10*time.Second, "a dead letter", func() bool { return tb.status(id) == postboxtype.DeliveryDeadLetter })
	}

	// A plain replay keeps the row's url: dead again.
	_, n, err := ops.Replay(ctx, tb.pool, tb.resolved(t), postboxtype.ReplayFilter{EventIDs: ids[:1]}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitUntil(t, 10*time.Second, "dead again", func() bool {
		return tb.status(ids[0]) == postboxtype.DeliveryDeadLetter && rc.count() == 3
	})

	// Refused before anything is enqueued.
	for _, f := range []postboxtype.ReplayFilter{
		{DeadLetters: true, URL: rc.URL + "/alive"},                       // every endpoint's events
		{EventIDs: ids[:1], URL: "ftp://example.com/"},                    // not http
		{EventIDs: ids[:1], URL: rc.URL + "/alive?cid={payload.click_id"}, // does not parse
		{EventIDs: ids[:1], URL: rc.URL + "/alive", EndpointURL: true},    // both
	} {
		_, _, err := ops.Replay(ctx, tb.pool, tb.resolved(t), f, false, 0)
		require.ErrorIs(t, err, ops.ErrRetarget, "%+v", f)
	}

	_, n, err = ops.Replay(ctx, tb.pool, tb.resolved(t),
		postboxtype.ReplayFilter{EventIDs: ids[:1], URL: rc.URL + "/alive?cid={payload.click_id}&id={event_id}"}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitUntil(t, 10*time.Second, "delivered to the url given", func() bool { return tb.status(ids[0]) == postboxtype.DeliveryDelivered })
	got := rc.requests()[rc.count()-1]
	require.Equal(t, ids[0], got.ID)
	require.Equal(t, "/alive", got.Path)
	require.Equal(t, "cid=c1&id="+ids[0], got.Query, "its macros expanded")

	// Its endpoint given a url: the second event replayed to it.
	tb.exec(t, `UPDATE postbox.endpoints SET url = $1 WHERE name = 'rows'`, rc.URL+"/endpoint?cid={payload.click_id}")
	rev := tb.waitApplied(t, "rows")
	_, n, err = ops.Replay(ctx, tb.pool, tb.resolved(t), postboxtype.ReplayFilter{DeadLetters: true, Endpoint: "rows", EndpointURL: true}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the first is delivered")
	waitUntil(t, 10*time.Second, "delivered to the endpoint's url", func() bool { return tb.status(ids[1]) == postboxtype.DeliveryDelivered })
	got = rc.requests()[rc.count()-1]
	require.Equal(t, ids[1], got.ID)
	require.Equal(t, "/endpoint", got.Path)
	require.Equal(t, "cid=c2", got.Query)
	var used int64
	require.NoError(t, tb.pool.QueryRow(ctx, `
		SELECT a.endpoint_revision FROM postbox.all_attempts a JOIN postbox.deliveries d ON d.id = a.delivery_id
		JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1 AND a.outcome = 'delivered'`, ids[1]).Scan(&used))
	require.Equal(t, rev, used)

	// History kept: the rows' urls on the events, the retargets on the
	// deliveries.
	var urls []string
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT array_agg(url ORDER BY id) FROM postbox.events`).Scan(&urls))
	require.Equal(t, []string{dead, dead}, urls)
	story, err := telemetry.LoadEvent(ctx, tb.pool, ids[0])
	require.NoError(t, err)
	var retargets []string
	for _, d := range story[0].Deliveries {
		retargets = append(retargets, d.Retarget)
	}
	require.Equal(t, []string{"", "", rc.URL + "/alive"}, retargets, "the story leaves the query out")
	story, err = telemetry.LoadEvent(ctx, tb.pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, postboxtype.RetargetEndpointURL, story[0].Deliveries[len(story[0].Deliveries)-1].Retarget)

	// An endpoint with a url of its own refuses a url given, as it
	// refuses a row's, at the attempt; the delivery is queued in the
	// endpoint's own lane, as its settings (read by the replay from the
	// applied rows, the configuration having no table) say.
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, max_attempts) VALUES ('own', $1, 1)`, rc.URL+"/dead")
	tb.waitApplied(t, "own")
	own := tb.insert(t, outbox.Event{Endpoint: "own", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 10*time.Second, "a dead letter", func() bool { return tb.status(own) == postboxtype.DeliveryDeadLetter })
	_, n, err = ops.Replay(ctx, tb.pool, tb.resolved(t), postboxtype.ReplayFilter{EventIDs: []string{own}, URL: rc.URL + "/alive"}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitUntil(t, 10*time.Second, "refused", func() bool { return tb.status(own) == postboxtype.DeliveryDeadLetter })
	require.Contains(t, tb.delivery(t, own).LastError, "row_url_not_allowed")
	var lane *string
	require.NoError(t, tb.pool.QueryRow(ctx, `SELECT d.lane FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 ORDER BY d.id DESC LIMIT 1`, own).Scan(&lane))
	require.Nil(t, lane, "the endpoint's own lane")
}

// TestRetryFollowsTheEndpointsCurrentURL: a retry resolves its table
// endpoint as it is when it starts: the url updated after the first
// attempt failed, the retry goes to the new one and records its revision.
func TestRetryFollowsTheEndpointsCurrentURL(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	var rc *receiver
	rc = newReceiver(t, func(_ int, r received) int {
		if r.Path != "/old" {
			return http.StatusOK
		}
		// The partner moves while its first attempt fails.
		if _, err := tb.pool.Exec(ctx, `UPDATE postbox.endpoints SET url = $1 WHERE name = 'moving'`, rc.URL+"/new"); err != nil {
			t.Errorf("update the url: %v", err) // not FailNow: the handler's goroutine
		}
		return http.StatusServiceUnavailable
	})
	tb.start(t, relay.Options{})
	tb.exec(t, `INSERT INTO postbox.endpoints (name, url, max_attempts, backoff_base) VALUES ('moving', $1, 2, '1s')`, rc.URL+"/old")
	first := tb.waitApplied(t, "moving")
	id := tb.insert(t, outbox.Event{Endpoint: "moving", Payload: json.RawMessage(`{}`)})[0]
	waitUntil(t, 15*time.Second, "the retry delivered", func() bool { return tb.status(id) == postboxtype.DeliveryDelivered })
	var paths []string
	for _, got := range rc.requests() {
		paths = append(paths, got.Path)
	}
	require.Equal(t, []string{"/old", "/new"}, paths)
	var revs []int64
	rows, err := tb.pool.Query(ctx, `SELECT endpoint_revision FROM postbox.all_attempts WHERE endpoint = 'moving' ORDER BY attempt`)
	require.NoError(t, err)
	for rows.Next() {
		var rev int64
		require.NoError(t, rows.Scan(&rev))
		revs = append(revs, rev)
	}
	require.NoError(t, rows.Err())
	require.Len(t, revs, 2)
	require.Equal(t, first, revs[0])
	require.Greater(t, revs[1], first, "the retry's revision is the update's")
}
