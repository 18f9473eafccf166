package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/console"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const token = "console-token-0123456789"

// testBundle is one test's database and console.
type testBundle struct {
	pool   *pgxpool.Pool
	cfg    atomic.Pointer[config.Config]
	now    atomic.Pointer[time.Time]
	server *httptest.Server
	// connected is false to play a relay that has not reached its database.
	connected atomic.Bool
}

type setupOpts struct {
	token       string
	loopback    bool
	logPayloads bool
	// tokenOnLoopback is admin_token_on_loopback.
	tokenOnLoopback bool
	// log receives the console's log (nowhere when nil).
	log io.Writer
}

func setup(t testing.TB, o setupOpts) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	f := config.Default()
	f.AdminToken = o.token
	f.LogPayloads = o.logPayloads
	f.AdminTokenOnLoopback = o.tokenOnLoopback
	f.SearchKeys = []string{"click_id"}
	f.Endpoints = map[string]config.EndpointConfig{"shop": {URL: ptr("https://shop.example/hooks")}}
	cfg, err := f.Resolve()
	require.NoError(t, err)
	tb := &testBundle{pool: pool}
	tb.cfg.Store(cfg)
	now := time.Now()
	tb.now.Store(&now)
	tb.connected.Store(true)
	logger := zerolog.Nop()
	if o.log != nil {
		logger = zerolog.New(o.log)
	}
	c := console.New(console.Options{
		Pool: func() *pgxpool.Pool {
			if !tb.connected.Load() {
				return nil
			}
			return pool
		},
		Config: tb.cfg.Load, Loopback: o.loopback, Version: "test",
		Log: logger, Now: func() time.Time { return *tb.now.Load() },
	})
	tb.server = httptest.NewServer(c)
	t.Cleanup(tb.server.Close)
	return tb
}

func ptr[T any](v T) *T { return &v }

// deadLetter stores an event with one dead-lettered delivery and returns
// its event id.
func (tb *testBundle) deadLetter(t *testing.T, endpoint, lastError string) string {
	t.Helper()
	var id string
	require.NoError(t, tb.pool.QueryRow(context.Background(), `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at, event_type)
		  VALUES (gen_random_uuid(), $1, '{"click_id":"c-1"}', now(), now(), 'order.created') RETURNING id, event_id
		), d AS (
		  INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, last_error, last_status_code)
		  SELECT id, $1, 'dead_letter', 1, $2, 401 FROM ev
		)
		SELECT event_id::text FROM ev`, endpoint, lastError).Scan(&id))
	return id
}

// client is a browser-like client: it keeps cookies and does not follow
// redirects, so a test sees each answer.
func (tb *testBundle) client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, c *http.Client, req *http.Request) answer {
	t.Helper()
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (tb *testBundle) get(t *testing.T, c *http.Client, path string, mod ...func(*http.Request)) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, tb.server.URL+path, nil)
	require.NoError(t, err)
	for _, m := range mod {
		m(req)
	}
	return do(t, c, req)
}

// post sends a form as the console's own page would (same Origin) unless
// mod changes it.
func (tb *testBundle) post(t *testing.T, c *http.Client, path string, form url.Values, mod ...func(*http.Request)) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, tb.server.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", tb.server.URL)
	for _, m := range mod {
		m(req)
	}
	return do(t, c, req)
}

