package portal_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
)

// EnvUpdateScreenshots, set to 1, saves the portal's screenshots under
// docs/portal/.
const EnvUpdateScreenshots = "POSTBOX_UPDATE_SCREENSHOTS"

var screenshotDir = filepath.Join("..", "..", "..", "docs", "portal")

const (
	screenshotWidth     = 1280
	screenshotMaxHeight = 1200
)

// chromiumPath finds a Chromium; without one the test skips, unless CI
// is set.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium binary found and CI is set (apt-get install -y chromium)")
	}
	t.Skip("no chromium binary found: skipping the portal's browser test (apt-get install -y chromium)")
	return ""
}

// partnerReceiver counts requests per webhook-id; it refuses bodies that
// name a click id in refuse until fixed.
type partnerReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	ids      []string
	accepted map[string]bool // webhook-ids answered 200
	refuse   string
}

func newPartner(t *testing.T, refuse string) *partnerReceiver {
	rc := &partnerReceiver{refuse: refuse, accepted: map[string]bool{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.ids = append(rc.ids, r.Header.Get(outbox.HeaderID))
		refuse := rc.refuse != "" && bytes.Contains(body, []byte(rc.refuse))
		rc.mu.Unlock()
		if refuse {
			w.WriteHeader(http.StatusGone)
			_, _ = w.Write([]byte(`{"error":"unknown click"}`))
			return
		}
		rc.mu.Lock()
		rc.accepted[r.Header.Get(outbox.HeaderID)] = true
		rc.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *partnerReceiver) fix() {
	rc.mu.Lock()
	rc.refuse = ""
	rc.mu.Unlock()
}

func (rc *partnerReceiver) received(id string) int {
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

// browser is one partner's Chromium: its own process, so its own cookies.
type browser struct {
	base     string
	ctx      context.Context
	mu       sync.Mutex
	msgs     []string
	expected []string
}

func newBrowser(t *testing.T, chromium, base string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		chromedp.WindowSize(screenshotWidth, 900), chromedp.Flag("hide-scrollbars", true), chromedp.Flag("disable-gpu", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &browser{base: base, ctx: ctx}
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

// visit loads path and checks the final answer's status (an expected
// error status is not a console message of the test's concern).
func (b *browser) visit(t *testing.T, path string, status int) {
	t.Helper()
	resp, err := chromedp.Run(b.ctx, chromedp.NavigateResponse(b.base+path))
	require.NoError(t, err, path)
	require.EqualValues(t, status, resp.Status, path)
	if status >= 400 {
		b.mu.Lock()
		b.expected = append(b.expected, fmt.Sprintf("error: Failed to load resource: the server responded with a status of %d (%s) (%s)",
			status, http.StatusText(status), resp.URL))
		b.mu.Unlock()
	}
}

func (b *browser) submit(t *testing.T, action chromedp.Action[chromedp.Void]) {
	t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, action)
	require.NoError(t, err)
	require.EqualValues(t, http.StatusOK, resp.Status, resp.URL)
}

func (b *browser) location(t *testing.T) string {
	t.Helper()
	loc, err := chromedp.Run(b.ctx, chromedp.Location())
	require.NoError(t, err)
	return loc
}

func (b *browser) text(t *testing.T, css string) string {
	t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(css)))
	require.NoError(t, err, css)
	return strings.TrimSpace(s)
}

func (b *browser) count(t *testing.T, css string) int {
	t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, css)))
	require.NoError(t, err, css)
	return n
}

func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	if os.Getenv(EnvUpdateScreenshots) != "1" {
		return
	}
	h, err := chromedp.Run(b.ctx, chromedp.Evaluate[int64](`Math.ceil(document.body.getBoundingClientRect().height)`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b.ctx, chromedp.EmulateViewport(screenshotWidth, min(h, screenshotMaxHeight))))
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b.ctx, chromedp.EmulateReset()))
	require.NoError(t, os.MkdirAll(screenshotDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(screenshotDir, name+".png"), png, 0o644))
}

