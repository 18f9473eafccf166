package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// EnvUpdateScreenshots, set to 1, makes the browser test save a
// screenshot of each page under docs/console/.
const EnvUpdateScreenshots = "POSTBOX_UPDATE_SCREENSHOTS"

// screenshotDir is docs/console/ from this package's directory.
var screenshotDir = filepath.Join("..", "..", "..", "docs", "console")

// Screenshots are this wide and at most this tall.
const (
	screenshotWidth     = 1280
	screenshotMaxHeight = 1400
)

// chromiumPath finds a Chromium (Debian's chromium, or another Chrome).
// Without one the browser tests skip, unless CI is set: there they must
// run, and a missing browser fails them.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium binary found and CI is set: the console's browser tests must run in CI (apt-get install -y chromium)")
	}
	t.Skip("no chromium binary found: skipping the console's browser tests (apt-get install -y chromium to run them)")
	return ""
}

// receiver counts requests per webhook-id and answers with answer(n) for
// the n-th request (from 1).
type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	ids []string
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rc.mu.Lock()
		rc.ids = append(rc.ids, r.Header.Get(outbox.HeaderID))
		n := len(rc.ids)
		rc.mu.Unlock()
		w.WriteHeader(answer(n))
	}))
	t.Cleanup(rc.Close)
	return rc
}

