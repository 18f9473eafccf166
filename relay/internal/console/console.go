package console

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
	"github.com/postbox-relay/postbox/relay/internal/webstatic"
)

//go:embed templates/*.html
var templateFS embed.FS

// Timeouts and limits of the console.
const (
	// PageTimeoutDefault bounds the queries of one page.
	PageTimeoutDefault = 10 * time.Second
	// ListLimitDefault caps every list a page shows.
	ListLimitDefault = 100
	// EndpointsLimitDefault caps the endpoints table.
	EndpointsLimitDefault = 500
	// LoginFailureDelayDefault is how long a wrong token holds every
	// other sign-in back: guesses go one at a time, a few a second.
	LoginFailureDelayDefault = 250 * time.Millisecond
	// MaxFormBytes caps a POSTed form.
	MaxFormBytes = 16 << 10
	// ConcurrentPagesDefault is how many pages and actions query the
	// database at once: the console never holds more of the relay's
	// connections than this.
	ConcurrentPagesDefault = 2
)

// Options are what the console reads and acts through.
type Options struct {
	// Pool is the relay's pool: nil until it has connected (the pages say
	// "connecting" until then).
	Pool func() *pgxpool.Pool
	// Config is the configuration in force (log_payloads, admin_token,
	// search_keys, the slot, the alert thresholds).
	Config func() *config.Config
	// Loopback: the listener is bound to a loopback address, so pages may
	// be read without the token by requests addressed to localhost.
	Loopback bool
	// Version is shown in the footer.
	Version string
	Log     zerolog.Logger
	// Now is the clock; time.Now by default.
	Now func() time.Time
}

// Console serves the pages. It is an http.Handler for "/" of the admin
// listener.
type Console struct {
	pool     func() *pgxpool.Pool
	cfg      func() *config.Config
	loopback bool
	version  string
	log      zerolog.Logger
	now      func() time.Time
	pages    map[string]*template.Template
	mux      *http.ServeMux
	failMu   sync.Mutex    // serialises failed sign-ins
	busy     chan struct{} // ConcurrentPagesDefault slots of database work
}

// New returns the console.
func New(o Options) *Console {
	c := &Console{pool: o.Pool, cfg: o.Config, loopback: o.Loopback, version: o.Version,
		log: o.Log.With().Str("component", "console").Logger(), now: o.Now, busy: make(chan struct{}, ConcurrentPagesDefault)}
	if c.now == nil {
		c.now = time.Now
	}
	c.pages = map[string]*template.Template{}
	for _, name := range []string{"overview", "endpoints", "endpoint", "deadletters", "events", "event", "login", "message", "endpointform", "endpointdelete"} {
		c.pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/form.html", "templates/"+name+".html"))
	}
	files := http.FileServerFS(webstatic.FS)
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})))
	mux.HandleFunc("GET /login", c.loginForm)
	mux.HandleFunc("POST /login", c.login)
	mux.Handle("POST /logout", c.action(c.logout))
	mux.Handle("GET /{$}", c.page(c.overview))
	mux.Handle("GET /endpoints", c.page(c.endpoints))
	mux.Handle("GET /endpoints/{name}", c.page(c.endpoint))
	mux.Handle("GET /new-endpoint", c.page(c.newEndpoint))
	mux.Handle("POST /new-endpoint", c.action(c.createEndpoint))
	mux.Handle("POST /endpoints/{name}/edit", c.action(c.editEndpoint))
	mux.Handle("POST /endpoints/{name}/disable", c.action(c.setEnabled(false)))
	mux.Handle("POST /endpoints/{name}/enable", c.action(c.setEnabled(true)))
	mux.Handle("GET /endpoints/{name}/delete", c.page(c.confirmDelete))
	mux.Handle("POST /endpoints/{name}/delete", c.action(c.deleteEndpoint))
	mux.Handle("POST /endpoints/{name}/pause", c.action(c.pause))
	mux.Handle("POST /endpoints/{name}/resume", c.action(c.resume))
	mux.Handle("POST /endpoints/{name}/portal-link", c.action(c.portalLink))
	mux.Handle("POST /endpoints/{name}/portal-revoke", c.action(c.portalRevoke))
	mux.Handle("GET /dead-letters", c.page(c.deadLetters))
	mux.Handle("POST /replay", c.action(c.replay))
	mux.Handle("GET /events", c.page(c.events))
	mux.Handle("GET /events/{id}", c.page(c.event))
	mux.Handle("/", c.page(func(*request) error { return errNotFound }))
	c.mux = mux
	return c
}

// ServeHTTP serves a console path with headers that keep the pages to
// themselves: no scripts at all, styles and images only from the console,
// no framing, no caching of pages, no referrer beyond the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	c.mux.ServeHTTP(w, r)
}

// request is one page view or action.
type request struct {
	w    http.ResponseWriter
	r    *http.Request
	ctx  context.Context
	cfg  *config.Config
	s    session
	pool *pgxpool.Pool
}

// httpError is an error with the status and text a visitor sees.
type httpError struct {
	status  int
	heading string
	text    string
}

func (e *httpError) Error() string { return e.text }