func bearer(tok string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

func header(k, v string) func(*http.Request) {
	return func(r *http.Request) {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
}

// signIn signs c in and returns the form token of its session.
func (tb *testBundle) signIn(t *testing.T, c *http.Client) string {
	t.Helper()
	a := tb.post(t, c, "/login", url.Values{"token": {token}, "next": {"/dead-letters"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/dead-letters?done=signedin", a.header.Get("Location"))
	page := tb.get(t, c, "/dead-letters")
	require.Equal(t, http.StatusOK, page.status)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page.body)
	require.NotNil(t, m, "a signed-in page carries the form token")
	return m[1]
}

func (tb *testBundle) deliveryCount(t *testing.T, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, tb.pool.QueryRow(context.Background(), `
		SELECT count(*) FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, eventID).Scan(&n))
	return n
}

func TestLoopbackReadsWithoutTokenAndCannotAct(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true})
	c := tb.client(t)
	id := tb.deadLetter(t, "shop", "http 401")
	for _, path := range []string{"/endpoints", "/dead-letters"} {
		a := tb.get(t, c, path)
		require.Equal(t, http.StatusOK, a.status, path)
		if path == "/dead-letters" {
			require.Contains(t, a.body, "Actions are disabled: set <code>admin_token</code>", "the page says how to enable actions")
		}
		require.NotContains(t, a.body, `action="/replay"`, "no action forms without a token")
		require.Equal(t, "no-store", a.header.Get("Cache-Control"))
		require.Contains(t, a.header.Get("Content-Security-Policy"), "default-src 'none'")
	}
	a := tb.post(t, c, "/replay", url.Values{"endpoint": {"shop"}, "event_id": {id}})
	require.Equal(t, http.StatusForbidden, a.status)
	require.Contains(t, a.body, "Actions are disabled")
	require.Equal(t, 1, tb.deliveryCount(t, id), "nothing replayed")
	require.Equal(t, http.StatusNotFound, tb.get(t, c, "/login").status, "no sign-in without a token")
}

// TestForeignHostIsNotLoopback: a loopback listener reached under another
// name (DNS rebinding, a proxy) is treated as off the machine.
func TestForeignHostIsNotLoopback(t *testing.T) {
	t.Parallel()
	rebind := func(r *http.Request) { r.Host = "attacker.example:80" }
	tb := setup(t, setupOpts{loopback: true})
	a := tb.get(t, tb.client(t), "/endpoints", rebind)
	require.Equal(t, http.StatusForbidden, a.status)
	require.Contains(t, a.body, "only to requests addressed to localhost")

	tb = setup(t, setupOpts{loopback: true, token: token})
	a = tb.get(t, tb.client(t), "/endpoints", rebind)
	require.Equal(t, http.StatusSeeOther, a.status)
	require.Equal(t, "/login?next=%2Fendpoints", a.header.Get("Location"))
	require.Equal(t, http.StatusOK, tb.get(t, tb.client(t), "/endpoints", rebind, bearer(token)).status)
	require.Equal(t, http.StatusOK, tb.get(t, tb.client(t), "/endpoints").status, "addressed to 127.0.0.1")
}

// TestTokenOnLoopback: with admin_token_on_loopback, a request addressed
// to localhost (a sidecar's, or one an SSRF in the application makes) reads
// no page without the token; a reload that turns it off opens them again.
func TestTokenOnLoopback(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true, token: token, tokenOnLoopback: true})
	id := tb.deadLetter(t, "shop", "http 401")
	c := tb.client(t)
	for _, path := range []string{"/", "/endpoints", "/dead-letters", "/events?payload=click_id%3Dc-1", "/events/" + id} {
		a := tb.get(t, c, path)
		require.Equal(t, http.StatusSeeOther, a.status, path)
		require.True(t, strings.HasPrefix(a.header.Get("Location"), "/login?next="), path)
		require.NotContains(t, a.body, "order.created", path)
	}
	page := tb.get(t, c, "/events/"+id, bearer(token))
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, page.body, "order.created", "what the refusals held back")
	tb.signIn(t, c)
	require.Equal(t, http.StatusOK, tb.get(t, c, "/events/"+id).status, "signed in")

	cfg := *tb.cfg.Load()
	cfg.AdminTokenOnLoopback = false
	tb.cfg.Store(&cfg)
	require.Equal(t, http.StatusOK, tb.get(t, tb.client(t), "/events/"+id).status, "loopback reads without the token again")
}

func TestOffLoopbackEveryPageNeedsTheToken(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{token: token})
	c := tb.client(t)
	for _, path := range []string{"/", "/endpoints", "/endpoints/shop", "/dead-letters", "/events", "/events/0b9c5f0e-5d3c-4e59-9f8e-2f4b8f1c6a10", "/nope"} {
		a := tb.get(t, c, path)
		require.Equal(t, http.StatusSeeOther, a.status, path)
		require.True(t, strings.HasPrefix(a.header.Get("Location"), "/login?next="), path)
	}
	require.Equal(t, http.StatusOK, tb.get(t, c, "/static/style.css").status, "the stylesheet holds no data")
	require.Equal(t, http.StatusOK, tb.get(t, c, "/login").status)
	require.Equal(t, http.StatusOK, tb.get(t, c, "/endpoints", bearer(token)).status)
	require.Equal(t, http.StatusSeeOther, tb.get(t, c, "/endpoints", bearer("wrong-token-0123456789")).status)

	// A wrong token is refused; the right one sets the session cookie.
	a := tb.post(t, c, "/login", url.Values{"token": {"wrong"}, "next": {"/endpoints"}})
	require.Equal(t, http.StatusUnauthorized, a.status)
	require.Contains(t, a.body, "That is not the admin token.")
	a = tb.post(t, c, "/login", url.Values{"token": {token}, "next": {"https://elsewhere.example/"}})
	require.Equal(t, http.StatusSeeOther, a.status)
	require.Equal(t, "/?done=signedin", a.header.Get("Location"), "sign-in never redirects off the console")
	ck := a.header.Get("Set-Cookie")
	require.Contains(t, ck, "HttpOnly")
	require.Contains(t, ck, "SameSite=Strict")
	require.NotContains(t, ck, token, "the cookie holds an HMAC, never the token")
	require.Equal(t, http.StatusOK, tb.get(t, c, "/endpoints").status)

	// A tampered cookie, an old one, or one from before the token changed
	// reads nothing.
	u, _ := url.Parse(tb.server.URL)
	cookies := c.Jar.Cookies(u)
	require.Len(t, cookies, 1)
	good := cookies[0].Value
	tampered := *cookies[0]
	tampered.Value = good[:len(good)-2] + "xx"
	c.Jar.SetCookies(u, []*http.Cookie{&tampered})
	require.Equal(t, http.StatusSeeOther, tb.get(t, c, "/endpoints").status, "tampered")
	cookies[0].Value = good
	c.Jar.SetCookies(u, cookies)
	require.Equal(t, http.StatusOK, tb.get(t, c, "/endpoints").status)
	later := tb.now.Load().Add(console.SessionTTLDefault + time.Minute)
	tb.now.Store(&later)
	require.Equal(t, http.StatusSeeOther, tb.get(t, c, "/endpoints").status, "expired")
	now := time.Now()
	tb.now.Store(&now)
	require.Equal(t, http.StatusOK, tb.get(t, c, "/endpoints").status)
	cfg := *tb.cfg.Load()
	cfg.AdminToken = "a-new-token-0123456789"
	tb.cfg.Store(&cfg)
	require.Equal(t, http.StatusSeeOther, tb.get(t, c, "/endpoints").status, "the token changed")
}

func TestActionsNeedTheTokenTheOriginAndTheFormToken(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true, token: token})
	id := tb.deadLetter(t, "shop", "http 401")
	form := func(csrf string) url.Values {
		return url.Values{"endpoint": {"shop"}, "event_id": {id}, "dead_letters": {"1"}, "csrf": {csrf}, "back": {"/dead-letters"}}
	}
	c := tb.client(t)
	page := tb.get(t, c, "/dead-letters")
	require.Equal(t, http.StatusOK, page.status, "loopback reads without signing in")
	require.Contains(t, page.body, "with the admin token to replay, pause, resume and change endpoints")
	require.NotContains(t, page.body, `action="/replay"`)
	require.Equal(t, http.StatusUnauthorized, tb.post(t, c, "/replay", form("")).status, "not signed in")

	csrf := tb.signIn(t, c)
	for name, mod := range map[string]func(*http.Request){
		"another origin":            header("Origin", "http://attacker.example"),
		"an opaque origin":          header("Origin", "null"),
		"cross-site fetch metadata": header("Sec-Fetch-Site", "cross-site"),
		"same-site (another port)":  header("Sec-Fetch-Site", "same-site"),
		"a foreign referer only":    func(r *http.Request) { r.Header.Del("Origin"); r.Header.Set("Referer", "http://attacker.example/x") },
		"no origin nor referer":     header("Origin", ""),
	} {
		a := tb.post(t, c, "/replay", form(csrf), mod)
		require.Equal(t, http.StatusForbidden, a.status, name)
	}
	require.Equal(t, http.StatusForbidden, tb.post(t, c, "/replay", form("")).status, "no form token")
	require.Equal(t, http.StatusForbidden, tb.post(t, c, "/replay", form(csrf+"x")).status, "a wrong form token")
	require.Equal(t, 1, tb.deliveryCount(t, id), "nothing was replayed by a refused request")

	a := tb.post(t, c, "/replay", form(csrf), header("Origin", ""), header("Referer", tb.server.URL+"/dead-letters"))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/dead-letters?done=replayed&n=1", a.header.Get("Location"))
	require.Equal(t, 2, tb.deliveryCount(t, id), "the replay enqueued a new delivery")
	require.Contains(t, tb.get(t, c, a.header.Get("Location")).body, "Enqueued 1 event for delivery")
	a = tb.post(t, c, "/replay", form(csrf))
	require.Equal(t, "/dead-letters?done=replayed&n=0", a.header.Get("Location"), "the event is no longer a dead letter")

	// A script with the bearer token needs neither origin nor form token;
	// a browser cannot send that header across sites.
	other := tb.deadLetter(t, "shop", "http 401")
	plain := tb.client(t)
	a = tb.post(t, plain, "/replay", url.Values{"endpoint": {"shop"}, "event_id": {other}}, header("Origin", ""), bearer(token))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, 2, tb.deliveryCount(t, other))

	// Signing out ends the session.
	require.Equal(t, http.StatusSeeOther, tb.post(t, c, "/logout", url.Values{"csrf": {csrf}}).status)
	require.Equal(t, http.StatusUnauthorized, tb.post(t, c, "/replay", form(csrf)).status)
}

func TestPagesShowNoQueryStringsUnlessLogPayloads(t *testing.T) {
	t.Parallel()
	for _, show := range []bool{false, true} {
		tb := setup(t, setupOpts{loopback: true, logPayloads: show})
		tb.deadLetter(t, "shop", `http 401: Get "https://partner.example/pb?click_id=SECRETCLICK&payout=9": whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0`)
		body := tb.get(t, tb.client(t), "/dead-letters").body
		require.Contains(t, body, "https://partner.example/pb")
		require.NotContains(t, body, "whsec_c2Vj", "secrets never")
		if show {
			require.Contains(t, body, "click_id=SECRETCLICK", "log_payloads shows the query")
		} else {
			require.NotContains(t, body, "SECRETCLICK")
		}
	}
}

func TestEndpointNamesAreEscaped(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true})
	tb.deadLetter(t, `a b/<i>x</i>`, "http 401")
	body := tb.get(t, tb.client(t), "/endpoints").body
	require.Contains(t, body, `href="/endpoints/a%20b%2F%3Ci%3Ex%3C%2Fi%3E"`)
	require.Contains(t, body, `a b/&lt;i&gt;x&lt;/i&gt;`)
	require.NotContains(t, body, "<i>x</i>")
	a := tb.get(t, tb.client(t), "/endpoints/a%20b%2F%3Ci%3Ex%3C%2Fi%3E")
	require.Equal(t, http.StatusOK, a.status, "the escaped name reaches its page")
	require.Contains(t, a.body, `<h1>a b/&lt;i&gt;x&lt;/i&gt;</h1>`)
	require.Equal(t, http.StatusNotFound, tb.get(t, tb.client(t), "/endpoints/nobody").status)
}

func TestConnectingUntilThePoolExists(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true})
	tb.connected.Store(false)
	a := tb.get(t, tb.client(t), "/endpoints")
	require.Equal(t, http.StatusServiceUnavailable, a.status)
	require.Contains(t, a.body, "Connecting to the database")
	require.Contains(t, a.body, `http-equiv="refresh"`)
	tb.connected.Store(true)
	require.Equal(t, http.StatusOK, tb.get(t, tb.client(t), "/endpoints").status)
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{token: token})
	c := tb.client(t)
	csrf := tb.signIn(t, c)
	pausedUntil := func() *time.Time {
		var at *time.Time
		_ = tb.pool.QueryRow(context.Background(), `SELECT paused_until FROM postbox.endpoint_health WHERE endpoint = 'shop' AND paused_until > now()`).Scan(&at)
		return at
	}
	a := tb.post(t, c, "/endpoints/shop/pause", url.Values{"csrf": {csrf}, "for": {"forever"}})
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Nil(t, pausedUntil())

	a = tb.post(t, c, "/endpoints/shop/pause", url.Values{"csrf": {csrf}, "for": {"resume"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/endpoints/shop?done=paused", a.header.Get("Location"))
	require.NotNil(t, pausedUntil())
	require.Contains(t, tb.get(t, c, "/endpoints/shop").body, "paused until resumed")

	a = tb.post(t, c, "/endpoints/shop/resume", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Nil(t, pausedUntil())
	require.Equal(t, http.StatusForbidden, tb.post(t, c, "/endpoints/shop/pause", url.Values{"for": {"1h"}}).status, "no form token")
}

// TestTimelineHidesResponsesAndQueriesUnlessLogPayloads: an attempt's
// response body and a target's query string reach the timeline only with
// log_payloads; secrets never.
func TestTimelineHidesResponsesAndQueriesUnlessLogPayloads(t *testing.T) {
	t.Parallel()
	for _, show := range []bool{false, true} {
		tb := setup(t, setupOpts{loopback: true, logPayloads: show})
		var id string
		require.NoError(t, tb.pool.QueryRow(context.Background(), `
			WITH ev AS (
			  INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at)
			  VALUES (gen_random_uuid(), 'shop', '{}', now(), now()) RETURNING id, event_id
			), d AS (
			  INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, delivered_at)
			  SELECT id, 'shop', 'delivered', 1, now() FROM ev RETURNING id
			), a AS (
			  INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, duration_ms, status_code, outcome, response, target)
			  SELECT id, 'shop', 1, 3.5, 200, 'delivered', 'success=true&click_id=RESPCLICK whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0',
			         'https://partner.example/pb?click_id=TARGETCLICK' FROM d
			)
			SELECT event_id::text FROM ev`).Scan(&id))
		a := tb.get(t, tb.client(t), "/events/"+id)
		require.Equal(t, http.StatusOK, a.status)
		require.Contains(t, a.body, "Attempt 1 → HTTP 200 in 3.50 ms")
		require.Contains(t, a.body, "to https://partner.example/pb")
		require.NotContains(t, a.body, "whsec_c2Vj")
		if show {
			require.Contains(t, a.body, "RESPCLICK")
			require.Contains(t, a.body, "TARGETCLICK")
		} else {
			require.NotContains(t, a.body, "RESPCLICK")
			require.NotContains(t, a.body, "TARGETCLICK")
			require.Contains(t, a.body, "Response bodies are hidden")
		}
	}
}

// TestEventPageNamesARetarget: a delivery a replay sent elsewhere than
// its row's url says where, without the url's query.
func TestEventPageNamesARetarget(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true})
	id := tb.deadLetter(t, "shop", "http 401")
	_, err := tb.pool.Exec(context.Background(), `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, replay_of, url)
		SELECT d.event_pk, d.endpoint, 'pending', d.id, 'https://new.example/pb?cid={payload.click_id}'
		FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, id)
	require.NoError(t, err)
	page := tb.get(t, tb.client(t), "/events/"+id)
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, page.body, "Queued again by a replay to https://new.example/pb, not the row&#39;s url")
	require.NotContains(t, page.body, "cid=")
}

