package portal

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Querier is what the portal reads and writes through: a pool, a
// connection or a transaction.
type Querier = telemetry.Querier

// Errors of a link or session that cannot open the portal. Each gets the
// same page with nothing of the endpoint on it.
var (
	ErrNoKey   = errors.New("portal: no key to sign links (set portal.key, or signing.secrets to derive one)")
	ErrInvalid = errors.New("portal: invalid link")
	ErrExpired = errors.New("portal: link expired")
	ErrRevoked = errors.New("portal: link revoked")
)

// Claims are what a link and a session carry, signed: the endpoint, the
// link's expiry, the endpoint's portal version when the link was made,
// and the link's id (for the log and "replayed by partner").
type Claims struct {
	Endpoint string `json:"e"`
	Expires  int64  `json:"x"`
	Version  int    `json:"v"`
	LinkID   string `json:"l"`
	// TZ is the report's time zone the link chose ("": UTC, or the
	// partner's own choice on the page).
	TZ string `json:"z,omitempty"`
	// Session only: when it was opened and its own random id (the form
	// token is derived from it).
	Issued  int64  `json:"i,omitempty"`
	Session string `json:"s,omitempty"`
}

// Token prefixes: a link's and a session's are signed under different
// labels, so neither can stand for the other.
const (
	linkPrefix    = "pbl1."
	sessionPrefix = "pbs1."
)

// sign returns prefix + base64url(JSON of c) + "." + base64url(HMAC).
func sign(key []byte, prefix string, c Claims) string {
	body, _ := json.Marshal(c)
	p := base64.RawURLEncoding.EncodeToString(body)
	return prefix + p + "." + mac(key, prefix, p)
}

// verify checks a token's form and signature (not its expiry or version).
func verify(key []byte, prefix, tok string) (Claims, error) {
	var c Claims
	rest, ok := strings.CutPrefix(tok, prefix)
	if !ok || len(key) == 0 || len(tok) > 2048 {
		return c, ErrInvalid
	}
	p, sig, ok := strings.Cut(rest, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(mac(key, prefix, p))) {
		return c, ErrInvalid
	}
	body, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil || json.Unmarshal(body, &c) != nil || c.Endpoint == "" || c.LinkID == "" {
		return Claims{}, ErrInvalid
	}
	return c, nil
}

func mac(key []byte, purpose, p string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("postbox portal " + purpose + "|" + p))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// NewLink returns a link token for endpoint at its portal version,
// valid until now+ttl, and the link's id.
func NewLink(key []byte, endpoint string, version int, ttl time.Duration, now time.Time) (token, linkID string, err error) {
	return NewLinkIn(key, endpoint, version, ttl, now, "")
}

// NewLinkIn is NewLink whose report opens in time zone tz (an IANA name).
func NewLinkIn(key []byte, endpoint string, version int, ttl time.Duration, now time.Time, tz string) (token, linkID string, err error) {
	if tz != "" {
		if _, err := time.LoadLocation(tz); err != nil || len(tz) > 64 {
			return "", "", fmt.Errorf("portal: unknown time zone %q", tz)
		}
	}
	if len(key) == 0 {
		return "", "", ErrNoKey
	}
	if ttl <= 0 {
		return "", "", fmt.Errorf("portal: ttl must be positive")
	}
	c := Claims{Endpoint: endpoint, Expires: now.Add(ttl).Unix(), Version: version, LinkID: "l-" + randomID(6), TZ: tz}
	return sign(key, linkPrefix, c), c.LinkID, nil
}

// check is the expiry and version check of a link or session, version
// being the endpoint's current portal version.
func (c Claims) check(now time.Time, version int) error {
	if now.Unix() >= c.Expires {
		return ErrExpired
	}
	if c.Version != version {
		return ErrRevoked
	}
	return nil
}

// Version is endpoint's portal version (0 until first revoked).
func Version(ctx context.Context, q Querier, endpoint string) (int, error) {
	var v int
	err := q.QueryRow(ctx, `SELECT version FROM postbox.portal_versions WHERE endpoint = $1`, endpoint).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("portal version: %w", err)
	}
	return v, nil
}

// Revoke bumps endpoint's portal version, ending every link and session
// made before, and returns the new version.
func Revoke(ctx context.Context, q Querier, endpoint string) (int, error) {
	var v int
	err := q.QueryRow(ctx, `
		INSERT INTO postbox.portal_versions AS p (endpoint, version) VALUES ($1, 1)
		ON CONFLICT (endpoint) DO UPDATE SET version = p.version + 1, updated_at = now()
		RETURNING version`, endpoint).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("portal revoke: %w", err)
	}
	return v, nil
}