var errNotFound = &httpError{http.StatusNotFound, "Not found", "There is no such page."}

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, "Bad request", fmt.Sprintf(format, args...)}
}

// page wraps a page: it lets the request read (or sends it to sign in),
// waits for the database, and bounds the queries' time.
func (c *Console) page(h func(*request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := c.cfg()
		rq := &request{w: w, r: r, cfg: cfg, s: c.sessionOf(r, cfg)}
		if !rq.s.canRead() {
			if rq.s.tokenSet {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.message(rq, http.StatusForbidden, "Only on this machine",
				"This console answers without a token only to requests addressed to localhost.",
				"Open it as http://localhost:PORT/, or set admin_token to sign in from elsewhere.", false)
			return
		}
		if rq.pool = c.pool(); rq.pool == nil {
			c.render(rq, http.StatusServiceUnavailable, "message", "Connecting", "", 2, messagePage{
				Heading: "Connecting to the database",
				Text:    "postbox has not reached its database yet; this page reloads by itself.",
			})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), PageTimeoutDefault)
		defer cancel()
		rq.ctx = ctx
		if err := c.acquire(ctx); err != nil {
			c.fail(rq, err)
			return
		}
		defer c.release()
		if err := h(rq); err != nil {
			c.fail(rq, err)
		}
	})
}

// action wraps a POST that changes something: it needs admin_token to be
// configured, the request to come from the console's own pages, the
// token proved (session cookie or bearer header), and the session's form
// token. It answers with a redirect to the page to show next, unless the
// handler showed a page itself (a form with its errors: dest "").
func (c *Console) action(h func(*request) (string, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
		cfg := c.cfg()
		rq := &request{w: w, r: r, cfg: cfg, s: c.sessionOf(r, cfg)}
		switch {
		case !rq.s.tokenSet:
			c.message(rq, http.StatusForbidden, "Actions are disabled",
				"No admin_token is configured, so the console only reads.",
				"Set admin_token (or POSTBOX_ADMIN_TOKEN) to replay, pause, resume and change endpoints from here.", true)
			return
		case !sameOrigin(r, rq.s.bearer):
			c.message(rq, http.StatusForbidden, "Refused", "This request did not come from the console's own pages.", "", true)
			return
		case !rq.s.signedIn:
			c.message(rq, http.StatusUnauthorized, "Sign in first", "Actions need the admin token.", "", true)
			return
		case !checkCSRF(rq.s, r):
			c.message(rq, http.StatusForbidden, "Refused", "The form's token does not match your session (it may have expired): reload the page and try again.", "", true)
			return
		}
		if rq.pool = c.pool(); rq.pool == nil && r.URL.Path != "/logout" {
			c.message(rq, http.StatusServiceUnavailable, "Connecting", "postbox has not reached its database yet; try again in a moment.", "", true)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), PageTimeoutDefault)
		defer cancel()
		rq.ctx = ctx
		if err := c.acquire(ctx); err != nil {
			c.fail(rq, err)
			return
		}
		defer c.release()
		dest, err := h(rq)
		if err != nil {
			c.fail(rq, err)
			return
		}
		if dest == "" {
			return
		}
		http.Redirect(w, r, dest, http.StatusSeeOther)
	})
}

// acquire waits for one of the console's database slots.
func (c *Console) acquire(ctx context.Context) error {
	select {
	case c.busy <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Console) release() { <-c.busy }

// fail shows an error page; database errors are logged.
func (c *Console) fail(rq *request, err error) {
	var he *httpError
	if errors.As(err, &he) {
		c.message(rq, he.status, he.heading, he.text, "", he.status != http.StatusNotFound)
		return
	}
	status := http.StatusInternalServerError
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusServiceUnavailable
	}
	c.log.Error().Err(err).Str("path", rq.r.URL.Path).Msg("console page failed")
	c.message(rq, status, "Something went wrong", logsafe.Text(err.Error(), false), "", true)
}

// view is what the layout renders around a page.
type view struct {
	Title, Nav, Version string
	Now                 time.Time
	Refresh             int
	Flash               string
	LogPayloads         bool
	Auth                authView
	Page                any
}

type authView struct {
	CanRead, TokenSet, SignedIn, Bearer, CanAct bool
	CSRF                                        string
	// Next is this page's path and query, for sign-in and action forms to
	// come back to.
	Next string
}

type messagePage struct {
	Heading, Text, Hint, Back string
	Bad                       bool
	// Link is a portal link to copy.
	Link string
}

func (c *Console) message(rq *request, status int, heading, text, hint string, back bool) {
	p := messagePage{Heading: heading, Text: text, Hint: hint, Bad: status >= 400 && status != http.StatusNotFound}
	if back {
		p.Back = "/"
		if ref, err := url.Parse(rq.r.Header.Get("Referer")); err == nil && strings.EqualFold(ref.Host, rq.r.Host) {
			p.Back = localPath(ref.RequestURI())
		}
	}
	c.render(rq, status, "message", heading, "", 0, p)
}

