package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/relay/config"
)

// SessionTTLDefault is how long a console sign-in lasts.
const SessionTTLDefault = 12 * time.Hour

// session is who a request comes from, as far as the console can tell.
type session struct {
	// open: the listener is on loopback and the request names a loopback
	// host, so pages may be read without the token.
	open bool
	// tokenSet: admin_token is configured (actions are possible at all).
	tokenSet bool
	// signedIn: the request proved the token, by the session cookie or the
	// bearer header.
	signedIn bool
	// bearer: it proved it by the bearer header (no cookie, no form token
	// needed: a browser cannot add that header to a cross-site request).
	bearer bool
	// id is the signed-in session's id; csrf the form token derived from it.
	id   string
	csrf string
}

// canRead reports whether the request may see pages.
func (s session) canRead() bool { return s.open || s.signedIn }

// canAct reports whether the request may replay, pause, resume and change
// endpoints.
func (s session) canAct() bool { return s.tokenSet && s.signedIn }

// by names how the request proved the token, for the log.
func (s session) by() string {
	if s.bearer {
		return "bearer"
	}
	return "session"
}

// cookieName is the session cookie's name: per port, so consoles of two
// relays on one host (cookies ignore ports) do not sign each other out.
func cookieName(r *http.Request) string {
	if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "" {
		return "postbox_console_" + port
	}
	return "postbox_console"
}

// sessionOf works out the request's session from the configuration in
// force: its admin_token, and whether loopback must prove it too.
func (c *Console) sessionOf(r *http.Request, cfg *config.Config) session {
	token := cfg.AdminToken
	s := session{open: c.loopback && loopbackHost(r.Host) && !(token != "" && cfg.AdminTokenOnLoopback), tokenSet: token != ""}
	if token == "" {
		return s
	}
	if h := r.Header.Get("Authorization"); h != "" {
		if subtle.ConstantTimeCompare([]byte(h), []byte("Bearer "+token)) == 1 {
			s.signedIn, s.bearer, s.id = true, true, "bearer"
			s.csrf = mac(token, "csrf", s.id)
		}
		return s
	}
	ck, err := r.Cookie(cookieName(r))
	if err != nil {
		return s
	}
	if id, ok := c.verifySession(token, ck.Value); ok {
		s.signedIn, s.id = true, id
		s.csrf = mac(token, "csrf", id)
	}
	return s
}

// newSession returns a cookie value: "v1.<issued unix>.<random>.<mac>",
// the mac an HMAC-SHA256 keyed by the token. The token itself is never
// stored in the cookie, and changing it ends every session.
func (c *Console) newSession(token string) string {
	var b [18]byte
	_, _ = rand.Read(b[:])
	id := strconv.FormatInt(c.now().Unix(), 10) + "." + base64.RawURLEncoding.EncodeToString(b[:])
	return "v1." + id + "." + mac(token, "session", id)
}

// verifySession checks a cookie value and returns its session id.
func (c *Console) verifySession(token, v string) (string, bool) {
	rest, ok := strings.CutPrefix(v, "v1.")
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", false
	}
	id, sig := rest[:i], rest[i+1:]
	if !hmac.Equal([]byte(sig), []byte(mac(token, "session", id))) {
		return "", false
	}
	issuedText, _, _ := strings.Cut(id, ".")
	issued, err := strconv.ParseInt(issuedText, 10, 64)
	if err != nil {
		return "", false
	}
	age := c.now().Sub(time.Unix(issued, 0))
	if age < -time.Minute || age > SessionTTLDefault {
		return "", false
	}
	return id, true
}

// mac is base64url(HMAC-SHA256(token, purpose|id)).
func mac(token, purpose, id string) string {
	h := hmac.New(sha256.New, []byte(token))
	h.Write([]byte("postbox console " + purpose + " v1|" + id))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

func (c *Console) setSessionCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName(r), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// sameOrigin reports whether a state-changing request comes from the
// console's own pages: Sec-Fetch-Site, else Origin, else Referer must name
// this host. A request with none of them (not a browser: curl, a script)
// passes only when it carries the bearer token.
func sameOrigin(r *http.Request, bearer bool) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin":
	default: // cross-site, same-site (another port or subdomain), none
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
	return bearer
}

// checkCSRF compares a form's token with the session's.
func checkCSRF(s session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	if s.bearer && got == "" {
		return true
	}
	return s.csrf != "" && hmac.Equal([]byte(got), []byte(s.csrf))
}

// loopbackHost reports whether a Host header names this machine: a
// request for a loopback listener under any other name (DNS rebinding, a
// proxy) is treated as coming from off the machine.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// localPath returns p when it is a path on this server ("/…", not "//…"),
// else "/": redirects never leave the console.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") {
		return "/"
	}
	if u, err := url.Parse(p); err != nil || u.Host != "" || u.Scheme != "" {
		return "/"
	}
	return p
}

// shortSession is a short id for a session, for the endpoint change log:
// a hash of the session's id, which itself never leaves the cookie.
func shortSession(id string) string {
	h := sha256.Sum256([]byte("postbox console actor v1|" + id))
	return "s-" + hex.EncodeToString(h[:4])
}
