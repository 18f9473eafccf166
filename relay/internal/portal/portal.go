package portal

import (
	"bytes"
	"context"
	"crypto/hmac"
	"embed"
	"errors"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/webstatic"
)

//go:embed templates/*.html
var templateFS embed.FS

// Prefix is the path every portal page is under.
const Prefix = "/portal/"

// Limits of the portal.
const (
	// SessionTTL caps a session; the link's expiry caps it too, and a
	// revoke ends it at the next request.
	SessionTTL = 12 * time.Hour
	// PageTimeout bounds the queries of one page.
	PageTimeout = 10 * time.Second
	// ListLimit caps the deliveries list.
	ListLimit = 100
	// ConcurrentPages is how many portal requests query the database at
	// once: partners never take more of the relay's connections.
	ConcurrentPages = 2
	// OpenFailureDelay holds back every other link opening after a bad
	// one: guesses go one at a time.
	OpenFailureDelay = 250 * time.Millisecond
	// OpensPerMinute, ExportsPerMinute and ReplaysPerMinute are the rate
	// limits: link openings per client address, CSV exports per link,
	// resends per endpoint.
	OpensPerMinute   = 20
	ExportsPerMinute = 6
	ReplaysPerMinute = 10
	maxFormBytes     = 16 << 10
)

// Options are what the portal reads and acts through.
type Options struct {
	Pool    func() *pgxpool.Pool
	Config  func() *config.Config
	Version string
	Log     zerolog.Logger
	Now     func() time.Time
}

// Portal serves the partner pages under Prefix. It is an http.Handler.
type Portal struct {
	pool    func() *pgxpool.Pool
	cfg     func() *config.Config
	version string
	log     zerolog.Logger
	now     func() time.Time
	pages   map[string]*template.Template
	mux     *http.ServeMux
	busy    chan struct{}
	failMu  sync.Mutex
	limits  *limiter
}

// New returns the portal.
func New(o Options) *Portal {
	p := &Portal{pool: o.Pool, cfg: o.Config, version: o.Version, now: o.Now,
		log: o.Log.With().Str("component", "portal").Logger(), busy: make(chan struct{}, ConcurrentPages)}
	if p.now == nil {
		p.now = time.Now
	}
	p.limits = newLimiter(p.now)
	p.pages = map[string]*template.Template{}
	for _, name := range []string{"deliveries", "event", "health", "verify", "report", "message"} {
		p.pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	files := http.StripPrefix(Prefix+"static/", http.FileServerFS(webstatic.FS))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /portal/static/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /portal/link/{token}", p.open)
	mux.Handle("GET /portal/{$}", p.page(p.deliveries))
	mux.Handle("GET /portal/events/{id}", p.page(p.event))
	mux.Handle("GET /portal/health", p.page(p.health))
	mux.Handle("GET /portal/verify", p.page(p.verify))
	mux.Handle("GET /portal/report", p.page(p.report))
	mux.Handle("GET /portal/report/day.csv", p.page(p.dayCSV))
	mux.Handle("POST /portal/replay", p.action(p.replay))
	mux.Handle("POST /portal/signout", p.action(p.signout))
	mux.HandleFunc("GET /portal/signed-out", func(w http.ResponseWriter, r *http.Request) {
		p.message(w, r, http.StatusOK, "Signed out", "Open your portal link again to come back.", nil)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p.message(w, r, http.StatusNotFound, "Not found", "There is no such page.", nil)
	})
	p.mux = mux
	return p
}

// ServeHTTP serves a portal path with the console's headers: no scripts,
// styles and images only from here, no framing, no caching.
func (p *Portal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	p.mux.ServeHTTP(w, r)
}

// request is one page view or action of a partner.
type request struct {
	w   http.ResponseWriter
	r   *http.Request
	ctx context.Context
	cfg *config.Config
	// endpoint is the partner's endpoint: every query is bound to it.
	endpoint string
	claims   Claims
	csrf     string
	pool     *pgxpool.Pool
}

// httpError is an error with the status and text a partner sees.
type httpError struct {
	status        int
	heading, text string
}

func (e *httpError) Error() string { return e.text }

// cookieName is per port, as the console's: two relays on one host keep
// their sessions apart. It is not the console's name, and the console
// reads only its own cookie, so a portal session never signs in there.
func cookieName(r *http.Request) string {
	if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "" {
		return "postbox_portal_" + port
	}
	return "postbox_portal"
}

func (p *Portal) setCookie(w http.ResponseWriter, r *http.Request, cfg *config.Config, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName(r), Value: value, Path: Prefix, MaxAge: maxAge, HttpOnly: true,
		// Lax: a partner arrives from a link in an email, a cross-site
		// navigation a Strict cookie would not survive; actions are POSTs,
		// which Lax keeps from other sites.
		SameSite: http.SameSiteLaxMode,
		Secure:   r.TLS != nil || strings.HasPrefix(cfg.Portal.PublicURL, "https://"),
	})
}

