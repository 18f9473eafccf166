package outbox

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Standard Webhooks header names (https://www.standardwebhooks.com/).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every signing secret: "whsec_" + base64(key).
const SecretPrefix = "whsec_"

// DefaultTolerance is how far a webhook-timestamp may lie in the past or the
// future before Verify rejects it.
const DefaultTolerance = 5 * time.Minute

// Errors returned by Verify; test them with errors.Is.
var (
	ErrMissingHeaders   = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrInvalidTimestamp = errors.New("webhook: invalid webhook-timestamp")
	ErrTimestampTooOld  = errors.New("webhook: timestamp too old")
	ErrTimestampFuture  = errors.New("webhook: timestamp too far in the future")
	ErrNoMatch          = errors.New("webhook: no signature matches")
	ErrInvalidSecret    = errors.New("webhook: invalid secret (want whsec_ followed by base64)")
)

// Secret is a decoded signing key. Its String method never reveals the key.
type Secret struct {
	key []byte
	// macs holds HMACs keyed with key (*keyedMAC), reset after use:
	// keying one hashes two blocks and allocates, a cost a relay would
	// otherwise pay per request. Nil in the zero Secret, which keys a new
	// one each time.
	macs *sync.Pool
}

// keyedMAC is an HMAC keyed with a Secret's key and the buffer it signs
// with, which lives as long as it does.
type keyedMAC struct {
	h   hash.Hash
	buf []byte
}

// newSecret is the Secret of key.
func newSecret(key []byte) Secret {
	return Secret{key: key, macs: &sync.Pool{New: func() any {
		return &keyedMAC{h: hmac.New(sha256.New, key), buf: make([]byte, 0, 96)}
	}}}
}

// ParseSecret decodes a "whsec_<base64>" secret. A secret without the
// prefix is accepted as base64, as the Standard Webhooks libraries do.
func ParseSecret(s string) (Secret, error) {
	raw := strings.TrimPrefix(strings.TrimSpace(s), SecretPrefix)
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(key) == 0 {
		return Secret{}, ErrInvalidSecret
	}
	return newSecret(key), nil
}

// NewSecret returns a fresh random 32-byte secret in "whsec_" form.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return SecretPrefix + base64.StdEncoding.EncodeToString(b[:])
}

// String hides the key so a secret can never be printed by accident.
func (s Secret) String() string { return "whsec_[redacted]" }

// GoString hides the key from %#v as well.
func (s Secret) GoString() string { return s.String() }

// MarshalText hides the key from encoders (JSON, YAML, logs).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// EndpointKeyPrefix starts the message a master secret signs to derive an
// endpoint's secret (see DeriveSecret).
const EndpointKeyPrefix = "postbox/endpoint/v1/"

// DeriveSecret is endpoint's own secret under master:
// whsec_ + base64(HMAC-SHA256(master key, "postbox/endpoint/v1/" + endpoint)).
// Each partner holds only its own, which forges nothing for the others,
// and the relay needs to keep only the master.
func DeriveSecret(master Secret, endpoint string) Secret {
	m := hmac.New(sha256.New, master.key)
	m.Write([]byte(EndpointKeyPrefix))
	m.Write([]byte(endpoint))
	return newSecret(m.Sum(nil))
}

// Len is the key's length in bytes.
func (s Secret) Len() int { return len(s.key) }

// Reveal returns the secret in "whsec_" form, key and all: for handing a
// derived secret to its partner, never for logs.
func (s Secret) Reveal() string { return SecretPrefix + base64.StdEncoding.EncodeToString(s.key) }

// Sign returns the "v1,<base64>" signature of body for id and timestamp.
func (s Secret) Sign(id string, ts int64, body []byte) string {
	var sum [sha256.Size]byte
	var out [3 + (sha256.Size+2)/3*4]byte
	copy(out[:], "v1,")
	base64.StdEncoding.Encode(out[3:], s.mac(sum[:0], id, ts, body))
	return string(out[:])
}

// mac appends the HMAC of "id.ts.body" to dst.
func (s Secret) mac(dst []byte, id string, ts int64, body []byte) []byte {
	var k *keyedMAC
	if s.macs != nil {
		k = s.macs.Get().(*keyedMAC)
	} else {
		k = &keyedMAC{h: hmac.New(sha256.New, s.key)}
	}
	k.buf = append(k.buf[:0], id...)
	k.buf = append(k.buf, '.')
	k.buf = strconv.AppendInt(k.buf, ts, 10)
	k.buf = append(k.buf, '.')
	k.h.Write(k.buf)
	k.h.Write(body)
	k.buf = k.h.Sum(k.buf[:0])
	dst = append(dst, k.buf...)
	if s.macs != nil {
		k.h.Reset()
		s.macs.Put(k)
	}
	return dst
}

// SignatureHeader returns the webhook-signature value: one "v1," entry per
// secret, space-separated, so receivers holding any one secret can verify
// during a rotation.
func SignatureHeader(secrets []Secret, id string, ts int64, body []byte) string {
	var b strings.Builder
	for i, s := range secrets {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s.Sign(id, ts, body))
	}
	return b.String()
}

// SignedContent is what a request's signature covers after
// "id.timestamp.": the body, or for a GET, which has none, the request
// target exactly as sent (origin-form path and query,
// "/pb?click_id=c1&payout=12.50"), so a postback's query string cannot be
// changed or replayed with other values. requestTarget is what the request
// line carried: http.Request.RequestURI on a server, URL.RequestURI() on a
// client.
func SignedContent(method, requestTarget string, body []byte) []byte {
	if method == http.MethodGet {
		return []byte(requestTarget)
	}
	return body
}

// VerifyRequest is Verify for a received request and its body: for a GET
// it checks the signature over the request target (see SignedContent).
func VerifyRequest(secrets []string, r *http.Request, body []byte, now time.Time) error {
	return Verify(secrets, r.Header, SignedContent(r.Method, r.RequestURI, body), now)
}

// Verify checks a delivery's Standard Webhooks signature: the timestamp must
// be within DefaultTolerance of now (either way) and one v1 signature must
// match one of the secrets ("whsec_…"), compared in constant time.
func Verify(secrets []string, header http.Header, body []byte, now time.Time) error {
	keys := make([]Secret, 0, len(secrets))
	for _, s := range secrets {
		k, err := ParseSecret(s)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	return VerifyWith(keys, DefaultTolerance, header, body, now)
}

// VerifyWith is Verify with parsed secrets and a chosen tolerance.
func VerifyWith(secrets []Secret, tolerance time.Duration, header http.Header, body []byte, now time.Time) error {
	id, tsText, sigs := header.Get(HeaderID), header.Get(HeaderTimestamp), header.Get(HeaderSignature)
	if id == "" || tsText == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return ErrInvalidTimestamp
	}
	sent := time.Unix(ts, 0)
	switch {
	case now.Sub(sent) > tolerance:
		return ErrTimestampTooOld
	case sent.Sub(now) > tolerance:
		return ErrTimestampFuture
	}
	for _, s := range secrets {
		want := s.mac(nil, id, ts, body)
		for _, entry := range strings.Fields(sigs) {
			version, sig, ok := strings.Cut(entry, ",")
			if !ok || version != "v1" {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(sig)
			if err != nil {
				continue
			}
			if hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w (%d secret(s) tried)", ErrNoMatch, len(secrets))
}