func (b *browser) noConsoleMessages(t *testing.T) {
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

// TestPortalInBrowser: two partners, each in its own Chromium, against a
// running relay: a link opens the portal (and leaves the address bar
// without its token), the search finds a click id, the timeline shows the
// attempts and the partner resends its dead letter, the other partner's
// event and the console stay out of reach, and a revoke closes it.
func TestPortalInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	alpha := newPartner(t, "clk_A_dead")
	beta := newPartner(t, "")

	f := config.Default()
	f.DatabaseURL = dbURL
	f.Slot, f.Publication = pgtest.UniqueName("slot"), pgtest.UniqueName("pub")
	f.AllowPrivateTargets = true
	f.AdminListen = "127.0.0.1:0"
	f.PortalListen = "127.0.0.1:0"
	f.AdminToken = adminToken
	// Loopback reads the console without a token otherwise, portal
	// session or not: a host that publishes the portal asks for it.
	f.AdminTokenOnLoopback = true
	f.SearchKeys = []string{"click_id"}
	f.ReportSum = []string{"payout"}
	f.Signing.Secrets = []string{outbox.NewSecret()}
	f.Signing.PerEndpoint = config.PerEndpointDerived
	f.Portal = config.PortalConfig{AllowReplay: true, ShowResponse: true}
	f.ShutdownGrace = config.Duration(3 * time.Second)
	base := config.Duration(50 * time.Millisecond)
	two := 2
	f.Defaults.BackoffBase = &base
	f.Defaults.MaxAttempts = &two
	ua, ub := alpha.URL+"/postback?src=pb", beta.URL+"/hooks"
	f.Endpoints = map[string]config.EndpointConfig{"alpha": {URL: &ua}, "beta": {URL: &ub}}
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

	ids := map[string]string{}
	types := map[string]string{} // event id → type
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, e := range []struct{ endpoint, click, typ string }{
			{"alpha", "clk_A1", "click"}, {"alpha", "clk_A2", "registration"}, {"alpha", "clk_A_dead", "ftd"}, {"alpha", "clk_A3", "ftd"},
			{"beta", "clk_B1", "click"}, {"beta", "clk_B2", "ftd"},
		} {
			id, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: e.endpoint, Type: e.typ,
				Payload: []byte(fmt.Sprintf(`{"click_id": %q, "payout": %d}`, e.click, 10*(i+1)))})
			if err != nil {
				return err
			}
			ids[e.click] = id
			types[id] = e.typ
		}
		return nil
	}))
	settled := func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE status IN ('delivered', 'dead_letter')`).Scan(&n)
		return n == 6
	}
	waitUntil(t, 30*time.Second, "the deliveries settled", settled)

	link := func(endpoint string) string {
		l, err := relay.NewPortalLink(ctx, pool, cfg, endpoint, time.Hour)
		require.NoError(t, err)
		return strings.TrimPrefix(l.URL, "http://"+cfg.AdminListen)
	}
	addr := "http://" + r.AdminAddr()
	a := newBrowser(t, chromium, addr)
	b := newBrowser(t, chromium, addr)

	t.Run("link opens the portal", func(t *testing.T) {
		a.visit(t, link("alpha"), http.StatusOK)
		require.Equal(t, addr+"/portal/", a.location(t), "the address bar holds no token")
		require.Equal(t, 4, a.count(t, "tr[data-event]"))
		require.Equal(t, "alpha", a.text(t, ".brand"))
		a.screenshot(t, "deliveries")
	})
	t.Run("search by click id", func(t *testing.T) {
		require.NoError(t, chromedp.Do(a.ctx, chromedp.SendKeys(chromedp.CSS(`input[name="value"]`), "clk_A2")))
		a.submit(t, chromedp.Submit(chromedp.CSS(`input[name="value"]`)))
		require.Equal(t, 1, a.count(t, "tr[data-event]"))
		require.Equal(t, 1, a.count(t, `tr[data-event="`+ids["clk_A2"]+`"]`))
	})
	t.Run("timeline and resend", func(t *testing.T) {
		a.visit(t, "/portal/events/"+ids["clk_A_dead"], http.StatusOK)
		main := a.text(t, "main")
		require.Contains(t, main, "Attempt 1 → HTTP 410")
		require.Contains(t, main, "/postback?src=pb", "the target as sent, query included")
		require.Contains(t, main, "unknown click", "the partner's own response (show_response)")
		alpha.fix()
		a.submit(t, chromedp.Click(chromedp.CSS(`form[action="/portal/replay"] button`)))
		require.Contains(t, a.text(t, ".banner.ok"), "Sent again")
		require.Contains(t, a.text(t, "main"), "replayed by partner")
		waitUntil(t, 30*time.Second, "the resend delivered", func() bool { return alpha.received(ids["clk_A_dead"]) == 2 })
		// Arrived is not yet recorded: the recorder writes its batch a
		// moment later.
		waitUntil(t, 30*time.Second, "the resend recorded", func() bool {
			var n int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
				WHERE e.event_id = $1 AND d.status = 'delivered'`, ids["clk_A_dead"]).Scan(&n)
			return n == 1
		})
		a.visit(t, "/portal/events/"+ids["clk_A_dead"], http.StatusOK)
		require.Equal(t, 1, a.count(t, `section.delivery[data-by="partner"][data-status="delivered"]`))
		require.Contains(t, a.text(t, `section.delivery[data-by="partner"]`), "Attempt 1 → HTTP 200", "a first attempt kept on its delivery's row")
		a.screenshot(t, "event")
	})
	t.Run("health", func(t *testing.T) {
		a.visit(t, "/portal/health", http.StatusOK)
		require.NotEqual(t, "–", a.text(t, "#rate"))
		a.screenshot(t, "health")
	})
	t.Run("report equals what the receiver counted", func(t *testing.T) {
		a.visit(t, "/portal/report", http.StatusOK)
		alpha.mu.Lock()
		got := map[string]int{}
		for id := range alpha.accepted {
			got[types[id]]++
		}
		alpha.mu.Unlock()
		day := time.Now().UTC().Format("2006-01-02")
		for _, typ := range []string{"click", "registration", "ftd"} {
			row := `tr[data-day="` + day + `"][data-type="` + typ + `"]`
			require.Equal(t, fmt.Sprint(got[typ]), a.text(t, row+" td.delivered"), typ)
			require.Equal(t, "0", a.text(t, row+" td.dead"), typ)
		}
		require.Equal(t, "4", a.text(t, "#totals th:nth-child(2)"), "committed in all")
		require.Equal(t, "100", a.text(t, "#totals th:nth-child(6)"), "the payouts of alpha's events: 10+20+30+40")
		a.screenshot(t, "report")
	})
	t.Run("the other partner and the console are out of reach", func(t *testing.T) {
		a.visit(t, "/portal/events/"+ids["clk_B1"], http.StatusNotFound)
		require.NotContains(t, a.text(t, "main"), "clk_B1")
		a.visit(t, "/portal/?key=click_id&value=clk_B2", http.StatusOK)
		require.Equal(t, 0, a.count(t, "tr[data-event]"))
		a.visit(t, "/endpoints/beta", http.StatusOK) // the console's sign-in form, after a redirect
		require.NotContains(t, a.text(t, "main"), "clk_B")
		require.True(t, strings.HasPrefix(a.location(t), addr+"/login"), a.location(t))

		b.visit(t, link("beta"), http.StatusOK)
		require.Equal(t, 2, b.count(t, "tr[data-event]"))
		require.NotContains(t, b.text(t, "main"), "clk_A")
		require.Equal(t, "beta", b.text(t, ".brand"))
		b.visit(t, "/portal/events/"+ids["clk_A_dead"], http.StatusNotFound)
		b.visit(t, "/portal/", http.StatusOK)
		b.screenshot(t, "partner-b")
	})
	t.Run("portal_listen serves the portal alone", func(t *testing.T) {
		own := "http://" + r.PortalAddr()
		for path, want := range map[string]int{"/": http.StatusNotFound, "/metrics": http.StatusNotFound, "/endpoints": http.StatusNotFound,
			"/login": http.StatusNotFound, "/portal/": http.StatusUnauthorized, link("beta"): http.StatusSeeOther} {
			c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := c.Get(own + path)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, want, resp.StatusCode, path)
			require.NotContains(t, string(body), "Overview", path)
		}
	})
	t.Run("revoke", func(t *testing.T) {
		b.visit(t, "/portal/health", http.StatusOK)
		_, err := relay.RevokePortal(ctx, pool, "alpha")
		require.NoError(t, err)
		a.visit(t, "/portal/", http.StatusGone)
		require.Contains(t, a.text(t, "main"), "revoked")
		require.NotContains(t, a.text(t, "body"), "alpha")
		a.screenshot(t, "revoked")
		b.visit(t, "/portal/", http.StatusOK) // the other partner's session stands
	})
	a.noConsoleMessages(t)
	b.noConsoleMessages(t)
}