// open exchanges a link's token for a session cookie and redirects to
// the portal without the token. The token is never logged.
func (p *Portal) open(w http.ResponseWriter, r *http.Request) {
	cfg := p.cfg()
	if !p.limits.allow("open|"+clientIP(r), OpensPerMinute) {
		p.message(w, r, http.StatusTooManyRequests, "Too many attempts", "Wait a minute, then open your link again.", nil)
		return
	}
	c, err := verify(cfg.Portal.Key, linkPrefix, r.PathValue("token"))
	if err == nil {
		err = p.current(r.Context(), c)
	}
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			p.failMu.Lock()
			time.Sleep(OpenFailureDelay)
			p.failMu.Unlock()
		}
		p.closed(w, r, cfg, err)
		return
	}
	s := c
	s.Issued, s.Session = p.now().Unix(), randomID(12)
	p.setCookie(w, r, cfg, sign(cfg.Portal.Key, sessionPrefix, s), int(min(SessionTTL, time.Until(time.Unix(c.Expires, 0))).Seconds()))
	p.log.Info().Str("endpoint", c.Endpoint).Str("link", c.LinkID).Msg("portal link opened")
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// current checks a link's or session's expiry and its endpoint's portal
// version as stored now.
func (p *Portal) current(ctx context.Context, c Claims) error {
	if err := c.check(p.now(), c.Version); err != nil {
		return err
	}
	pool := p.pool()
	if pool == nil {
		return &httpError{http.StatusServiceUnavailable, "Starting", "The portal is starting; try again in a moment."}
	}
	ctx, cancel := context.WithTimeout(ctx, PageTimeout)
	defer cancel()
	v, err := Version(ctx, pool, c.Endpoint)
	if err != nil {
		return err
	}
	return c.check(p.now(), v)
}

// closed is the page of a link or session that opens nothing: it says
// why and shows nothing of any endpoint.
func (p *Portal) closed(w http.ResponseWriter, r *http.Request, cfg *config.Config, err error) {
	p.setCookie(w, r, cfg, "", -1)
	var he *httpError
	switch {
	case errors.As(err, &he):
		p.message(w, r, he.status, he.heading, he.text, nil)
	case errors.Is(err, ErrExpired):
		p.message(w, r, http.StatusGone, "This link has expired", "Ask your contact for a new portal link.", nil)
	case errors.Is(err, ErrRevoked):
		p.message(w, r, http.StatusGone, "This link was revoked", "Ask your contact for a new portal link.", nil)
	case errors.Is(err, ErrInvalid):
		p.message(w, r, http.StatusForbidden, "This link is not valid", "Check that the whole link was copied, or ask your contact for a new one.", nil)
	default:
		p.log.Error().Err(err).Msg("portal session check failed")
		p.message(w, r, http.StatusServiceUnavailable, "Something went wrong", "Try again in a moment.", nil)
	}
}

// session reads the request's session cookie (signature and age only).
func (p *Portal) session(r *http.Request, cfg *config.Config) (Claims, error) {
	ck, err := r.Cookie(cookieName(r))
	if err != nil {
		return Claims{}, &httpError{http.StatusUnauthorized, "Open your portal link", "This page is opened by the portal link you were given."}
	}
	c, err := verify(cfg.Portal.Key, sessionPrefix, ck.Value)
	if err != nil || c.Session == "" {
		return Claims{}, ErrInvalid
	}
	age := p.now().Sub(time.Unix(c.Issued, 0))
	if age < -time.Minute || age > SessionTTL {
		return Claims{}, ErrExpired
	}
	return c, nil
}

