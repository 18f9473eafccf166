package relay_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
)

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	return string(body)
}

// TestMetricsAndProbes: /metrics exposes the named series, and the
// endpoint label stays capped with 10,000 distinct per-row endpoints.
func TestMetricsAndProbes(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.logLevel = zerolog.InfoLevel
	rc := newIDCounter(t)
	tb.endpoint(t, "alpha", rc.URL, nil)
	tb.endpoint(t, "beta", rc.URL, nil)
	tb.endpoint(t, "gamma", rc.URL, nil)
	tb.cfg.MetricsEndpointLabels = 2
	r := tb.start(t, relay.Options{})
	base := "http://" + r.AdminAddr()

	require.Equal(t, "ok\n", scrape(t, base+"/healthz"))
	waitUntil(t, 10*time.Second, "readiness", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	tb.insert(t, outbox.Event{Endpoint: "alpha"}, outbox.Event{Endpoint: "beta"}, outbox.Event{Endpoint: "gamma"})
	_, err := tb.pool.Exec(context.Background(), `
		INSERT INTO postbox.outbox (endpoint, url) SELECT 'row-' || i, $1 FROM generate_series(1, 10000) i`, rc.URL)
	require.NoError(t, err)
	tb.waitSettled(t, 10003, 3*time.Minute)

	// A batch's counters move just after its results commit, which is what
	// waitSettled saw: wait for them too.
	delivered := regexp.MustCompile(`postbox_deliveries_total\{endpoint="other",outcome="delivered"\} 10001\b`)
	var body string
	// The gauges are set every 15 s; the breaker's appear once the
	// endpoints have health rows, which may be one round after the first.
	waitUntil(t, 40*time.Second, "the gauges and counters", func() bool {
		body = scrape(t, base+"/metrics")
		return strings.Contains(body, "postbox_queue_depth{") && strings.Contains(body, "postbox_circuit_breaker_state{") &&
			delivered.MatchString(body)
	})
	for _, name := range []string{
		"postbox_deliveries_total", "postbox_attempt_duration_seconds_bucket", "postbox_commit_to_delivery_seconds_bucket",
		"postbox_queue_depth", "postbox_oldest_pending_age_seconds", "postbox_replication_slot_lag_bytes",
		"postbox_ingested_events_total", "postbox_alert_firing", "postbox_streaming", "postbox_circuit_breaker_state",
		"postbox_walsender_nice",
	} {
		require.Contains(t, body, name, "series %s", name)
	}
	require.Regexp(t, `postbox_ingested_events_total 10003\b`, body)
	// First attempts that started from the stream time postbox's own share.
	started := regexp.MustCompile(`postbox_stream_to_attempt_seconds_count (\d+)`).FindStringSubmatch(body)
	require.NotNil(t, started, "postbox_stream_to_attempt_seconds")
	n, err := strconv.Atoi(started[1])
	require.NoError(t, err)
	require.Positive(t, n, "first attempts timed from the stream")
	require.Regexp(t, `postbox_commit_to_stream_seconds_count 2\b`, body, "the two transactions timed from their commit")
	require.Regexp(t, `postbox_commit_to_send_seconds_count 2\b`, body, "and from their commit to the server's send")
	sum := func(name string) float64 {
		m := regexp.MustCompile(name + `_sum (\S+)`).FindStringSubmatch(body)
		require.NotNil(t, m, name)
		v, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		return v
	}
	// The walsender runs on this machine: its CPU is read at the scrape.
	walsenderRan := regexp.MustCompile(`(?m)^postbox_walsender_cpu_seconds_total (\S+)$`).FindStringSubmatch(body)
	require.NotNil(t, walsenderRan, "postbox_walsender_cpu_seconds_total")
	ran, err := strconv.ParseFloat(walsenderRan[1], 64)
	require.NoError(t, err)
	require.Positive(t, ran, "the walsender streamed 10,003 events")
	require.Regexp(t, `(?m)^postbox_walsender_cpu_wait_seconds_total \S+$`, body)
	sent, streamed := sum("postbox_commit_to_send_seconds"), sum("postbox_commit_to_stream_seconds")
	require.Positive(t, sent, "the server's commit time comes before its send")
	require.LessOrEqual(t, sent, streamed, "the server sent each transaction before postbox had it (one host's clock)")
	labels := map[string]bool{}
	for _, m := range regexp.MustCompile(`endpoint="([^"]+)"`).FindAllStringSubmatch(body, -1) {
		labels[m[1]] = true
	}
	require.Equal(t, map[string]bool{"alpha": true, "beta": true, "other": true}, labels,
		"the first two configured endpoints and other: %d per-row endpoints folded", 10000)

	status := scrape(t, base+"/status")
	require.Contains(t, status, `"delivered_last_hour": 10003`)
}

func TestAdminTokenRequiredOffLoopback(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.AdminListen = "0.0.0.0:0"
	require.Error(t, tb.cfg.Validate(), "no token: refused")
	tb.cfg.AdminToken = "s3cret-admin-token"
	require.NoError(t, tb.cfg.Validate())
	r := tb.start(t, relay.Options{})
	port := r.AdminAddr()[strings.LastIndex(r.AdminAddr(), ":"):]
	url := "http://127.0.0.1" + port
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer s3cret-admin-token")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(url + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "liveness needs no token")
}

// A reload that changes admin_token applies it at once: the old token
// stops working. One that changes admin_listen is refused whole.
func TestReloadedAdminTokenApplies(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.AdminToken = "first-admin-token"
	r := tb.start(t, relay.Options{})
	metrics := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+r.AdminAddr()+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, metrics("first-admin-token"))

	tb.cfg.AdminToken = "second-admin-token"
	require.NoError(t, r.Reload(tb.resolved(t)))
	require.Equal(t, http.StatusUnauthorized, metrics("first-admin-token"), "the old token no longer works")
	require.Equal(t, http.StatusOK, metrics("second-admin-token"))

	tb.cfg.AdminToken = "third-admin-token"
	tb.cfg.AdminListen = "127.0.0.1:1"
	require.ErrorContains(t, r.Reload(tb.resolved(t)), "admin_listen")
	require.Equal(t, http.StatusOK, metrics("second-admin-token"), "a refused reload changes nothing")
}
