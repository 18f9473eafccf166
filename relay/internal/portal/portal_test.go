package portal_test

import (
	"bytes"
	"context"
	"html"
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
	"github.com/postbox-relay/postbox/relay/internal/portal"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	adminToken = "console-token-0123456789"
	portalKey  = "portal-key-0123456789-0123456789-abcdef"
)

// syncBuffer is a log sink tests read while handlers write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// bundle is a database with two partners' traffic, and the admin
// listener's routing: the portal under /portal/, the console elsewhere
// (with an admin token, as off loopback).
type bundle struct {
	pool   *pgxpool.Pool
	cfg    atomic.Pointer[config.Config]
	server *httptest.Server
	log    *syncBuffer
	now    atomic.Pointer[time.Time]
}

type opts struct {
	allowReplay, showSecret, showResponse bool
	publicURL                             string
}

func setup(t testing.TB, o opts) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	f := config.Default()
	f.AdminToken = adminToken
	f.SearchKeys = []string{"click_id"}
	f.Signing.Secrets = []string{outbox.NewSecret()}
	f.Signing.PerEndpoint = config.PerEndpointDerived
	f.Portal = config.PortalConfig{Key: portalKey, AllowReplay: o.allowReplay, ShowSecret: o.showSecret,
		ShowResponse: o.showResponse, PublicURL: o.publicURL}
	u1, u2 := "https://alpha.example/pb", "https://beta.example/pb"
	f.Endpoints = map[string]config.EndpointConfig{"alpha": {URL: &u1}, "beta": {URL: &u2}}
	cfg, err := f.Resolve()
	require.NoError(t, err)
	b := &bundle{pool: pool, log: &syncBuffer{}}
	b.cfg.Store(cfg)
	now := time.Now()
	b.now.Store(&now)
	log := zerolog.New(b.log)
	clock := func() time.Time { return *b.now.Load() }
	p := portal.New(portal.Options{Pool: func() *pgxpool.Pool { return pool }, Config: b.cfg.Load, Version: "test", Log: log, Now: clock})
	c := console.New(console.Options{Pool: func() *pgxpool.Pool { return pool }, Config: b.cfg.Load, Version: "test", Log: log, Now: clock})
	mux := http.NewServeMux()
	mux.Handle(portal.Prefix, p)
	mux.Handle("/", c)
	b.server = httptest.NewServer(mux)
	t.Cleanup(b.server.Close)
	return b
}

