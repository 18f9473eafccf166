package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// eventsJSON is what `postbox events --json` prints.
type eventsJSON []struct {
	EventID     string     `json:"event_id"`
	Endpoint    string     `json:"endpoint"`
	EventType   string     `json:"event_type"`
	Status      string     `json:"status"`
	Attempts    int        `json:"attempts"`
	CommittedAt *time.Time `json:"committed_at"`
}

// storyJSON is one story of `postbox event ID --json`.
type storyJSON struct {
	EventID     string     `json:"event_id"`
	Endpoint    string     `json:"endpoint"`
	EventType   string     `json:"event_type"`
	CommitLSN   string     `json:"commit_lsn"`
	CommittedAt *time.Time `json:"committed_at"`
	Deliveries  []struct {
		ID       int64  `json:"id"`
		Status   string `json:"status"`
		ReplayOf *int64 `json:"replay_of"`
		Attempts []struct {
			Attempt    int       `json:"attempt"`
			StartedAt  time.Time `json:"started_at"`
			StatusCode *int      `json:"status_code"`
			DurationMS *float64  `json:"duration_ms"`
			Error      string    `json:"error"`
			Response   string    `json:"response"`
			Hidden     bool      `json:"response_hidden"`
		} `json:"attempts"`
	} `json:"deliveries"`
}

// TestEventsSearchByPayload: with click_id in search_keys, `postbox events
// --payload click_id=…` finds the one event whose payload has it, among
// others, newest first without a filter; a key the configuration does not
// list is a usage error that says how to add it.
func TestEventsSearchByPayload(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newGate(t, http.StatusOK)
	_, cfg := streamingRelay(t, dbURL, pool, "search_keys: [click_id, payout]\nendpoints:\n  aff:\n    url: "+rc.URL+"\n")
	ids := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, event_type, payload)
		SELECT 'aff', 'conversion', jsonb_build_object('click_id', 'c_' || i, 'payout', i * 2, 'nested', jsonb_build_object('click_id', 'x'))
		FROM generate_series(8810, 8814) i RETURNING event_id::text`)
	later := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, event_type, payload) VALUES ('aff', 'refund', '{"click_id": "c_8812"}') RETURNING event_id::text`)
	waitForT(t, 30*time.Second, "six deliveries", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 6
	})

	events := func(args ...string) eventsJSON {
		t.Helper()
		code, out, errOut := postbox(t, append(append([]string{"events", "--config", cfg}, args...), "--json")...)
		require.Equal(t, exitOK, code, errOut)
		var doc eventsJSON
		require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
		return doc
	}
	found := events("--payload", "click_id=c_8812")
	require.Len(t, found, 2)
	require.Equal(t, later[0], found[0].EventID, "the newest first")
	require.Equal(t, ids[2], found[1].EventID)
	require.Equal(t, "conversion", found[1].EventType)
	require.Equal(t, "delivered", found[1].Status)
	require.Equal(t, 1, found[1].Attempts)
	require.NotNil(t, found[1].CommittedAt)
	found = events("--payload", "click_id=c_8812", "--payload", "payout=17624")
	require.Len(t, found, 1, "both keys must match; a number matches its text")
	require.Equal(t, ids[2], found[0].EventID)
	require.Empty(t, events("--payload", "click_id=x"), "only top-level fields are indexed")

	all := events("--endpoint", "aff", "--status", "delivered", "--since", "1h")
	require.Len(t, all, 6)
	for i := 1; i < len(all); i++ {
		require.False(t, all[i].CommittedAt.After(*all[i-1].CommittedAt), "newest first")
	}
	require.Len(t, events("--limit", "2"), 2)
	require.Empty(t, events("--status", "dead_letter"))

	code, out, errOut := postbox(t, "events", "--config", cfg, "--payload", "click_id=c_8812")
	require.Equal(t, exitOK, code, errOut)
	require.True(t, strings.HasPrefix(out, "COMMITTED"), out)
	require.Contains(t, out, ids[2])
	require.Contains(t, out, "refund")

	code, _, errOut = postbox(t, "events", "--config", cfg, "--payload", "order_id=o_1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `"order_id"`)
	require.Contains(t, errOut, "search_keys: [click_id, payout, order_id]")
	require.Contains(t, errOut, "events ingested before the key was added are not indexed")
	code, _, errOut = postbox(t, "events", "--config", cfg, "--status", "lost")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "dead_letter")
	code, _, _ = postbox(t, "events", "--config", cfg, "--payload", "no-equals-sign")
	require.Equal(t, exitUsage, code)
}

