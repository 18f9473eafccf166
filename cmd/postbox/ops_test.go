package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// postbox runs a command in-process and returns its exit code and output.
func postbox(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// gate is a receiver that answers status() and records webhook-ids in order.
type gate struct {
	*httptest.Server
	status atomic.Int32
	mu     sync.Mutex
	ids    []string
	at     []time.Time // when each request arrived
}

func newGate(t *testing.T, status int) *gate {
	g := &gate{}
	g.status.Store(int32(status))
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.ids = append(g.ids, r.Header.Get("webhook-id"))
		g.at = append(g.at, time.Now())
		g.mu.Unlock()
		w.WriteHeader(int(g.status.Load()))
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gate) seen() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int{}
	for _, id := range g.ids {
		out[id]++
	}
	return out
}

func TestReplayDeadLettersAndDryRun(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newGate(t, http.StatusUnauthorized)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) SELECT 'p', jsonb_build_object('i', i) FROM generate_series(1, 3) i`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "three dead letters", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter'`) == 3
	})

	code, out, errOut := postbox(t, "replay", "--config", cfg, "--dead-letters", "--endpoint", "p", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would enqueue 3 of 3 selected events")
	require.Equal(t, 3, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries`), "a dry run changes nothing")

	rc.status.Store(http.StatusOK) // the partner fixed its credentials
	code, out, errOut = postbox(t, "replay", "--config", cfg, "--dead-letters", "--endpoint", "p")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "enqueued 3 events")
	waitForT(t, 30*time.Second, "the replay delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 3
	})
	seen := rc.seen()
	require.Len(t, seen, 3)
	for id, n := range seen {
		require.Equal(t, 2, n, "event %s: once refused, once replayed, with the same webhook-id", id)
	}
	require.Equal(t, 3, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE replay_of IS NOT NULL`))
	// The dead letters replayed are dead letters no more, their history kept.
	require.Equal(t, 3, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'replayed' AND last_status_code = 401`))
	code, out, _ = postbox(t, "status", "--config", cfg, "--json", "--check")
	require.Equal(t, exitOK, code, "no alert fires once the dead letters are replayed")
	var st struct {
		DeadLetter int `json:"dead_letter"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, 0, st.DeadLetter)

	// Replaying again finds nothing dead any more.
	code, out, _ = postbox(t, "replay", "--config", cfg, "--dead-letters", "--endpoint", "p")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "enqueued 0 events")
}

func TestReplayFromLSN(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newGate(t, http.StatusOK)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	ctx := context.Background()
	earlier := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint) VALUES ('p'), ('p') RETURNING event_id::text`)
	var lsn string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	later := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, event_type) VALUES ('p', 'later'), ('p', 'later'), ('p', 'later') RETURNING event_id::text`)
	waitForT(t, 30*time.Second, "five deliveries", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 5
	})
	code, out, errOut := postbox(t, "replay", "--config", cfg, "--from-lsn", lsn, "--dry-run", "--json")
	require.Equal(t, exitOK, code, errOut)
	var doc struct {
		Selected int `json:"selected"`
		Events   []struct {
			EventType string `json:"event_type"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, 3, doc.Selected, "only the events committed at or after the LSN")
	for _, e := range doc.Events {
		require.Equal(t, "later", e.EventType)
	}
	require.Equal(t, 5, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries`), "a dry run changes nothing")

	// The replay itself: the later events are delivered again, with their
	// event ids; the earlier ones are not.
	code, out, errOut = postbox(t, "replay", "--config", cfg, "--from-lsn", lsn)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "enqueued 3 events")
	waitForT(t, 30*time.Second, "the replay delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 8
	})
	want := map[string]int{}
	for _, id := range earlier {
		want[id] = 1
	}
	for _, id := range later {
		want[id] = 2
	}
	require.Equal(t, want, rc.seen())

	code, _, errOut = postbox(t, "replay", "--config", cfg, "--from-lsn", "nonsense")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--from-lsn")
}

