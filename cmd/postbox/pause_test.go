package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestPauseHoldsDeliveriesUntilResume: `postbox endpoints pause` holds an
// endpoint's events in the queue on the running relay (none attempted,
// none dropped, attempts not spent) while another endpoint delivers, the
// tables show the pause, and `resume` delivers every held event once.
func TestPauseHoldsDeliveriesUntilResume(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	p := newGate(t, http.StatusOK)
	q := newGate(t, http.StatusOK)
	// q is ordered, so its events go through the claimer, which reads
	// the pauses before each claim: a delivery to q proves the relay has
	// seen the pause.
	_, cfg := streamingRelay(t, dbURL, pool, "endpoints:\n  p:\n    url: "+p.URL+"\n  q:\n    url: "+q.URL+"\n    ordered: true\n")
	ctx := context.Background()
	delivered := func(endpoint string, n int) {
		t.Helper()
		waitForT(t, 30*time.Second, "deliveries to "+endpoint, func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE endpoint = $1 AND status = 'delivered'`, endpoint) == n
		})
	}

	code, out, errOut := postbox(t, "endpoints", "pause", "p", "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "paused p until resumed")
	require.Contains(t, out, "postbox endpoints resume p")
	code, _, errOut = postbox(t, "endpoints", "pause", "--config", cfg, "ghost")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "no endpoint ghost")

	_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('q')`)
	require.NoError(t, err)
	delivered("q", 1)
	held := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint) SELECT 'p' FROM generate_series(1, 3) RETURNING event_id::text`)
	waitForT(t, 30*time.Second, "p's events ingested", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'p'`) == 3
	})
	_, err = pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) VALUES ('q')`)
	require.NoError(t, err)
	delivered("q", 2)
	require.Empty(t, p.seen(), "nothing attempted while paused")
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM postbox.all_attempts WHERE endpoint = 'p'`))
	require.Equal(t, 3, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'p' AND status = 'pending' AND attempt_count = 0`),
		"all held in the queue, no attempt spent")

	code, out, errOut = postbox(t, "endpoints", "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^p\s+paused until resumed\s`, out)
	code, out, errOut = postbox(t, "status", "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "p  paused until resumed (postbox endpoints resume p)")

	code, out, errOut = postbox(t, "endpoints", "resume", "p", "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "resumed p: its 3 queued deliveries go out now")
	delivered("p", 3)
	want := map[string]int{}
	for _, id := range held {
		want[id] = 1
	}
	require.Equal(t, want, p.seen(), "every held event, once")

	// A pause for a while ends by itself; --json says when.
	code, out, errOut = postbox(t, "endpoints", "pause", "p", "--for", "90m", "--config", cfg, "--json")
	require.Equal(t, exitOK, code, errOut)
	var paused struct {
		PausedUntil time.Time `json:"paused_until"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &paused))
	require.WithinDuration(t, time.Now().Add(90*time.Minute), paused.PausedUntil, time.Minute)
	code, _, _ = postbox(t, "endpoints", "pause", "p", "--for", "-5m", "--config", cfg)
	require.Equal(t, exitUsage, code)
	code, out, _ = postbox(t, "endpoints", "resume", "p", "--config", cfg)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "resumed p")
	code, out, _ = postbox(t, "endpoints", "resume", "p", "--config", cfg)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "p was not paused")
}

func TestShellQuoteAndPrintable(t *testing.T) {
	t.Parallel()
	require.Equal(t, "partner_a", shellQuote("partner_a"))
	require.Equal(t, "'a b'", shellQuote("a b"))
	require.Equal(t, `'it'\''s'`, shellQuote("it's"))
	require.Equal(t, `'$(rm -rf x)'`, shellQuote("$(rm -rf x)"))
	require.Equal(t, `$'a\x1b[31mb'`, shellQuote("a\x1b[31mb"))
	require.Equal(t, "''", shellQuote(""))
	require.Equal(t, "a[31mb", printable("a\x1b[31mb"))
}
