// Package logsafe is postbox's log field policy. postbox sends financial
// events (conversions, payouts) to URLs that carry click ids in their
// query strings; none of that may reach a log by accident.
//
// Writer sits between zerolog and the log's destination and enforces the
// policy on every line, whatever code wrote it:
//
//   - fields that hold payloads, bodies, headers or query strings
//     (payload, body, headers, header, query, click_id, payout, …) are
//     replaced by "[redacted]";
//   - fields that hold secrets (secret, secrets, token, authorization,
//     password) are always replaced, and so is any string with a whsec_
//     secret in it;
//   - a URL anywhere in a string value loses its query string and
//     fragment: scheme://host/path is what is logged.
//
// With log_payloads: true the payload fields and full URLs pass (secrets
// never do).
package logsafe

import (
	"bytes"
	"encoding/json"
	"io"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Redacted replaces what the policy hides.
const Redacted = "[redacted]"

// payloadFields hold event data; shown only with log_payloads.
var payloadFields = map[string]bool{
	"payload": true, "body": true, "headers": true, "header": true, "query": true,
	"click_id": true, "payout": true, "response_body": true, "request_body": true,
}

// secretFields are never shown.
var secretFields = map[string]bool{
	"secret": true, "secrets": true, "token": true, "admin_token": true, "authorization": true,
	"password": true, "signature": true, "webhook-signature": true,
}

var (
	urlRe    = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+`)
	secretRe = regexp.MustCompile(`whsec_[A-Za-z0-9+/=]+`)
	// triggers: a line without any of these needs no look.
	triggers = func() [][]byte {
		t := [][]byte{[]byte("://"), []byte("whsec_")}
		for k := range payloadFields {
			t = append(t, []byte(`"`+k+`"`))
		}
		for k := range secretFields {
			t = append(t, []byte(`"`+k+`"`))
		}
		return t
	}()
)

// Writer enforces the policy on zerolog's JSON lines.
type Writer struct {
	out          io.Writer
	showPayloads bool
	mu           sync.Mutex
}

// NewWriter wraps out. showPayloads is log_payloads. Wrapping a Writer
// gives one Writer with the stricter of the two policies, so a line is
// filtered once (the process's standard error and the relay's logger on
// top of it).
func NewWriter(out io.Writer, showPayloads bool) *Writer {
	if inner, ok := out.(*Writer); ok {
		return &Writer{out: inner.out, showPayloads: showPayloads && inner.showPayloads}
	}
	return &Writer{out: out, showPayloads: showPayloads}
}

// Write filters one log line (zerolog writes a line per call).
func (w *Writer) Write(p []byte) (int, error) {
	line := w.filter(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.out.Write(line); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *Writer) filter(p []byte) []byte {
	if !w.needsLook(p) {
		return p
	}
	var fields map[string]any
	if err := json.Unmarshal(p, &fields); err != nil {
		// Not JSON (a console writer, say): scrub the text as a whole.
		return []byte(w.scrub(string(p)))
	}
	for k, v := range fields {
		lk := strings.ToLower(k)
		switch {
		case secretFields[lk]:
			fields[k] = Redacted
		case payloadFields[lk] && !w.showPayloads:
			fields[k] = Redacted
		default:
			fields[k] = w.value(v)
		}
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return []byte(`{"level":"error","message":"log line withheld: it could not be checked"}` + "\n")
	}
	return append(out, '\n')
}

func (w *Writer) needsLook(p []byte) bool {
	for _, t := range triggers {
		if bytes.Contains(p, t) {
			return true
		}
	}
	return false
}

func (w *Writer) value(v any) any {
	switch x := v.(type) {
	case string:
		return w.scrub(x)
	case map[string]any:
		for k, vv := range x {
			if secretFields[strings.ToLower(k)] || (payloadFields[strings.ToLower(k)] && !w.showPayloads) {
				x[k] = Redacted
			} else {
				x[k] = w.value(vv)
			}
		}
		return x
	case []any:
		for i := range x {
			x[i] = w.value(x[i])
		}
		return x
	}
	return v
}

// scrub removes secrets and the user info of URLs (user:pass@) from free
// text, and URL query strings too unless payloads are shown.
func (w *Writer) scrub(s string) string {
	s = secretRe.ReplaceAllString(s, Redacted)
	if w.showPayloads {
		return urlRe.ReplaceAllStringFunc(s, withoutUserInfo)
	}
	return urlRe.ReplaceAllStringFunc(s, URL)
}

// withoutUserInfo is raw with any user:pass@ replaced by the redaction
// mark, the rest as it was.
func withoutUserInfo(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		return scheme + "://" + Redacted + "@" + rest[at+1:]
	}
	return raw
}

// Text is free text (a response body's start, an error) as the policy
// lets it be stored or shown: secrets always removed, and URL query
// strings too unless showPayloads (log_payloads).
func Text(s string, showPayloads bool) string {
	return (&Writer{showPayloads: showPayloads}).scrub(s)
}

// URL is raw without its query string, fragment and user info:
// scheme://host/path. Unparsable input is cut at the first ? or #, and
// loses its user info.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i := strings.IndexAny(raw, "?#"); i >= 0 {
			raw = raw[:i]
		}
		return withoutUserInfo(raw)
	}
	return Parsed(u)
}

// Parsed is URL for a URL already parsed; u is left as it was.
func Parsed(u *url.URL) string {
	safe := *u
	safe.RawQuery, safe.Fragment, safe.RawFragment, safe.User, safe.ForceQuery = "", "", "", nil, false
	return safe.String()
}