// begin authenticates a page or action: the session, its link's expiry
// and the endpoint's current portal version. It writes the refusal itself
// and returns nil then.
func (p *Portal) begin(w http.ResponseWriter, r *http.Request) (*request, context.CancelFunc) {
	cfg := p.cfg()
	if len(cfg.Portal.Key) == 0 {
		p.message(w, r, http.StatusNotFound, "No portal", "The partner portal is not configured here.", nil)
		return nil, nil
	}
	c, err := p.session(r, cfg)
	if err == nil {
		err = p.current(r.Context(), c)
	}
	if err != nil {
		p.closed(w, r, cfg, err)
		return nil, nil
	}
	rq := &request{w: w, r: r, cfg: cfg, endpoint: c.Endpoint, claims: c, pool: p.pool(),
		csrf: mac(cfg.Portal.Key, "csrf", c.Session)}
	if rq.pool == nil {
		p.message(w, r, http.StatusServiceUnavailable, "Starting", "The portal is starting; try again in a moment.", nil)
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), PageTimeout)
	rq.ctx = ctx
	if err := p.acquire(ctx); err != nil {
		cancel()
		p.fail(rq, err)
		return nil, nil
	}
	return rq, func() { p.release(); cancel() }
}

// page wraps a page of a signed-in partner.
func (p *Portal) page(h func(*request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rq, done := p.begin(w, r)
		if rq == nil {
			return
		}
		defer done()
		if err := h(rq); err != nil {
			p.fail(rq, err)
		}
	})
}

// action wraps a POST: the console's rules (same origin, the session's
// form token) on top of a page's.
func (p *Portal) action(h func(*request) (string, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if !sameOrigin(r) {
			p.message(w, r, http.StatusForbidden, "Refused", "This request did not come from the portal's own pages.", nil)
			return
		}
		rq, done := p.begin(w, r)
		if rq == nil {
			return
		}
		defer done()
		if got := r.PostFormValue("csrf"); got == "" || !hmac.Equal([]byte(got), []byte(rq.csrf)) {
			p.message(w, r, http.StatusForbidden, "Refused", "The form's token does not match your session: reload the page and try again.", nil)
			return
		}
		dest, err := h(rq)
		if err != nil {
			p.fail(rq, err)
			return
		}
		http.Redirect(w, r, dest, http.StatusSeeOther)
	})
}

// sameOrigin: Sec-Fetch-Site, else Origin, else Referer must name this
// host; a POST with none of them (not a browser) is refused, as no
// partner tool needs to act without its pages.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && o != "null" && strings.EqualFold(u.Host, r.Host)
	}
	if ref := r.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		return err == nil && strings.EqualFold(u.Host, r.Host)
	}
	return false
}

func (p *Portal) acquire(ctx context.Context) error {
	select {
	case p.busy <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Portal) release() { <-p.busy }

// fail shows an error page; other errors are logged by route, never by
// path or query (a search value is the partner's data).
func (p *Portal) fail(rq *request, err error) {
	var he *httpError
	if errors.As(err, &he) {
		p.message(rq.w, rq.r, he.status, he.heading, he.text, rq)
		return
	}
	status := http.StatusInternalServerError
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusServiceUnavailable
	}
	p.log.Error().Err(err).Str("endpoint", rq.endpoint).Str("route", rq.r.Pattern).Msg("portal page failed")
	p.message(rq.w, rq.r, status, "Something went wrong", "Try again in a moment.", rq)
}

// view is what the layout renders around a page.
type view struct {
	Title, Nav, Version, Endpoint, CSRF string
	Now                                 time.Time
	SignedIn                            bool
	Flash                               string
	Page                                any
}

type messagePage struct{ Heading, Text string }

// message renders a message; rq is nil outside a session (no navigation).
func (p *Portal) message(w http.ResponseWriter, r *http.Request, status int, heading, text string, rq *request) {
	p.render(w, rq, status, "message", heading, "", messagePage{heading, text})
}

func (p *Portal) render(w http.ResponseWriter, rq *request, status int, name, title, nav string, page any) {
	v := view{Title: title, Nav: nav, Version: p.version, Now: p.now(), Page: page}
	if rq != nil {
		v.SignedIn, v.Endpoint, v.CSRF = true, rq.endpoint, rq.csrf
		v.Flash = flash(rq.r.URL.Query().Get("done"))
	}
	var buf bytes.Buffer
	if err := p.pages[name].ExecuteTemplate(&buf, "layout", v); err != nil {
		p.log.Error().Err(err).Str("page", name).Msg("portal template failed")
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// flash is a fixed text per code, so a crafted link cannot put words on
// the page.
func flash(code string) string {
	switch code {
	case "replayed":
		return "Sent again: the event keeps its webhook-id; its timeline shows the new delivery."
	case "nothing":
		return "Nothing to send again: this event is not a dead letter (or is already queued)."
	}
	return ""
}

func (p *Portal) signout(rq *request) (string, error) {
	p.setCookie(rq.w, rq.r, rq.cfg, "", -1)
	return Prefix + "signed-out", nil
}

// clientIP is the connection's address (not a forwarded header, which a
// client could vary to dodge the limit).
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