// render executes a page into a buffer, then writes it: a failing
// template never sends half a page.
func (c *Console) render(rq *request, status int, name, title, nav string, refresh int, page any) {
	v := view{Title: title, Nav: nav, Version: c.version, Now: c.now(), Refresh: refresh,
		LogPayloads: rq.cfg.LogPayloads, Page: page, Flash: flash(rq.r.URL.Query())}
	v.Auth = authView{CanRead: rq.s.canRead(), TokenSet: rq.s.tokenSet, SignedIn: rq.s.signedIn,
		Bearer: rq.s.bearer, CanAct: rq.s.canAct(), CSRF: rq.s.csrf, Next: nextURI(rq.r)}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", v); err != nil {
		c.log.Error().Err(err).Str("page", name).Msg("console template failed")
		http.Error(rq.w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	rq.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	rq.w.WriteHeader(status)
	_, _ = rq.w.Write(buf.Bytes())
}

// nextURI is the request's path and query without the flash parameters.
func nextURI(r *http.Request) string {
	if r.Method != http.MethodGet {
		return "/"
	}
	q := r.URL.Query()
	q.Del("done")
	q.Del("n")
	u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
	return u.RequestURI()
}

// withFlash adds a flash message's code to a local path.
func withFlash(path, done string, n int) string {
	u, err := url.Parse(localPath(path))
	if err != nil {
		u = &url.URL{Path: "/"}
	}
	q := u.Query()
	q.Set("done", done)
	if n >= 0 {
		q.Set("n", strconv.Itoa(n))
	}
	u.RawQuery = q.Encode()
	return u.RequestURI()
}

// flash is the message of an action's redirect: a fixed text per code,
// so a crafted link cannot put words on the page.
func flash(q url.Values) string {
	n, _ := strconv.Atoi(q.Get("n"))
	switch q.Get("done") {
	case "replayed":
		if n == 0 {
			return "Nothing to replay: the selection had no event without a delivery already waiting."
		}
		return fmt.Sprintf("Enqueued %s for delivery; each keeps its event id (webhook-id).", plural(n, "event"))
	case "replayed_url":
		if n == 0 {
			return "Nothing to replay: the selection had no event without a delivery already waiting."
		}
		return fmt.Sprintf("Enqueued %s for delivery to the url given, not their rows' urls; each keeps its event id (webhook-id).", plural(n, "event"))
	case "paused":
		return "Paused: this endpoint's deliveries wait (nothing is dropped) until the pause ends or you resume it."
	case "resumed":
		return "Resumed: deliveries to this endpoint go out again."
	case "created":
		return "Created: every instance applies it within a second; events committed from now on are delivered under it."
	case "saved":
		return "Saved: every instance applies the change within a second; events committed from now on are delivered under it."
	case "disabled":
		return "Disabled: this endpoint's events wait (nothing is dropped) until it is enabled again."
	case "enabled":
		return "Enabled: this endpoint's events go out again."
	case "deleted":
		return "Deleted: events for it are dead-lettered as unknown_endpoint (replayable once it exists again)."
	case "signedin":
		return "Signed in."
	case "signedout":
		return "Signed out."
	}
	return ""
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return formatCount(n) + " " + what + "s"
}

// loginForm shows the sign-in form.
func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	cfg := c.cfg()
	rq := &request{w: w, r: r, cfg: cfg, s: c.sessionOf(r, cfg)}
	if !rq.s.tokenSet {
		c.message(rq, http.StatusNotFound, "No sign-in", "No admin_token is configured: there is nothing to sign in to.",
			"Set admin_token (or POSTBOX_ADMIN_TOKEN) to enable actions and sign-in.", true)
		return
	}
	c.render(rq, http.StatusOK, "login", "Sign in", "login", 0, loginPage{Next: localPath(r.URL.Query().Get("next"))})
}

type loginPage struct {
	Next, Why string
	Failed    bool
}

// login checks the token and sets the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
	cfg := c.cfg()
	rq := &request{w: w, r: r, cfg: cfg, s: c.sessionOf(r, cfg)}
	switch {
	case !rq.s.tokenSet:
		c.message(rq, http.StatusNotFound, "No sign-in", "No admin_token is configured: there is nothing to sign in to.", "", true)
		return
	case !sameOrigin(r, false):
		c.message(rq, http.StatusForbidden, "Refused", "This request did not come from the console's own pages.", "", true)
		return
	}
	next := localPath(r.PostFormValue("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(cfg.AdminToken)) != 1 {
		c.failMu.Lock()
		time.Sleep(LoginFailureDelayDefault)
		c.failMu.Unlock()
		c.log.Warn().Msg("console sign-in with a wrong token")
		c.render(rq, http.StatusUnauthorized, "login", "Sign in", "login", 0, loginPage{Next: next, Failed: true})
		return
	}
	c.setSessionCookie(w, r, c.newSession(cfg.AdminToken), int(SessionTTLDefault.Seconds()))
	c.log.Info().Msg("console sign-in")
	http.Redirect(w, r, withFlash(next, "signedin", -1), http.StatusSeeOther)
}

// logout clears the session cookie.
func (c *Console) logout(rq *request) (string, error) {
	c.setSessionCookie(rq.w, rq.r, "", -1)
	return withFlash("/", "signedout", -1), nil
}