// event stores one event of endpoint with a delivery in status (its
// attempts answered code) and returns its event id.
func (b *bundle) event(t testing.TB, endpoint, clickID, eventType, status string, code int) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at, event_type, search)
		  VALUES (gen_random_uuid(), $1, jsonb_build_object('click_id', $2::text, 'payout', 10), now(), now(), $3,
		          jsonb_build_object('click_id', $2::text))
		  RETURNING id, event_id
		), d AS (
		  INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, last_error, last_status_code, delivered_at)
		  SELECT id, $1, $4, 1, CASE WHEN $4 = 'dead_letter' THEN 'max_attempts (1) exhausted: http 500' END, $5,
		         CASE WHEN $4 = 'delivered' THEN now() END FROM ev
		  RETURNING id
		), a AS (
		  INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, duration_ms, status_code, outcome, target, response)
		  SELECT id, $1, 1, 12.5, $5, $4, 'https://' || $1 || '.example/pb', 'partner said ' || $5 FROM d
		)
		SELECT event_id::text FROM ev`, endpoint, clickID, eventType, status, code).Scan(&id))
	return id
}

func (b *bundle) link(t testing.TB, endpoint string, ttl time.Duration) string {
	t.Helper()
	v, err := portal.Version(context.Background(), b.pool, endpoint)
	require.NoError(t, err)
	tok, _, err := portal.NewLink([]byte(portalKey), endpoint, v, ttl, *b.now.Load())
	require.NoError(t, err)
	return "/portal/link/" + tok
}

func client(t testing.TB) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (b *bundle) do(t testing.TB, c *http.Client, method, path string, form url.Values, mod ...func(*http.Request)) answer {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.server.URL+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.server.URL)
	}
	for _, m := range mod {
		m(req)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, resp.Header, string(out)}
}

func (b *bundle) get(t testing.TB, c *http.Client, path string) answer {
	t.Helper()
	return b.do(t, c, http.MethodGet, path, nil)
}

// open follows a link as a browser would and returns the session's form
// token.
func (b *bundle) open(t testing.TB, c *http.Client, endpoint string) string {
	t.Helper()
	a := b.get(t, c, b.link(t, endpoint, 24*time.Hour))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/portal/", a.header.Get("Location"), "the redirect drops the token")
	page := b.get(t, c, "/portal/")
	require.Equal(t, http.StatusOK, page.status, page.body)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page.body)
	require.NotNil(t, m)
	return m[1]
}

type partners struct {
	aDelivered, aDead, bDelivered, bDead string
}

func (b *bundle) seed(t testing.TB) partners {
	return partners{
		aDelivered: b.event(t, "alpha", "c_alpha_1", "click", "delivered", 200),
		aDead:      b.event(t, "alpha", "c_alpha_2", "ftd", "dead_letter", 500),
		bDelivered: b.event(t, "beta", "c_beta_1", "click", "delivered", 200),
		bDead:      b.event(t, "beta", "c_beta_2", "ftd", "dead_letter", 500),
	}
}

func TestLinkCookiePages(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{showResponse: true})
	ids := b.seed(t)
	c := client(t)
	link := b.link(t, "alpha", time.Hour)
	a := b.get(t, c, link)
	require.Equal(t, http.StatusSeeOther, a.status)
	require.Equal(t, "/portal/", a.header.Get("Location"))
	ck := a.header.Get("Set-Cookie")
	require.Contains(t, ck, "HttpOnly")
	require.Contains(t, ck, "SameSite=Lax")
	require.Contains(t, ck, "Path=/portal/")
	require.NotContains(t, ck, "Secure", "plain http without an https public_url")
	tok := strings.TrimPrefix(link, "/portal/link/")
	require.NotContains(t, ck, tok, "the cookie is a session, not the link's token")

	list := b.get(t, c, "/portal/")
	require.Equal(t, http.StatusOK, list.status)
	require.Contains(t, list.body, ids.aDelivered)
	require.Contains(t, list.body, ids.aDead)
	require.Contains(t, list.header.Get("Content-Security-Policy"), "default-src 'none'")

	found := b.get(t, c, "/portal/?key=click_id&value=c_alpha_2")
	require.Contains(t, found.body, ids.aDead, "search by the partner's click id")
	require.NotContains(t, found.body, ids.aDelivered)
	dead := b.get(t, c, "/portal/?status=dead_letter")
	require.Contains(t, dead.body, ids.aDead)
	require.NotContains(t, dead.body, ids.aDelivered)
	typed := b.get(t, c, "/portal/?type=click")
	require.Contains(t, typed.body, ids.aDelivered)
	require.NotContains(t, typed.body, ids.aDead)
	old := b.get(t, c, "/portal/?until=2001-01-01")
	require.NotContains(t, old.body, ids.aDelivered)

	ev := b.get(t, c, "/portal/events/"+ids.aDead)
	require.Equal(t, http.StatusOK, ev.status)
	require.Contains(t, ev.body, "https://alpha.example/pb", "the request target as sent")
	require.Contains(t, ev.body, "c_alpha_2", "the payload")
	require.Contains(t, ev.body, "partner said 500", "the partner's own response (show_response)")
	require.Contains(t, ev.body, "Dead-lettered")
	require.NotContains(t, ev.body, `action="/portal/replay"`, "no resend unless allow_replay")

	h := b.get(t, c, "/portal/health")
	require.Equal(t, http.StatusOK, h.status)
	require.Contains(t, h.body, "50.0 %", "one of two attempts delivered")
	v := b.get(t, c, "/portal/verify")
	require.Contains(t, v.body, "webhook-signature")
	require.NotRegexp(t, `whsec_[A-Za-z0-9+/]{8}`, v.body, "no secret unless show_secret")
	require.NotContains(t, b.log.String(), tok, "the token is never logged")
	require.Contains(t, b.log.String(), "portal link opened")
}

func TestSecretShownOnlyWhenEnabled(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{showSecret: true, publicURL: "https://partners.example"})
	c := client(t)
	a := b.get(t, c, b.link(t, "alpha", time.Hour))
	require.Contains(t, a.header.Get("Set-Cookie"), "Secure", "an https public_url makes the cookie Secure")
	// The test client speaks plain http: present the cookie by hand.
	ck := strings.SplitN(a.header.Get("Set-Cookie"), ";", 2)[0]
	v := b.do(t, c, http.MethodGet, "/portal/verify", nil, func(r *http.Request) { r.Header.Set("Cookie", ck) })
	cfg := b.cfg.Load()
	want := cfg.SigningSecrets(cfg.Endpoint("alpha"))[0].Reveal()
	text := html.UnescapeString(v.body)
	require.Contains(t, text, want, "the partner's own derived secret")
	other := cfg.SigningSecrets(cfg.Endpoint("beta"))[0].Reveal()
	require.NotContains(t, text, other)
	require.NotContains(t, text, cfg.Secrets[0].Reveal(), "never the master")
}

// TestIsolation: a session of alpha never reads anything of beta.
func TestIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{allowReplay: true})
	ids := b.seed(t)
	c := client(t)
	csrf := b.open(t, c, "alpha")
	var bDeliveryID string
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT d.id::text FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, ids.bDead).Scan(&bDeliveryID))

	notFound := b.get(t, c, "/portal/events/00000000-0000-4000-8000-000000000000")
	require.Equal(t, http.StatusNotFound, notFound.status)
	beta := func(a answer) {
		t.Helper()
		// A search's own value is echoed in its form: its row is what must
		// not show (the other's click ids appear only as data-event rows).
		body := regexp.MustCompile(`name="value" value="[^"]*"`).ReplaceAllString(a.body, "")
		for _, s := range []string{ids.bDelivered, ids.bDead, "c_beta_1", "c_beta_2", "beta.example", ">beta<"} {
			require.NotContains(t, body, s)
		}
	}
	for _, path := range []string{
		"/portal/events/" + ids.bDead,                  // a guessed id of the other's event
		"/portal/events/" + strings.ToUpper(ids.bDead), // spelt otherwise
		"/portal/events/" + strings.ReplaceAll(ids.bDead, "-", ""),
		"/portal/?key=click_id&value=c_beta_1", // search by the other's click id
		"/portal/?endpoint=beta",               // a parameter naming the other
		"/portal/?endpoint=beta&status=dead_letter",
		"/portal/health?endpoint=beta",
		"/portal/deliveries/" + bDeliveryID, // a guessed delivery id
		"/portal/events/" + bDeliveryID,
		"/portal/endpoints/beta",
		"/portal/events/..%2f..%2fendpoints%2fbeta", // path tricks
		"/portal/%2e%2e/endpoints/beta",
		"/portal/static/..%2f..%2fendpoints",
	} {
		a := b.get(t, c, path)
		beta(a)
		if strings.HasPrefix(path, "/portal/events/") || strings.HasPrefix(path, "/portal/deliveries/") || strings.HasPrefix(path, "/portal/endpoints/") {
			require.Equal(t, http.StatusNotFound, a.status, path)
		}
		if strings.HasPrefix(path, "/portal/events/") {
			require.Equal(t, notFound.body, a.body, "another partner's event reads as one that does not exist: %s", path)
		}
	}
	// The stylesheet the console shares is served under the portal's prefix.
	require.Equal(t, http.StatusOK, b.get(t, c, "/portal/static/style.css").status)

	// An endpoint parameter changes nothing: alpha's own rows only.
	own := b.get(t, c, "/portal/?endpoint=beta")
	require.Contains(t, own.body, ids.aDead)

	// A resend of the other's dead letter: not found, nothing queued.
	a := b.do(t, c, http.MethodPost, "/portal/replay", url.Values{"csrf": {csrf}, "event_id": {ids.bDead}})
	require.Equal(t, http.StatusNotFound, a.status)
	beta(a)
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT count(*) FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, ids.bDead).Scan(&n))
	require.Equal(t, 1, n, "no delivery queued for the other partner")

	// The console is not reachable with a portal session.
	for _, path := range []string{"/", "/endpoints/beta", "/events/" + ids.bDead, "/dead-letters"} {
		a := b.get(t, c, path)
		require.Equal(t, http.StatusSeeOther, a.status, path)
		require.True(t, strings.HasPrefix(a.header.Get("Location"), "/login"), path)
	}
	con := b.do(t, c, http.MethodPost, "/replay", url.Values{"csrf": {csrf}, "endpoint": {"beta"}, "event_id": {ids.bDead}})
	require.NotEqual(t, http.StatusSeeOther, con.status)
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT count(*) FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk WHERE e.event_id = $1`, ids.bDead).Scan(&n))
	require.Equal(t, 1, n)

	// A cookie of alpha edited to say beta fails its signature.
	u, _ := url.Parse(b.server.URL + "/portal/")
	for _, ck := range c.Jar.Cookies(u) {
		forged := b.do(t, http.DefaultClient, http.MethodGet, "/portal/", nil, func(r *http.Request) {
			r.Header.Set("Cookie", ck.Name+"="+strings.Replace(ck.Value, "alpha", "beta", 1)+"x")
		})
		require.Equal(t, http.StatusForbidden, forged.status)
		beta(forged)
	}
}

func TestRevokeAndExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	b.seed(t)
	c := client(t)
	link := b.link(t, "alpha", time.Hour)
	require.Equal(t, http.StatusSeeOther, b.get(t, c, link).status)
	require.Equal(t, http.StatusSeeOther, b.get(t, client(t), link).status, "a link opens any number of times")
	require.Equal(t, http.StatusOK, b.get(t, c, "/portal/").status)

	_, err := portal.Revoke(context.Background(), b.pool, "alpha")
	require.NoError(t, err)
	a := b.get(t, c, "/portal/")
	require.Equal(t, http.StatusGone, a.status, "a revoke ends the session at once")
	require.Contains(t, a.body, "revoked")
	require.NotContains(t, a.body, "alpha", "nothing of the endpoint")
	a = b.get(t, client(t), link)
	require.Equal(t, http.StatusGone, a.status)
	require.Contains(t, a.body, "revoked")
	require.Equal(t, http.StatusSeeOther, b.get(t, client(t), b.link(t, "alpha", time.Hour)).status, "a new link works")
	require.Equal(t, http.StatusSeeOther, b.get(t, client(t), b.link(t, "beta", time.Hour)).status, "the other partner's links are untouched")

	short := b.link(t, "beta", time.Minute)
	c2 := client(t)
	require.Equal(t, http.StatusSeeOther, b.get(t, c2, short).status)
	later := time.Now().Add(2 * time.Minute)
	b.now.Store(&later)
	a = b.get(t, c2, "/portal/")
	require.Equal(t, http.StatusGone, a.status, "the session ends with its link")
	require.Contains(t, a.body, "expired")
	a = b.get(t, client(t), short)
	require.Equal(t, http.StatusGone, a.status)
	require.Contains(t, a.body, "expired")
	require.NotContains(t, a.body, "beta")

	bad := b.get(t, client(t), "/portal/link/pbl1.eyJlIjoiYWxwaGEifQ.AAAA")
	require.Equal(t, http.StatusForbidden, bad.status)
	require.Contains(t, bad.body, "not valid")
}

func TestReplayByPartner(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{allowReplay: true})
	ids := b.seed(t)
	c := client(t)
	csrf := b.open(t, c, "alpha")
	ev := b.get(t, c, "/portal/events/"+ids.aDead)
	require.Contains(t, ev.body, `action="/portal/replay"`)
	require.NotContains(t, b.get(t, c, "/portal/events/"+ids.aDelivered).body, `action="/portal/replay"`, "only dead letters")

	form := url.Values{"csrf": {csrf}, "event_id": {ids.aDead}}
	require.Equal(t, http.StatusForbidden, b.do(t, c, http.MethodPost, "/portal/replay", url.Values{"event_id": {ids.aDead}}).status, "no form token")
	require.Equal(t, http.StatusForbidden, b.do(t, c, http.MethodPost, "/portal/replay", form, func(r *http.Request) {
		r.Header.Set("Origin", "https://evil.example")
	}).status, "another origin")
	require.Equal(t, http.StatusForbidden, b.do(t, c, http.MethodPost, "/portal/replay", form, func(r *http.Request) {
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	}).status)
	a := b.do(t, c, http.MethodPost, "/portal/replay", form)
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/portal/events/"+ids.aDead+"?done=replayed", a.header.Get("Location"))
	ev = b.get(t, c, a.header.Get("Location"))
	require.Contains(t, ev.body, "replayed by partner")
	var link string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT link_id FROM postbox.portal_replays WHERE endpoint = 'alpha'`).Scan(&link))
	require.True(t, strings.HasPrefix(link, "l-"))
	require.Contains(t, b.log.String(), link, "the resend is logged with the link's id")
	op := b.do(t, http.DefaultClient, http.MethodGet, "/events/"+ids.aDead, nil, func(r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+adminToken)
	})
	require.Contains(t, op.body, "replayed by partner (portal link "+link+")", "the operator's timeline says so too")
	// Queued again already: nothing more to resend.
	a = b.do(t, c, http.MethodPost, "/portal/replay", form)
	require.Equal(t, "/portal/events/"+ids.aDead+"?done=nothing", a.header.Get("Location"))
}

func TestReplayOffByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ids := b.seed(t)
	c := client(t)
	csrf := b.open(t, c, "alpha")
	a := b.do(t, c, http.MethodPost, "/portal/replay", url.Values{"csrf": {csrf}, "event_id": {ids.aDead}})
	require.Equal(t, http.StatusForbidden, a.status)
	require.Contains(t, a.body, "not enabled")
}

func TestOpeningsRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	c := client(t)
	link := b.link(t, "alpha", time.Hour)
	var last int
	for range portal.OpensPerMinute + 1 {
		last = b.get(t, c, link).status
	}
	require.Equal(t, http.StatusTooManyRequests, last)
}

// TestConsoleButtons: the console's endpoint page makes a link that opens
// the portal, and its revoke ends it.
func TestConsoleButtons(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ids := b.seed(t)
	admin := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+adminToken) }
	page := b.do(t, http.DefaultClient, http.MethodGet, "/endpoints/alpha", nil, admin)
	require.Contains(t, page.body, `action="/endpoints/alpha/portal-link"`)
	a := b.do(t, http.DefaultClient, http.MethodPost, "/endpoints/alpha/portal-link", url.Values{"ttl": {"7d"}}, admin)
	require.Equal(t, http.StatusOK, a.status, a.body)
	m := regexp.MustCompile(`<pre class="response" id="portal-link">([^<]+)</pre>`).FindStringSubmatch(a.body)
	require.NotNil(t, m)
	require.True(t, strings.HasPrefix(m[1], b.server.URL+"/portal/link/pbl1."), m[1])
	c := client(t)
	require.Equal(t, http.StatusSeeOther, b.get(t, c, strings.TrimPrefix(m[1], b.server.URL)).status)
	require.Contains(t, b.get(t, c, "/portal/").body, ids.aDead)
	require.NotContains(t, b.log.String(), strings.TrimPrefix(m[1], b.server.URL+"/portal/link/"), "the token is never logged")

	a = b.do(t, http.DefaultClient, http.MethodPost, "/endpoints/alpha/portal-revoke", url.Values{}, admin)
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, http.StatusGone, b.get(t, c, "/portal/").status)
}