// insertIDs runs an INSERT … RETURNING event_id::text and returns the ids.
func insertIDs(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// replayJSON is what `postbox replay --json` prints.
type replayJSON struct {
	DryRun        bool `json:"dry_run"`
	Selected      int  `json:"selected"`
	AlreadyQueued int  `json:"already_queued"`
	Enqueued      int  `json:"enqueued"`
	Events        []struct {
		EventID string `json:"event_id"`
		Queued  bool   `json:"already_queued"`
	} `json:"events"`
}

func replay(t *testing.T, args ...string) replayJSON {
	t.Helper()
	code, out, errOut := postbox(t, append(append([]string{"replay"}, args...), "--json")...)
	require.Equal(t, exitOK, code, errOut)
	var doc replayJSON
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	return doc
}

// TestReplayByEventIDAndUntil replays chosen events by id (repeated and
// comma-separated), then the events committed before a time: each is
// delivered again with its own webhook-id, and nothing else is. An event
// whose replay is still waiting is not enqueued twice.
func TestReplayByEventIDAndUntil(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newGate(t, http.StatusOK)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	ctx := context.Background()
	delivered := func(n int) {
		t.Helper()
		waitForT(t, 30*time.Second, fmt.Sprintf("%d deliveries", n), func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n
		})
	}
	a := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint) VALUES ('p'), ('p') RETURNING event_id::text`)
	delivered(2)
	// A time after the first transaction's commit and before the second's,
	// by the server's clock, which stamps the commits.
	var between time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&between))
	b := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint) VALUES ('p'), ('p'), ('p') RETURNING event_id::text`)
	delivered(5)

	doc := replay(t, "--config", cfg, "--event-id", a[0], "--event-id", b[1]+","+b[2])
	require.Equal(t, 3, doc.Selected)
	require.Equal(t, 3, doc.Enqueued)
	delivered(8)
	require.Equal(t, map[string]int{a[0]: 2, a[1]: 1, b[0]: 1, b[1]: 2, b[2]: 2}, rc.seen())

	doc = replay(t, "--config", cfg, "--until", between.Format(time.RFC3339Nano))
	require.Equal(t, 2, doc.Selected, "the events committed before the time")
	require.Equal(t, 2, doc.Enqueued)
	delivered(10)
	require.Equal(t, map[string]int{a[0]: 3, a[1]: 2, b[0]: 1, b[1]: 2, b[2]: 2}, rc.seen())
	doc = replay(t, "--config", cfg, "--since", between.Format(time.RFC3339Nano), "--until", "0s", "--dry-run")
	require.Equal(t, 3, doc.Selected, "--since and --until together: the events committed after the time, until now")

	// While the receiver has paused the endpoint (Retry-After), a replay
	// waits in the queue; replaying the event again does not double it.
	_, err := pool.Exec(ctx, `INSERT INTO postbox.endpoint_health (endpoint, paused_until) VALUES ('p', now() + interval '1 hour')
		ON CONFLICT (endpoint) DO UPDATE SET paused_until = excluded.paused_until`)
	require.NoError(t, err)
	doc = replay(t, "--config", cfg, "--event-id", b[0])
	require.Equal(t, 1, doc.Enqueued)
	doc = replay(t, "--config", cfg, "--event-id", b[0])
	require.Equal(t, 1, doc.Selected)
	require.Equal(t, 1, doc.AlreadyQueued)
	require.Zero(t, doc.Enqueued, "one live delivery per event")
	require.True(t, doc.Events[0].Queued)
	require.Equal(t, 1, queryInt(t, pool, `
		SELECT count(*) FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 AND d.status IN ('pending', 'in_flight', 'failed')`, b[0]))
	_, err = pool.Exec(ctx, `UPDATE postbox.endpoint_health SET paused_until = NULL WHERE endpoint = 'p'`)
	require.NoError(t, err)
	delivered(11)
	require.Equal(t, 2, rc.seen()[b[0]])
}

