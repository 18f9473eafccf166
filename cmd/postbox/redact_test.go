package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestRedactPathKeepsAURLTokenOut: a partner whose token is a segment of
// its URL's path (Slack's /services/T/B/SECRET) gets the request at the
// real path, and the secret segment is in neither attempts.target, nor
// the relay's log (log_payloads on, the URL logged whole otherwise), nor
// `postbox event`'s output, where it shows as ***.
func TestRedactPathKeepsAURLTokenOut(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	const secret = "xoxSecretPart42"
	var mu sync.Mutex
	var paths []string
	first := true
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.URL.Path)
		if first { // one retry, so a failed attempt is logged and recorded too
			first = false
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	p, cfg := streamingRelay(t, dbURL, pool, "log_payloads: true\nendpoints:\n  slack:\n    url: "+rc.URL+"/services/T0001/B0002/"+secret+"\n    redact_path: [4]\n")
	id := insertIDs(t, pool, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ('slack', '{"text":"hi"}') RETURNING event_id::text`)[0]
	waitForT(t, 30*time.Second, "the delivery", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 1
	})
	p.waitLog(t, 10*time.Second, `"status_code":200`)

	mu.Lock()
	require.Equal(t, []string{"/services/T0001/B0002/" + secret, "/services/T0001/B0002/" + secret}, paths, "the partner got its real URL")
	mu.Unlock()
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM postbox.all_attempts WHERE target = $1`, rc.URL+"/services/T0001/B0002/***"))
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM postbox.all_attempts WHERE target LIKE '%' || $1 || '%'`, secret))
	require.Contains(t, p.out.String(), "/services/T0001/B0002/***", "the URL is logged, with log_payloads")
	require.NotContains(t, p.out.String(), secret)

	for _, args := range [][]string{{"event", id}, {"event", id, "--json"}, {"events", "--json"}, {"endpoints", "--json"}} {
		code, out, errOut := postbox(t, append(args, "--config", cfg)...)
		require.Equal(t, exitOK, code, errOut)
		require.NotContains(t, out+errOut, secret, strings.Join(args, " "))
	}
	_, out, _ := postbox(t, "event", id, "--json", "--config", cfg)
	require.Contains(t, out, "/services/T0001/B0002/***")
}