// TestReportAndCSV: the report counts the partner's own events per event
// type, and its day's CSV lists them; neither reads another endpoint by
// any parameter, and exports are rate-limited.
func TestReportAndCSV(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ids := b.seed(t)
	c := client(t)
	b.open(t, c, "alpha")
	day := time.Now().UTC().Format("2006-01-02")
	rep := b.get(t, c, "/portal/report?endpoint=beta")
	require.Equal(t, http.StatusOK, rep.status, rep.body)
	for _, typ := range []string{"click", "ftd"} {
		row := regexp.MustCompile(`(?s)<tr data-day="` + day + `" data-type="` + typ + `">(.*?)</tr>`).FindStringSubmatch(rep.body)
		require.NotNil(t, row, typ)
		require.Contains(t, row[1], `<td class="num committed">1</td>`, typ)
	}
	require.Contains(t, rep.body, `<td class="num dead">1</td>`, "alpha's ftd is a dead letter")
	require.NotContains(t, rep.body, "beta")
	require.Equal(t, http.StatusBadRequest, b.get(t, c, "/portal/report?tz=Mars/Olympus").status)

	// A link may choose the report's time zone.
	v, err := portal.Version(context.Background(), b.pool, "alpha")
	require.NoError(t, err)
	tok, _, err := portal.NewLinkIn([]byte(portalKey), "alpha", v, time.Hour, *b.now.Load(), "Asia/Kolkata")
	require.NoError(t, err)
	ck := client(t)
	require.Equal(t, http.StatusSeeOther, b.get(t, ck, "/portal/link/"+tok).status)
	require.Contains(t, b.get(t, ck, "/portal/report").body, "Day (Asia/Kolkata)")

	csv := b.get(t, c, "/portal/report/day.csv?day="+day+"&endpoint=beta")
	require.Equal(t, http.StatusOK, csv.status)
	require.Equal(t, "text/csv; charset=utf-8", csv.header.Get("Content-Type"))
	lines := strings.Split(strings.TrimSpace(csv.body), "\n")
	require.Len(t, lines, 3, csv.body)
	require.True(t, strings.HasPrefix(lines[0], "event_id,event_type,search_keys"))
	require.Contains(t, csv.body, ids.aDelivered)
	require.Contains(t, csv.body, ids.aDead)
	require.NotContains(t, csv.body, ids.bDelivered)
	require.NotContains(t, csv.body, "c_beta")
	require.Equal(t, http.StatusBadRequest, b.get(t, c, "/portal/report/day.csv?day=../../x").status)
	var last int
	for range portal.ExportsPerMinute {
		last = b.get(t, c, "/portal/report/day.csv?day="+day).status
	}
	require.Equal(t, http.StatusTooManyRequests, last, "exports are rate-limited per link")
}