// TestReplayToAURL: the console's replay takes a url, as postbox replay
// --url does, behind the admin token: refused by the CLI's rule (not http
// or https, a macro that does not parse) with nothing queued; accepted,
// the new delivery goes to it (the row keeps its own), the flash says so,
// and the log says a url was given, never which.
func TestReplayToAURL(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	tb := setup(t, setupOpts{loopback: true, token: token, log: logs})
	id := tb.deadLetter(t, "shop", "http 410")
	const to = "https://new.example/pb?cid={payload.click_id}"
	form := func(csrf, u string) url.Values {
		return url.Values{"endpoint": {"shop"}, "event_id": {id}, "url": {u}, "csrf": {csrf}, "back": {"/events/" + id}}
	}
	c := tb.client(t)
	require.NotContains(t, tb.get(t, c, "/events/"+id).body, `name="url"`, "no form before signing in")
	require.Equal(t, http.StatusUnauthorized, tb.post(t, c, "/replay", form("", to)).status, "not signed in")

	csrf := tb.signIn(t, c)
	require.Contains(t, tb.get(t, c, "/events/"+id).body, `name="url"`)
	require.Contains(t, tb.get(t, c, "/dead-letters").body, `name="url"`, "beside each endpoint's Replay all")
	for u, why := range map[string]string{
		"ftp://new.example/pb":                `scheme &#34;ftp&#34; is not http or https`,
		"https:///pb":                         "the URL has no host",
		"https://new.example/{payload.x":      "",
		"https://new.example/{unknown_macro}": "",
	} {
		a := tb.post(t, c, "/replay", form(csrf, u))
		require.Equal(t, http.StatusBadRequest, a.status, u)
		require.Contains(t, a.body, "The url is refused", u)
		require.Contains(t, a.body, why, u)
	}
	require.Equal(t, 1, tb.deliveryCount(t, id), "nothing queued by a refused url")

	a := tb.post(t, c, "/replay", form(csrf, "  "+to+" "))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/events/"+id+"?done=replayed_url&n=1", a.header.Get("Location"))
	require.Contains(t, tb.get(t, c, a.header.Get("Location")).body, "Enqueued 1 event for delivery to the url given, not their rows&#39; urls")
	var got *string
	require.NoError(t, tb.pool.QueryRow(context.Background(), `
		SELECT d.url FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 AND d.replay_of IS NOT NULL`, id).Scan(&got))
	require.NotNil(t, got)
	require.Equal(t, to, *got)
	require.Contains(t, logs.String(), `"url_given":true`)
	require.NotContains(t, logs.String(), "new.example")
	require.NotContains(t, logs.String(), "cid=")
}

// lockedBuffer is a log the console's handlers write while the test
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
