// Package deliver makes one HTTP attempt: it builds the request (Standard
// Webhooks headers signed afresh with every active secret), sends it with a
// keep-alive client that never follows redirects, and reads at most 64 KiB
// of the response.
//
// There are no in-attempt retries: the durable retry schedule is postbox's
// (see package policy). go-retryablehttp's Client is deliberately not used
// to send, because when it gives up it closes every idle connection of its
// transport, which would cost every other endpoint its keep-alive pool.
package deliver

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
)

// MaxResponseBody is how much of a response is read and kept.
const MaxResponseBody = 64 << 10

// drainLimit is how much more is read (and discarded) so the connection can
// be reused; a larger response closes the connection instead.
const drainLimit = 256 << 10

// Request is one attempt to send.
type Request struct {
	EventID string
	Method  string
	URL     string
	Body    []byte // nil for GET
	Header  http.Header
	Secrets []outbox.Secret
	Timeout time.Duration
}

// Response is what came back: a status, or a transport error.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte // at most MaxResponseBody bytes
	Err        error
	Duration   time.Duration // from send to the end of the read, monotonic
}

// Options configure a Client.
type Options struct {
	UserAgent string
	// DialContext replaces the dialer (the SSRF guard plugs in here).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// BeneathGuard, for tests, is asked about every address the relay's
	// guard lets through, just before the connect (see guard.Dialer).
	BeneathGuard func(netip.AddrPort) error
	// Now is the clock for webhook-timestamp; time.Now when nil.
	Now func() time.Time
}

// Client sends attempts. It is safe for concurrent use.
type Client struct {
	tr        *http.Transport
	userAgent string
	now       func() time.Time
}

// NewClient returns a Client with a pooled keep-alive transport.
func NewClient(opts Options) *Client {
	dial := opts.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	tr := &http.Transport{
		Proxy:                 nil, // a proxy would bypass the dial-time address checks
		DialContext:           dial,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   128,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		// A receiver's headers are read into memory: a partner cannot
		// make postbox hold megabytes of them.
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
	}
	ua := opts.UserAgent
	if ua == "" {
		ua = "postbox"
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Client{tr: tr, userAgent: ua, now: now}
}

// The Standard Webhooks headers' canonical names ("Webhook-Id"): set in
// the map directly, they skip canonicalisation for every request.
var (
	canonID        = http.CanonicalHeaderKey(outbox.HeaderID)
	canonTimestamp = http.CanonicalHeaderKey(outbox.HeaderTimestamp)
	canonSignature = http.CanonicalHeaderKey(outbox.HeaderSignature)
)

// MaxResponseHeaderBytes bounds the response headers postbox reads.
const MaxResponseHeaderBytes = 64 << 10

// CloseIdle closes idle keep-alive connections.
func (c *Client) CloseIdle() { c.tr.CloseIdleConnections() }

// Do makes one attempt. The context bounds it together with req.Timeout.
func (c *Client) Do(ctx context.Context, req Request) Response {
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	var body io.Reader
	if req.Body != nil {
		body = bytes.NewReader(req.Body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, req.URL, body)
	if err != nil {
		return Response{Err: err}
	}
	// The header is written by its canonical names (see canon): req.Header's
	// own are canonical, as http.Header.Set leaves them.
	h := make(http.Header, len(req.Header)+7)
	for k, vs := range req.Header {
		h[k] = vs
	}
	if req.Body != nil && h.Get("Content-Type") == "" {
		h["Content-Type"] = []string{"application/json"}
	}
	h["User-Agent"] = []string{c.userAgent}
	// Signature headers last, so nothing configured can override them.
	ts := c.now().Unix()
	h[canonID] = []string{req.EventID}
	h[canonTimestamp] = []string{strconv.FormatInt(ts, 10)}
	if len(req.Secrets) > 0 {
		signed := outbox.SignedContent(req.Method, hr.URL.RequestURI(), req.Body)
		h[canonSignature] = []string{outbox.SignatureHeader(req.Secrets, req.EventID, ts, signed)}
	} else {
		delete(h, canonSignature)
	}
	// An Idempotency-Key lets net/http resend a POST on a keep-alive
	// connection the server closed before reading it.
	h["Idempotency-Key"] = []string{req.EventID}
	hr.Header = h

	if u := hr.URL.User; u != nil && hr.Header.Get("Authorization") == "" {
		// What http.Client does for a URL's user information.
		password, _ := u.Password()
		hr.SetBasicAuth(u.Username(), password)
	}

	// Straight to the transport: an http.Client would only add a copy of
	// the headers for redirects, which postbox never follows (a 3xx is
	// the attempt's answer), and the *url.Error around a failure, added
	// here as it did, but naming the URL without its query string and
	// user info (a click id, a password), wherever the error goes.
	start := time.Now()
	resp, err := c.tr.RoundTrip(hr)
	if err != nil {
		err = &url.Error{Op: requestOp(req.Method), URL: logsafe.Parsed(hr.URL), Err: err}
		return Response{Err: err, Duration: time.Since(start)}
	}
	data, readErr := readBody(resp)
	if readErr == nil {
		// Drain a little more to keep the connection reusable.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	}
	_ = resp.Body.Close()
	out := Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: data, Duration: time.Since(start)}
	if readErr != nil && ctx.Err() != nil {
		// The status arrived but the body did not finish within the timeout.
		out.Err = ctx.Err()
	}
	return out
}

// readBody reads at most MaxResponseBody bytes of a response's body, into
// a buffer of its length when the response declares one that fits.
func readBody(resp *http.Response) ([]byte, error) {
	n := resp.ContentLength
	if n < 0 || n > MaxResponseBody {
		return io.ReadAll(io.LimitReader(resp.Body, MaxResponseBody))
	}
	if n == 0 {
		return nil, nil
	}
	b := make([]byte, n)
	got, err := io.ReadFull(resp.Body, b)
	if err == io.EOF {
		err = nil // no body at all, as in the answer to a HEAD
	}
	return b[:got], err
}

// requestOp names a method as http.Client's errors do: "Post", "Get".
func requestOp(method string) string {
	if method == "" {
		return "Get"
	}
	return method[:1] + strings.ToLower(method[1:])
}