// TestReplayRateSpreadsDeliveries: `replay --rate 5` makes the replayed
// deliveries fall due 200 ms apart, and none is delivered before it is
// due, so the last arrives no sooner than (n-1)/rate after the replay
// began. How much later it arrives is the machine's business: the test
// sets no upper bound.
func TestReplayRateSpreadsDeliveries(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newGate(t, http.StatusOK)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+rc.URL+"\n")
	const n, rate = 6, 5.0
	ids := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint) SELECT 'p' FROM generate_series(1, $1) RETURNING event_id::text`, n)
	waitForT(t, 30*time.Second, "the first deliveries", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == n
	})
	before := queryInt(t, pool, `SELECT max(id) FROM postbox.deliveries`)

	began := time.Now()
	code, out, errOut := postbox(t, "replay", "--config", cfg, "--endpoint", "p", "--rate", "5")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "enqueued 6 events")
	require.Contains(t, out, "spread out at 5 a second: the last falls due in 1s")

	type due struct {
		eventID string
		at      time.Time
	}
	var dues []due
	rows, err := pool.Query(context.Background(), `
		SELECT e.event_id::text, d.next_attempt_at FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE d.id > $1 ORDER BY d.next_attempt_at`, before)
	require.NoError(t, err)
	for rows.Next() {
		var d due
		require.NoError(t, rows.Scan(&d.eventID, &d.at))
		dues = append(dues, d)
	}
	require.NoError(t, rows.Err())
	require.Len(t, dues, n)
	step := time.Duration(float64(time.Second) / rate)
	for i := 1; i < n; i++ {
		require.InDelta(t, step, dues[i].at.Sub(dues[i-1].at), float64(time.Millisecond), "deliveries %d and %d fall due 1/rate apart", i-1, i)
	}

	waitForT(t, 30*time.Second, "the replay delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 2*n
	})
	dueAt := map[string]time.Time{}
	for _, d := range dues {
		dueAt[d.eventID] = d.at
	}
	rc.mu.Lock()
	var last time.Time
	replayed := 0
	seen := map[string]int{}
	for i, id := range rc.ids {
		if seen[id]++; seen[id] == 2 {
			replayed++
			require.False(t, rc.at[i].Before(dueAt[id].Add(-time.Millisecond)), "event %s arrived %s before it was due", id, dueAt[id].Sub(rc.at[i]))
			last = rc.at[i]
		}
	}
	rc.mu.Unlock()
	require.Equal(t, n, replayed)
	require.Len(t, seen, len(ids))
	spread := last.Sub(began)
	t.Logf("%d events replayed at %g a second: the last arrived %s after the replay began", n, rate, spread.Round(time.Millisecond))
	require.GreaterOrEqual(t, spread, time.Duration(n-1)*step, "no faster than the rate")
}

func TestStatusCheckAndJSON(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newGate(t, http.StatusOK)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  good:\n    url: "+rc.URL+"\n  bad:\n    url: "+rc.URL+"/x\n")
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('good'), ('good')`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "deliveries", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 2
	})
	code, out, errOut := postbox(t, "status", "--config", cfg, "--check")
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "no alerts")

	var s struct {
		Pending           *int64 `json:"pending"`
		AwaitingRetry     *int64 `json:"awaiting_retry"`
		DeadLetter        *int64 `json:"dead_letter"`
		DeliveredLastHour int64  `json:"delivered_last_hour"`
		Slot              struct {
			Active bool `json:"active"`
		} `json:"slot"`
	}
	code, out, _ = postbox(t, "status", "--config", cfg, "--json", "--check")
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.NotNil(t, s.Pending)
	require.NotNil(t, s.AwaitingRetry)
	require.EqualValues(t, 2, s.DeliveredLastHour)
	require.True(t, s.Slot.Active)

	rc.status.Store(http.StatusForbidden)
	_, err = pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('bad')`)
	require.NoError(t, err)
	waitForT(t, 30*time.Second, "a dead letter", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter'`) == 1
	})
	code, out, _ = postbox(t, "status", "--config", cfg, "--check")
	require.Equal(t, exitFailure, code, "an alert fires")
	require.Contains(t, out, "dead_letters_rising")

	var eps struct {
		Endpoints []struct {
			Endpoint    string   `json:"endpoint"`
			P95MS       *float64 `json:"p95_ms"`
			SampleCount int      `json:"sample_count"`
			State       string   `json:"state"`
		} `json:"endpoints"`
	}
	// The recorder adds its latency counts to the histograms once a second.
	waitForT(t, 10*time.Second, "both endpoints' samples counted", func() bool {
		code, out, _ = postbox(t, "endpoints", "--config", cfg, "--json")
		require.Equal(t, exitOK, code)
		require.NoError(t, json.Unmarshal([]byte(out), &eps))
		return len(eps.Endpoints) == 2 && eps.Endpoints[1].SampleCount == 2
	})
	require.Len(t, eps.Endpoints, 2)
	require.Equal(t, "bad", eps.Endpoints[0].Endpoint)
	require.Equal(t, 2, eps.Endpoints[1].SampleCount)
	require.NotNil(t, eps.Endpoints[1].P95MS)

	code, out, _ = postbox(t, "dead-letters", "--config", cfg, "analyze")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "credentials_changed")
	code, out, errOut = postbox(t, "dead-letters", "--config", cfg, "--endpoint", "bad")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "http 403")
	require.True(t, strings.HasPrefix(out, "DEAD AT"))
	require.NotContains(t, errOut, "there may be more", "a list under its limit is all of them")
	// A list cut at its limit says so.
	code, out, errOut = postbox(t, "dead-letters", "--config", cfg, "--limit", "1")
	require.Equal(t, exitOK, code)
	require.Equal(t, 2, strings.Count(out, "\n"), "the header and one dead letter")
	require.Contains(t, errOut, "the newest 1 dead letters since")
}