// received counts the requests that carried webhook-id id.
func (rc *receiver) received(id string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, got := range rc.ids {
		if got == id {
			n++
		}
	}
	return n
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// browserBundle is a relay with its console, the database it runs on, and
// a headless Chromium that collects every console message of its pages.
type browserBundle struct {
	pool *pgxpool.Pool
	base string
	ctx  context.Context
	mu   sync.Mutex
	msgs []string // console errors, warnings and exceptions, with their page
	// expected are the messages of answers a test expected (a form sent
	// back with its errors: Chromium logs every status >= 400).
	expected []string
}

// TestConsoleInBrowser drives every page in Chromium against a running
// relay: each loads without a console message, shows what the database
// holds, the search finds an event by a payload key, the timeline lists
// its attempts, the replay button re-delivers a dead letter with the same
// webhook-id, and pause and resume reach the database.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)

	shop := newReceiver(t, func(int) int { return http.StatusOK })
	crm := newReceiver(t, func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	var legacyFixed atomic.Bool
	legacy := newReceiver(t, func(int) int {
		if legacyFixed.Load() {
			return http.StatusOK
		}
		return http.StatusUnauthorized
	})

	f := config.Default()
	f.DatabaseURL = dbURL
	f.Slot, f.Publication = pgtest.UniqueName("slot"), pgtest.UniqueName("pub")
	f.AllowPrivateTargets = true
	f.AdminListen = "127.0.0.1:0"
	f.AdminToken = token
	f.SearchKeys = []string{"click_id"}
	f.Signing.Secrets = []string{outbox.NewSecret()}
	f.ShutdownGrace = config.Duration(3 * time.Second)
	f.Lease = config.Duration(3 * time.Second)
	base := config.Duration(50 * time.Millisecond)
	f.Defaults.BackoffBase = &base
	f.Endpoints = map[string]config.EndpointConfig{
		"shop":   {URL: ptr(shop.URL + "/hooks/orders")},
		"crm":    {URL: ptr(crm.URL + "/webhooks")},
		"legacy": {URL: ptr(legacy.URL + "/v1/callback")},
	}
	cfg, err := f.Resolve()
	require.NoError(t, err)
	r, err := relay.New(cfg, relay.Options{Logger: zerolog.Nop()})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = r.Stop(stopCtx)
	})
	waitUntil(t, 30*time.Second, "the relay streaming", r.Streaming)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// A day of history for two endpoints, so the charts have a shape, then
	// the events this test follows, written by an application transaction.
	seedHistory(t, pool, 20000, []string{"shop", "crm"}, 24*time.Hour, 199, 307)
	ids := map[string]string{}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, e := range []struct{ key, endpoint, click string }{
			{"shop", "shop", "clk_7Hq2"}, {"crm", "crm", "clk_9Zk4"}, {"legacy", "legacy", "clk_3Lm8"}, {"ghost", "ghost", "clk_0Xx1"},
		} {
			id, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: e.endpoint, Type: "order.created",
				Payload: []byte(fmt.Sprintf(`{"order_id": 42, "click_id": %q, "payout": "12.50"}`, e.click))})
			if err != nil {
				return err
			}
			ids[e.key] = id
		}
		return nil
	}))
	latest := func(id string) string {
		var s string
		_ = pool.QueryRow(ctx, `SELECT d.status FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
			WHERE e.event_id = $1 ORDER BY d.id DESC LIMIT 1`, id).Scan(&s)
		return s
	}
	waitUntil(t, 30*time.Second, "the test's events settled", func() bool {
		return latest(ids["shop"]) == "delivered" && latest(ids["crm"]) == "delivered" &&
			latest(ids["legacy"]) == "dead_letter" && latest(ids["ghost"]) == "dead_letter"
	})
	// What the relay's maintenance does every minute. The endpoints page
	// shows the refresh's count of the day's attempts, which the seeded
	// history leaves one by one as the day moves on.
	var dayAtRefresh int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM postbox.all_attempts WHERE endpoint = 'shop' AND started_at >= now() - interval '24 hours'`).Scan(&dayAtRefresh))
	require.NoError(t, telemetry.RefreshPercentiles(ctx, pool))

	b := newBrowser(t, chromium, pool, "http://"+r.AdminAddr())
	count := func(sql string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}

	t.Run("overview", func(t *testing.T) {
		// The hour's window moves while the page loads: its count lies
		// between the counts before and after.
		hour := `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered' AND delivered_at >= now() - interval '1 hour'`
		before := count(hour)
		b.visit(t, "/", "overview")
		after := count(hour)
		shown, err := strconv.Atoi(strings.ReplaceAll(b.text(t, "#t-delivered"), ",", ""))
		require.NoError(t, err)
		require.True(t, shown <= max(before, after) && shown >= min(before, after), "delivered in the hour: %d, the database %d to %d", shown, before, after)
		require.Equal(t, strconv.Itoa(count(`SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter'`)), b.text(t, "#t-dead"))
		require.Equal(t, strconv.Itoa(count(`SELECT count(*) FROM postbox.deliveries WHERE status = 'failed'`)), b.text(t, "#t-retry"))
		require.Equal(t, 60, b.count(t, "svg.chart g.pt"), "a bar per minute of the hour")
		require.Contains(t, b.text(t, "main"), "dead letters rising")
	})
	t.Run("endpoints", func(t *testing.T) {
		day := `SELECT count(*) FROM postbox.all_attempts WHERE endpoint = 'shop' AND started_at >= now() - interval '24 hours'`
		b.visit(t, "/endpoints", "endpoints")
		for _, ep := range []string{"shop", "crm", "legacy", "ghost"} {
			require.Equal(t, 1, b.count(t, `tr[data-endpoint="`+ep+`"]`), ep)
		}
		after := count(day)
		shown, err := strconv.Atoi(strings.ReplaceAll(b.text(t, `tr[data-endpoint="shop"] td.samples`), ",", ""))
		require.NoError(t, err)
		require.True(t, shown >= after && shown <= dayAtRefresh, "attempts in the day: %d, the database %d at the refresh, %d now", shown, dayAtRefresh, after)
		require.Equal(t, strconv.Itoa(count(`SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'crm' AND status = 'dead_letter'`)),
			b.text(t, `tr[data-endpoint="crm"] td.dead`))
	})
	t.Run("endpoint", func(t *testing.T) {
		b.visit(t, "/endpoints/crm", "")
		for _, p := range []string{"c-p50", "c-p95", "c-p99"} {
			require.Positive(t, b.count(t, "svg.chart .line."+p), "%s drawn", p)
		}
		require.Equal(t, min(100, count(`SELECT count(*) FROM postbox.all_attempts WHERE endpoint = 'crm'`)), b.count(t, "tr.attempt"))
	})
	t.Run("search", func(t *testing.T) {
		b.visit(t, "/events", "")
		require.NoError(t, chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.CSS(`input[name="payload"]`), "click_id=clk_3Lm8")))
		b.submit(t, chromedp.Submit(chromedp.CSS(`input[name="payload"]`)))
		loc, err := chromedp.Run(b.ctx, chromedp.Location())
		require.NoError(t, err)
		require.Contains(t, loc, "payload=click_id%3Dclk_3Lm8")
		require.Equal(t, 1, b.count(t, "tr[data-event]"), "one event carries that click id")
		require.Equal(t, 1, b.count(t, `tr[data-event="`+ids["legacy"]+`"]`))
		b.screenshot(t, "events")
	})
	t.Run("timeline", func(t *testing.T) {
		b.visit(t, "/events/"+ids["crm"], "")
		attempts := count(`SELECT count(*) FROM postbox.all_attempts a JOIN postbox.deliveries d ON d.id = a.delivery_id
			JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, ids["crm"])
		require.Equal(t, 3, attempts)
		main := b.text(t, "main")
		for i := 1; i <= attempts; i++ {
			require.Contains(t, main, fmt.Sprintf("Attempt %d → HTTP", i))
		}
		require.Contains(t, main, "Delivered")
	})
	t.Run("replay", func(t *testing.T) {
		b.visit(t, "/dead-letters", "")
		require.Equal(t, 0, b.count(t, `tr[data-event="`+ids["legacy"]+`"] button`), "no replay button before signing in")
		b.visit(t, "/login?next=%2Fdead-letters", "")
		require.NoError(t, chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token)))
		b.submit(t, chromedp.Submit(chromedp.CSS(`input[name="token"]`)))
		require.Contains(t, b.text(t, ".banner.ok"), "Signed in.")
		b.visit(t, "/dead-letters", "dead-letters")
		require.Equal(t, 1, b.count(t, `tr[data-event="`+ids["legacy"]+`"] button`), "a replay button once signed in")
		legacyFixed.Store(true) // the partner's credentials are fixed
		b.submit(t, chromedp.Click(chromedp.CSS(`tr[data-event="`+ids["legacy"]+`"] button`)))
		require.Contains(t, b.text(t, ".banner.ok"), "Enqueued 1 event for delivery")
		waitUntil(t, 30*time.Second, "the replay delivered", func() bool { return latest(ids["legacy"]) == "delivered" })
		require.Equal(t, 2, legacy.received(ids["legacy"]), "the receiver got the event twice, with the same webhook-id")

		b.visit(t, "/events/"+ids["legacy"], "event")
		require.Equal(t, 2, b.count(t, "section.delivery"))
		require.Equal(t, 1, b.count(t, `section.delivery[data-status="replayed"]`))
		require.Contains(t, b.text(t, "main"), "Queued again by a replay")
	})
	t.Run("pause and resume", func(t *testing.T) {
		pausedUntil := func() *time.Time {
			var at *time.Time
			_ = pool.QueryRow(ctx, `SELECT paused_until FROM postbox.endpoint_health WHERE endpoint = 'crm' AND paused_until > now()`).Scan(&at)
			return at
		}
		b.visit(t, "/endpoints/crm", "endpoint")
		require.NoError(t, chromedp.Do(b.ctx, chromedp.SetValue(chromedp.CSS(`select[name="for"]`), "4h")))
		b.submit(t, chromedp.Click(chromedp.CSS(`form[action$="/pause"] button`)))
		require.Contains(t, b.text(t, ".banner.ok"), "Paused")
		require.Contains(t, b.text(t, ".head"), "paused until")
		at := pausedUntil()
		require.NotNil(t, at, "the pause is in the database")
		require.WithinDuration(t, time.Now().Add(4*time.Hour), *at, time.Minute)
		b.submit(t, chromedp.Click(chromedp.CSS(`form[action$="/resume"] button`)))
		require.Contains(t, b.text(t, ".banner.ok"), "Resumed")
		require.Nil(t, pausedUntil())
		require.Equal(t, 1, b.count(t, `form[action$="/pause"]`))
	})
	b.noConsoleMessages(t)
}

func newBrowser(t *testing.T, chromium string, pool *pgxpool.Pool, base string) *browserBundle {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.WindowSize(screenshotWidth, 900),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("disable-gpu", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &browserBundle{pool: pool, base: base, ctx: ctx}
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	var collected sync.WaitGroup
	msgs := chromedp.Console(ctx)
	collected.Go(func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				b.mu.Lock()
				b.msgs = append(b.msgs, fmt.Sprintf("%s (%s)", m, m.URL))
				b.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
		collected.Wait()
	})
	return b
}

// visit loads path, checks it answered 200, and saves a screenshot as
// shot (when not empty and screenshots are asked for).
func (b *browserBundle) visit(t *testing.T, path, shot string) {
	t.Helper()
	resp, err := chromedp.Run(b.ctx, chromedp.NavigateResponse(b.base+path))
	require.NoError(t, err, path)
	require.EqualValues(t, http.StatusOK, resp.Status, path)
	if shot != "" {
		b.screenshot(t, shot)
	}
}

// submit runs an action that sends a form and waits for the page it
// leads to, which must answer 200.
func (b *browserBundle) submit(t *testing.T, action chromedp.Action[chromedp.Void]) {
	t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, action)
	require.NoError(t, err)
	require.EqualValues(t, http.StatusOK, resp.Status, resp.URL)
}

func (b *browserBundle) text(t *testing.T, css string) string {
	t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(css)))
	require.NoError(t, err, css)
	return strings.TrimSpace(s)
}

func (b *browserBundle) count(t *testing.T, css string) int {
	t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, css)))
	require.NoError(t, err, css)
	return n
}

func (b *browserBundle) screenshot(t *testing.T, name string) {
	t.Helper()
	if os.Getenv(EnvUpdateScreenshots) != "1" {
		return
	}
	// The whole page, up to screenshotMaxHeight (long lists are cut).
	h, err := chromedp.Run(b.ctx, chromedp.Evaluate[int64](`Math.ceil(document.body.getBoundingClientRect().height)`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b.ctx, chromedp.EmulateViewport(screenshotWidth, min(h, screenshotMaxHeight))))
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b.ctx, chromedp.EmulateReset()))
	require.NoError(t, os.MkdirAll(screenshotDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(screenshotDir, name+".png"), png, 0o644))
}

// noConsoleMessages fails on any console error, warning or uncaught
// exception of any page the test loaded (a blank page first, so that the
// messages of the last one are in).
func (b *browserBundle) noConsoleMessages(t *testing.T) {
	t.Helper()
	require.NoError(t, chromedp.Do(b.ctx, chromedp.Navigate("about:blank")))
	b.mu.Lock()
	defer b.mu.Unlock()
	var msgs []string
	for _, m := range b.msgs {
		if !slices.Contains(b.expected, m) {
			msgs = append(msgs, m)
		}
	}
	require.Empty(t, msgs, "the pages wrote to the browser console")
}

// TestEndpointFormInBrowser drives the endpoint form in Chromium: create,
// invalid input shown on the form (nothing written), edit, disable; after
// each, the row of postbox.endpoints and the change log, which names the
// console session.
func TestEndpointFormInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	tb := setup(t, setupOpts{token: token})
	b := newBrowser(t, chromium, tb.pool, tb.server.URL)

	b.visit(t, "/login?next=%2Fendpoints", "")
	require.NoError(t, chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token)))
	b.submit(t, chromedp.Submit(chromedp.CSS(`input[name="token"]`)))
	require.Contains(t, b.text(t, ".banner.ok"), "Signed in.")
	require.Equal(t, 1, b.count(t, `tr[data-endpoint="shop"]`), "the file's endpoint is listed without deliveries")
	require.Equal(t, "file", b.text(t, `tr[data-endpoint="shop"] td.source`))

	// fill sets the form's fields by column.
	fill := func(t *testing.T, kv ...string) {
		t.Helper()
		for i := 0; i+1 < len(kv); i += 2 {
			set := chromedp.SetValue(chromedp.CSS(`#f-`+kv[i]), kv[i+1])
			if kv[i+1] == "" {
				set = chromedp.Clear(chromedp.CSS(`#f-` + kv[i]))
			}
			require.NoError(t, chromedp.Do(b.ctx, set), kv[i])
		}
	}
	save := `form.epform button[type="submit"]`

	t.Run("create", func(t *testing.T) {
		b.submit(t, chromedp.Click(chromedp.CSS(`a[href="/new-endpoint"]`)))
		fill(t, "name", "aff-7", "url", "https://pb.example/cb?click={payload.click_id}", "headers", "X-Api-Key: k-secret-1",
			"event_types", "conversion.*, signup", "timeout", "5s")
		b.submit(t, chromedp.Click(chromedp.CSS(save)))
		require.Contains(t, b.text(t, ".banner.ok"), "Created")
		row := tb.endpointRow(t, "aff-7")
		require.NotNil(t, row)
		require.Equal(t, "https://pb.example/cb?click={payload.click_id}", *row.URL)
		require.Equal(t, "00:00:05", *row.Timeout)
		require.JSONEq(t, `{"X-Api-Key": "k-secret-1"}`, *row.Headers)
		require.True(t, row.Enabled)
		ch := tb.changes(t, "aff-7")
		require.Len(t, ch, 1)
		require.Equal(t, "insert", ch[0].Op)
		require.Regexp(t, actorRe, ch[0].Actor)
		require.Equal(t, ch[0].Actor, b.text(t, `tr.change td.actor`), "the page shows the change and who made it")
		require.NotContains(t, b.text(t, "main"), "k-secret-1", "header values are never shown")
	})
	t.Run("invalid input shown", func(t *testing.T) {
		b.visit(t, "/new-endpoint", "")
		fill(t, "name", "aff-8", "url", "https://pb.example/cb?x={nope}")
		b.submitStatus(t, chromedp.Click(chromedp.CSS(save)), http.StatusUnprocessableEntity)
		require.Contains(t, b.text(t, `.field[data-field="url"] .error`), "Unknown macro {nope}")
		require.Equal(t, 1, b.count(t, `.field.invalid`), "only the url is marked")
		url, err := chromedp.Run(b.ctx, chromedp.Value(chromedp.CSS(`#f-url`)))
		require.NoError(t, err)
		require.Equal(t, "https://pb.example/cb?x={nope}", url, "the form keeps what was typed")

		fill(t, "url", "https://pb.example/cb", "headers", "Webhook-Signature: v1,forged")
		b.submitStatus(t, chromedp.Click(chromedp.CSS(save)), http.StatusUnprocessableEntity)
		require.Contains(t, b.text(t, `.field[data-field="headers"] .error`), "Webhook-Signature is set by postbox")
		b.screenshot(t, "endpoint-form")

		fill(t, "headers", "", "timeout", "-5s")
		b.submitStatus(t, chromedp.Click(chromedp.CSS(save)), http.StatusUnprocessableEntity)
		require.Contains(t, b.text(t, `.field[data-field="timeout"] .error`), "Must be positive.")
		require.Nil(t, tb.endpointRow(t, "aff-8"), "nothing written")
		require.Empty(t, tb.changes(t, "aff-8"))
	})
	t.Run("edit", func(t *testing.T) {
		b.visit(t, "/endpoints/aff-7", "")
		headers, err := chromedp.Run(b.ctx, chromedp.Value(chromedp.CSS(`#f-headers`)))
		require.NoError(t, err)
		require.Equal(t, "X-Api-Key: ***", strings.TrimSpace(headers), "the form shows header names, not values")
		fill(t, "url", "https://pb2.example/cb?click={payload.click_id}")
		b.submit(t, chromedp.Click(chromedp.CSS(save)))
		require.Contains(t, b.text(t, ".banner.ok"), "Saved")
		row := tb.endpointRow(t, "aff-7")
		require.Equal(t, "https://pb2.example/cb?click={payload.click_id}", *row.URL)
		require.JSONEq(t, `{"X-Api-Key": "k-secret-1"}`, *row.Headers, "*** kept the stored value")
		ch := tb.changes(t, "aff-7")
		require.Len(t, ch, 2)
		require.Equal(t, "update", ch[1].Op)
		require.Equal(t, ch[0].Actor, ch[1].Actor)
		require.Equal(t, "url", b.text(t, `tr.change[data-op="update"] td.keys`), "the change log names the key changed")
	})
	t.Run("disable", func(t *testing.T) {
		b.submit(t, chromedp.Click(chromedp.CSS(`form[action$="/disable"] button`)))
		require.Contains(t, b.text(t, ".banner.ok"), "Disabled")
		require.Contains(t, b.text(t, ".head .title"), "disabled")
		require.False(t, tb.endpointRow(t, "aff-7").Enabled)
		ch := tb.changes(t, "aff-7")
		require.Len(t, ch, 3)
		require.Equal(t, "update", ch[2].Op)
		require.Equal(t, ch[0].Actor, ch[2].Actor)
		require.Equal(t, 1, b.count(t, `form[action$="/enable"]`))
		b.visit(t, "/endpoints", "")
		require.Equal(t, "disabled", b.text(t, `tr[data-endpoint="aff-7"] td.state`))
		require.Equal(t, "table", b.text(t, `tr[data-endpoint="aff-7"] td.source`))
	})
	b.noConsoleMessages(t)
}

// submitStatus is submit for a page that answers status.
func (b *browserBundle) submitStatus(t *testing.T, action chromedp.Action[chromedp.Void], status int) {
	t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, action)
	require.NoError(t, err)
	require.EqualValues(t, status, resp.Status, resp.URL)
	b.mu.Lock()
	b.expected = append(b.expected, fmt.Sprintf("error: Failed to load resource: the server responded with a status of %d (%s) (%s)",
		status, http.StatusText(status), resp.URL))
	b.mu.Unlock()
}