// TestEventStoryShowsRetriesAndReplays: an event retried once and then
// delivered has one delivery with both attempts and their status codes;
// an event dead-lettered and then replayed has two deliveries under the
// same event id, the second marked as the first's replay. An unknown id
// is a failure naming it.
func TestEventStoryShowsRetriesAndReplays(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	var mu sync.Mutex
	seen := map[string]int{}
	strict := newGate(t, http.StatusUnauthorized)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("webhook-id")]++
		n := seen[r.Header.Get("webhook-id")]
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("try\nlater"))
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(flaky.Close)
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  flaky:\n    url: "+flaky.URL+"\n  strict:\n    url: "+strict.URL+"\n")
	retried := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, event_type) VALUES ('flaky', 'signup') RETURNING event_id::text`)[0]
	dead := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, event_type) VALUES ('strict', 'sale') RETURNING event_id::text`)[0]
	waitForT(t, 30*time.Second, "one delivered, one dead letter", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status IN ('delivered', 'dead_letter')`) == 2
	})
	strict.status.Store(http.StatusOK) // the partner fixed its credentials
	replay(t, "--config", cfg, "--event-id", dead)
	waitForT(t, 30*time.Second, "the replay delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 2
	})

	// The same database read with log_payloads on: the response bodies
	// show only there.
	shown := writeConfig(t, dbURL, "log_payloads: true\n")
	story := func(id string, cfg string) storyJSON {
		t.Helper()
		code, out, errOut := postbox(t, "event", id, "--config", cfg, "--json")
		require.Equal(t, exitOK, code, errOut)
		var s storyJSON
		require.NoError(t, json.Unmarshal([]byte(out), &s), "one story: one object\n%s", out)
		return s
	}
	s := story(retried, shown)
	require.Equal(t, retried, s.EventID)
	require.Equal(t, "flaky", s.Endpoint)
	require.Equal(t, "signup", s.EventType)
	require.NotEmpty(t, s.CommitLSN)
	require.NotNil(t, s.CommittedAt)
	require.Len(t, s.Deliveries, 1)
	d := s.Deliveries[0]
	require.Equal(t, "delivered", d.Status)
	require.Nil(t, d.ReplayOf)
	require.Len(t, d.Attempts, 2)
	require.Equal(t, 1, d.Attempts[0].Attempt)
	require.Equal(t, http.StatusServiceUnavailable, *d.Attempts[0].StatusCode)
	require.Equal(t, "try\nlater", d.Attempts[0].Response)
	require.NotEmpty(t, d.Attempts[0].Error)
	require.NotNil(t, d.Attempts[0].DurationMS)
	require.Equal(t, 2, d.Attempts[1].Attempt)
	require.Equal(t, http.StatusOK, *d.Attempts[1].StatusCode)
	require.False(t, d.Attempts[1].StartedAt.Before(d.Attempts[0].StartedAt))
	hidden := story(retried, cfg).Deliveries[0].Attempts[0]
	require.Empty(t, hidden.Response, "log_payloads is off")
	require.True(t, hidden.Hidden)

	s = story(dead, cfg)
	require.Equal(t, dead, s.EventID)
	require.Len(t, s.Deliveries, 2)
	first, second := s.Deliveries[0], s.Deliveries[1]
	require.Equal(t, "replayed", first.Status)
	require.Len(t, first.Attempts, 1)
	require.Equal(t, http.StatusUnauthorized, *first.Attempts[0].StatusCode)
	require.Equal(t, "delivered", second.Status)
	require.NotNil(t, second.ReplayOf)
	require.Equal(t, first.ID, *second.ReplayOf)
	require.Len(t, second.Attempts, 1)
	require.Equal(t, http.StatusOK, *second.Attempts[0].StatusCode)

	code, out, errOut := postbox(t, "event", "--config", cfg, dead)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "event "+dead+" (sale) to strict")
	require.Contains(t, out, "at LSN "+s.CommitLSN)
	require.Contains(t, out, "HTTP 401")
	require.Contains(t, out, "(replay of delivery ")
	code, out, errOut = postbox(t, "event", "--config", cfg, retried)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "#1  ")
	require.Contains(t, out, "HTTP 503")
	require.Contains(t, out, "response: hidden: log_payloads is off")
	require.NotContains(t, out, "try later")
	code, out, errOut = postbox(t, "event", "--config", shown, retried)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "response: try later", "the response on one line")
	require.Contains(t, out, "HTTP 200")

	missing := "00000000-0000-4000-8000-000000000000"
	code, _, errOut = postbox(t, "event", "--config", cfg, missing)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "no event "+missing)
	code, _, _ = postbox(t, "event", "--config", cfg)
	require.Equal(t, exitUsage, code)
}
