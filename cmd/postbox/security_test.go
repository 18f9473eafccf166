package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// signedReceiver records each request's headers and body.
type signedReceiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []signedRequest
}

type signedRequest struct {
	header http.Header
	body   []byte
}

func newSignedReceiver(t *testing.T) *signedReceiver {
	s := &signedReceiver{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, signedRequest{r.Header.Clone(), body})
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *signedReceiver) last(t *testing.T, n int) signedRequest {
	t.Helper()
	waitForT(t, 30*time.Second, "a delivery", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.reqs) >= n
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[n-1]
}

// TestRotationWithoutRestart rotates the signing secret on a running
// postbox: add the new secret (both sign), then drop the old, by SIGHUP,
// and once more through a watched secrets file.
func TestRotationWithoutRestart(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newSignedReceiver(t)
	old, cur := outbox.NewSecret(), outbox.NewSecret()
	endpoints := "endpoints:\n  p:\n    url: " + rc.URL + "\n"
	p, cfg := streamingRelay(t, dbURL, pool, "signing:\n  secrets: ["+old+"]\n"+endpoints)
	send := func(n int) signedRequest {
		_, err := pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint) VALUES ('p')`)
		require.NoError(t, err)
		return rc.last(t, n)
	}
	verify := func(r signedRequest, secret string) error {
		return outbox.Verify([]string{secret}, r.header, r.body, time.Now())
	}
	rewrite := func(signing string) {
		body, err := os.ReadFile(cfg)
		require.NoError(t, err)
		head, _, _ := strings.Cut(string(body), "signing:")
		require.NoError(t, os.WriteFile(cfg, []byte(head+signing+endpoints), 0o600))
	}
	reloads := 0
	hup := func() {
		reloads++
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
		waitForT(t, 10*time.Second, "the reload", func() bool { return strings.Count(p.out.String(), "configuration reloaded") >= reloads })
	}

	r := send(1)
	require.NoError(t, verify(r, old))
	require.Len(t, strings.Fields(r.header.Get("webhook-signature")), 1)

	rewrite("signing:\n  secrets: [" + cur + ", " + old + "]\n")
	hup()
	r = send(2)
	require.Len(t, strings.Fields(r.header.Get("webhook-signature")), 2, "during the overlap both secrets sign")
	require.NoError(t, verify(r, cur))
	require.NoError(t, verify(r, old))

	rewrite("signing:\n  secrets: [" + cur + "]\n")
	hup()
	r = send(3)
	require.NoError(t, verify(r, cur))
	require.Error(t, verify(r, old), "the old secret is gone")

	// A mounted secret rotated in place: no signal needed.
	file := filepath.Join(t.TempDir(), "signing")
	require.NoError(t, os.WriteFile(file, []byte(cur+"\n"), 0o600))
	rewrite("signing:\n  secrets_file: " + file + "\n")
	hup()
	// The watcher first notices the file the reload added (and reloads
	// it as it is); only a change after that is the rotation.
	changes := func() int { return strings.Count(p.out.String(), "a secrets file changed") }
	waitForT(t, 10*time.Second, "the watcher to take up the new file", func() bool { return changes() >= 1 })
	next := outbox.NewSecret()
	require.NoError(t, os.WriteFile(file, []byte("# rotated\n"+next+"\n"), 0o600))
	waitForT(t, 10*time.Second, "the file to be reloaded", func() bool { return changes() >= 2 })
	r = send(4)
	require.NoError(t, verify(r, next))
	require.Error(t, verify(r, cur))

	out := p.out.String()
	for _, s := range []string{old, cur, next} {
		require.NotContains(t, out, strings.TrimPrefix(s, "whsec_"), "secrets never reach the log")
	}
}

// TestLogsCarryNoClickIDsOrPayouts runs postbox at debug level through
// deliveries, retries, errors, a template error and dead letters, with
// payloads and URLs full of a click id and a payout, and greps the log.
func TestLogsCarryNoClickIDsOrPayouts(t *testing.T) {
	t.Parallel()
	const clickID, payout = "CLK-Z9Q4T7", "4711.93"
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	calls := 0
	var mu sync.Mutex
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n%2 == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "error for click "+r.URL.Query().Get("cid")+" payout "+r.URL.Query().Get("amt"))
			return
		}
		_, _ = io.WriteString(w, "success=true")
	}))
	defer rc.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := closed.Addr().String()
	closed.Close()
	cfg := writeConfig(t, dbURL, `endpoints:
  aff:
    url: "`+rc.URL+`/pb?cid={payload.click_id}&amt={payload.payout}"
    max_attempts: 2
  down:
    url: "http://`+deadAddr+`/pb?cid={payload.click_id}&amt={payload.payout}"
    max_attempts: 2
  strict:
    url: "`+rc.URL+`/pb?cid={payload.missing}"
`)
	p := startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	payload := `{"click_id":"` + clickID + `","payout":"` + payout + `"}`
	_, err = pool.Exec(context.Background(), `INSERT INTO postbox.outbox (endpoint, payload, url) VALUES
		('aff', $1, NULL), ('aff', $1, NULL), ('down', $1, NULL), ('strict', $1, NULL),
		('nobody', $1, NULL), ('row', $1, $2)`,
		payload, "http://"+deadAddr+"/x?click="+clickID+"&p="+payout)
	require.NoError(t, err)
	waitForT(t, 60*time.Second, "every event settled", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status IN ('delivered', 'dead_letter')`) == 6
	})
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	log := p.out.String()
	require.Contains(t, log, `"level":"debug"`, "the log ran at debug level")
	require.Contains(t, log, "dead letter")
	require.NotContains(t, log, clickID)
	require.NotContains(t, log, payout)
}