// TestReplayURL: replay --url sends a row-url event's replay to the url
// given (its macros expanded); the event's story names the retarget
// without its query. The flags' misuses are usage errors.
func TestReplayURL(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	dead, alive := newGate(t, http.StatusGone), newGate(t, http.StatusOK)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    max_attempts: 1\n")
	ids := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, url, payload) VALUES ('p', $1, '{"click_id": "c1"}') RETURNING event_id::text`, dead.URL+"/pb")
	waitForT(t, 30*time.Second, "a dead letter", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter'`) == 1
	})

	for _, bad := range [][]string{
		{"--dead-letters", "--endpoint", "p", "--url", alive.URL, "--endpoint-url"},
		{"--dead-letters", "--url", alive.URL},
		{"--dead-letters", "--endpoint", "p", "--url", "ftp://example.com/pb"},
		{"--dead-letters", "--endpoint", "p", "--url", alive.URL + "/pb?cid={payload.click_id"},
	} {
		code, _, errOut := postbox(t, append([]string{"replay", "--config", cfg}, bad...)...)
		require.Equal(t, exitUsage, code, "%v", bad)
		require.Contains(t, errOut, "--url", "%v", bad)
	}
	code, out, errOut := postbox(t, "replay", "--config", cfg, "--dead-letters", "--endpoint", "p", "--url", alive.URL+"/pb", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would enqueue 1 of 1 selected event")
	require.Contains(t, out, "sent to the url given")
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries`), "nothing enqueued")

	code, out, errOut = postbox(t, "replay", "--config", cfg, "--dead-letters", "--endpoint", "p", "--url", alive.URL+"/pb?cid={payload.click_id}")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "enqueued 1 event")
	require.Contains(t, out, "sent to the url given")
	waitForT(t, 30*time.Second, "the replay delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 1
	})
	require.Equal(t, map[string]int{ids[0]: 1}, alive.seen())
	require.Equal(t, map[string]int{ids[0]: 1}, dead.seen())

	code, out, errOut = postbox(t, "event", "--config", cfg, ids[0])
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "to "+alive.URL+"/pb, not the row's url")
	require.NotContains(t, out, "cid=")
}
