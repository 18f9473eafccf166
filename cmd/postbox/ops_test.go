package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
}

func newGate(t *testing.T, status int) *gate {
	g := &gate{}
	g.status.Store(int32(status))
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.ids = append(g.ids, r.Header.Get("webhook-id"))
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
	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('p'), ('p')`)
	require.NoError(t, err)
	var lsn string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	_, err = pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, event_type) VALUES ('p', 'later'), ('p', 'later'), ('p', 'later')`)
	require.NoError(t, err)
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
	code, _, errOut = postbox(t, "replay", "--config", cfg, "--from-lsn", "nonsense")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--from-lsn")
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

	code, out, _ = postbox(t, "endpoints", "--config", cfg, "--json")
	require.Equal(t, exitOK, code)
	var eps struct {
		Endpoints []struct {
			Endpoint    string   `json:"endpoint"`
			P95MS       *float64 `json:"p95_ms"`
			SampleCount int      `json:"sample_count"`
			State       string   `json:"state"`
		} `json:"endpoints"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &eps))
	require.Len(t, eps.Endpoints, 2)
	require.Equal(t, "bad", eps.Endpoints[0].Endpoint)
	require.Equal(t, 2, eps.Endpoints[1].SampleCount)
	require.NotNil(t, eps.Endpoints[1].P95MS)

	code, out, _ = postbox(t, "dead-letters", "--config", cfg, "analyze")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "credentials_changed")
	code, out, _ = postbox(t, "dead-letters", "--config", cfg, "--endpoint", "bad")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "http 403")
	require.True(t, strings.HasPrefix(out, "DEAD AT"))
}
