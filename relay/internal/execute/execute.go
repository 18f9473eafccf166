// Package execute makes one delivery attempt: it resolves the request
// (URL template, body template, or the dead-letter reason for an event
// that cannot be sent), holds it while its endpoint is protected, sends it
// signed, and classifies the response into what follows.
package execute

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/internal/protect"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/macro"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Event is what Resolve needs to know of an event: what it says, and
// why its row could not be read, if so (store.OutboxRow.Invalid).
type Event struct {
	state.Event
	Invalid string
}

// Target is an event's resolved request, or the reason it has none.
type Target struct {
	Endpoint config.Endpoint
	URL      string
	// Recorded is what an attempt records of URL: without its query
	// string, fragment and user info (logsafe.URL), and with the path
	// segments of the endpoint's redact_path as ***.
	Recorded string
	// Sent is URL as requested (without user info or fragment, which are
	// not part of the request's target) when it is not Recorded.
	Sent   string
	Body   []byte // nil for GET
	Reason string // a dead-letter reason, "" when deliverable
	// Held says why the event waits instead (its endpoint is a row of
	// postbox.endpoints, disabled or invalid): neither attempted nor
	// dead-lettered, until the row changes.
	Held string
}

// Held is why ep's events wait rather than being attempted: "" for an
// endpoint of the file or the defaults, and for a row of
// postbox.endpoints that is enabled and valid. A row whose url or body
// template does not parse is invalid: the row's fault, not its events'.
func Held(ep config.Endpoint) string {
	if ep.Source != config.SourceTable {
		return ""
	}
	if h := ep.Held(); h != "" {
		return h
	}
	if macro.Contains(ep.URL) {
		if _, err := compile(ep.URL, true); err != nil {
			return "invalid: url: " + strings.TrimPrefix(err.Error(), macro.ErrTemplate.Error()+": ")
		}
	}
	if ep.Body != nil {
		if _, err := compile(*ep.Body, false); err != nil {
			return "invalid: body: " + strings.TrimPrefix(err.Error(), macro.ErrTemplate.Error()+": ")
		}
	}
	return ""
}

// Resolve decides where and what an event sends under cfg: the URL (a
// template expanded), the body, or a dead-letter reason, each
// starting with its code so dead letters group by it. A target whose host
// is a literal address the guard refuses is refused here, never dialled.
func Resolve(cfg *config.Config, ev Event) Target {
	ep := cfg.Endpoint(ev.Endpoint)
	t := Target{Endpoint: ep}
	raw := ev.URL
	if raw == "" {
		raw = ep.URL
	}
	vals := macro.Values{EventID: ev.EventID, EventType: ev.EventType, Endpoint: ev.Endpoint, CreatedAt: ev.CreatedAt, Payload: ev.Payload}
	fail := func(code, format string, args ...any) Target {
		t.Reason = code + ": " + fmt.Sprintf(format, args...)
		return t
	}
	switch {
	case ev.Message && !cfg.Messages:
		// First, whatever else is wrong with it: a message while they are
		// off may be a forgery, and its reason fires the alert.
		return fail(policy.ReasonMessagesOff, "written with outbox.Emit (a logical decoding message) while outbox_messages is off; "+
			"if the application emits events, set outbox_messages: true, restrict pg_logical_emit_message (postbox doctor) and replay")
	case ev.Invalid != "":
		t.Reason = ev.Invalid
		return t
	default:
		// A table endpoint's row holds all of its events, row urls too.
		if h := Held(ep); h != "" {
			t.Held = h
			return t
		}
	}
	switch {
	case len(ev.Endpoint) > store.MaxEndpointLen:
		// A row's name; stored cut (store.StoredEndpoint), and refused
		// again when replayed.
		return fail("invalid_row", "the endpoint name is %d bytes, above the %d postbox accepts", len(ev.Endpoint), store.MaxEndpointLen)
	case ev.URL != "" && ep.URL != "" && !ep.AllowRowURL:
		// The endpoint's headers and secrets are for its own URL: a row
		// may not send them elsewhere.
		return fail(policy.ReasonRowURLNotAllowed, "endpoint %q has a url of its own; %s.allow_row_url: true lets its rows give another", ev.Endpoint, settingsKey(ep))
	case ev.URL != "" && len(ep.Headers) > 0 && !ep.AllowRowURL:
		// Configured headers (an Authorization, an API key) go to
		// configured URLs only. Refused rather than sent without them, so
		// that the operator decides, and a partner is never sent half a
		// request.
		return fail(policy.ReasonRowURLNotAllowed, "%s.headers go to configured urls only; %s.allow_row_url: true sends them to rows' urls too (%s.row_url_hosts names which hosts)",
			settingsKey(ep), settingsKey(ep), settingsKey(ep))
	case raw == "":
		return fail(policy.ReasonUnknownEndpoint, "no endpoint %q is configured and the row has no url", ev.Endpoint)
	case len(ev.Payload) > int(cfg.MaxBody):
		return fail(policy.ReasonPayloadTooLarge, "%d bytes is above max_body (%d)", len(ev.Payload), cfg.MaxBody)
	}
	var tpl *macro.Template
	if macro.Contains(raw) {
		// The endpoint's own template is compiled once per source; a
		// row's, for its event alone.
		parse, whose := macro.Parse, "the row's url"
		if ev.URL == "" {
			parse, whose = compile, "the endpoint's url"
		}
		parsed, err := parse(raw, true)
		if err != nil {
			return fail(policy.ReasonTemplateError, "%s: %v", whose, err)
		}
		tpl = &parsed
	}
	t.URL = raw
	if tpl != nil {
		u, err := tpl.ExpandURL(vals)
		if err != nil {
			return fail(policy.ReasonTemplateError, "%s", strings.TrimPrefix(err.Error(), macro.ErrTemplate.Error()+": "))
		}
		t.URL = u
	}
	var target parsedURL
	if tpl == nil && raw == ep.URL {
		target = endpointURL(raw, ep.RedactPath)
	} else {
		target = parseURL(t.URL, ep.RedactPath)
	}
	if target.err != nil {
		return fail(policy.ReasonInvalidURL, "%v", target.err)
	}
	t.Recorded = target.recorded
	t.Sent = target.sent
	if ev.URL != "" && !ep.RowURLHost(target.host) {
		return fail(policy.ReasonRowURLNotAllowed, "%s is not in %s.row_url_hosts", target.host, settingsKey(ep))
	}
	if target.addr.IsValid() {
		if err := Guard(cfg).Check(target.addr); err != nil {
			return fail(policy.ReasonBlockedTarget, "%v", err)
		}
	}
	if ep.Method != http.MethodGet {
		t.Body = ev.Payload
		if ep.Body != nil {
			body, err := compile(*ep.Body, false)
			if err != nil {
				return fail(policy.ReasonTemplateError, "body: %v", err)
			}
			expand := body.ExpandJSON
			if strings.HasPrefix(strings.ToLower(headerValue(ep.Headers, "Content-Type")), "application/x-www-form-urlencoded") {
				expand = func(v macro.Values) (string, error) { return body.ExpandBody(v, url.QueryEscape) }
			}
			b, err := expand(vals)
			if err != nil {
				return fail(policy.ReasonTemplateError, "body: %s", strings.TrimPrefix(err.Error(), macro.ErrTemplate.Error()+": "))
			}
			t.Body = []byte(b)
		}
	}
	return t
}

// Resolved is an event's request as the ingest resolved it under Config,
// handed to its first attempt (dispatch.Job.Resolved): the event is
// resolved once on its way from the WAL to its first request.
type Resolved struct {
	Config *config.Config
	Target Target
}

// ResolvedRequest marks Resolved as a dispatch.Resolved.
func (*Resolved) ResolvedRequest() {}

// resolved is j's request under cfg: the one the ingest resolved, while
// the configuration it was resolved under is still in force and its
// endpoint's row of postbox.endpoints unchanged; else (a later attempt, a
// reload or a change of the row since) resolved now, so a reload or a
// change applies to every event still waiting.
func resolved(cfg *config.Config, j *dispatch.Job) Target {
	r, ok := j.Resolved.(*Resolved)
	j.Resolved = nil // its body need not outlive the attempt
	if ok && r.Config == cfg && r.Target.Endpoint.Revision == cfg.EndpointTable.Revision(j.Endpoint) {
		return r.Target
	}
	return Resolve(cfg, Event{Event: j.Event})
}

// parsedURL is what Resolve needs of a URL: whether it is one to deliver
// to, its host's address when the host is a literal one, and what an
// attempt records of it.
type parsedURL struct {
	host     string
	addr     netip.Addr // invalid for a host name
	recorded string
	sent     string // see Target.Sent
	err      error
}

func parseURL(raw string, redact config.RedactPath) parsedURL {
	u, err := config.ParseTargetURL(raw)
	if err != nil {
		return parsedURL{err: err}
	}
	host := u.Hostname()
	addr, _ := netip.ParseAddr(strings.Trim(host, "[]"))
	recorded := logsafe.Parsed(redactPath(u, redact))
	s := *u
	s.User, s.Fragment, s.RawFragment = nil, "", ""
	sent := s.String()
	if sent == recorded {
		sent = ""
	}
	return parsedURL{host: host, addr: addr, recorded: recorded, sent: sent}
}

// settingsKey is where ep's settings are written: its own section, or
// defaults for an endpoint that is not configured (whose name a row chose,
// and which a dead letter's reason does not repeat there).
func settingsKey(ep config.Endpoint) string {
	if ep.Configured {
		return "endpoints." + ep.Name
	}
	return "defaults"
}

// redactPath is u with the path segments redact names as *** (u itself
// when it names none): what is recorded, and so what the console, the CLI
// and the log show, never holds a token a partner put in its URL's path.
func redactPath(u *url.URL, redact config.RedactPath) *url.URL {
	if redact == 0 {
		return u
	}
	r := *u
	r.RawPath = redact.Redacted(u.EscapedPath())
	r.Path, _ = url.PathUnescape(r.RawPath)
	r.Opaque = ""
	return &r
}

// endpointURLs holds parseURL of endpoints' own URLs, where most attempts
// go: a few strings, each parsed once, where parsing them for every
// attempt cost a few percent of the relay's CPU. The guard is not kept:
// every attempt passes the one in force.
var endpointURLs sync.Map

// urlKey keys endpointURLs: a reload may change an endpoint's redact_path.
type urlKey struct {
	raw    string
	redact config.RedactPath
}

func endpointURL(raw string, redact config.RedactPath) parsedURL {
	k := urlKey{raw, redact}
	if p, ok := endpointURLs.Load(k); ok {
		return p.(parsedURL)
	}
	p := parseURL(raw, redact)
	endpointURLs.Store(k, p)
	return p
}

func headerValue(h map[string]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// forbiddenHeaders cannot be set by configuration or by a row: hop-by-hop
// headers, framing, and the signature headers.
var forbiddenHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Host": true,
	"Content-Length": true, "Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	"Idempotency-Key": true,
}

// Bounds on the headers a row may add.
const (
	MaxRowHeaders      = 32
	MaxRowHeaderBytes  = 8 << 10
	maxRowHeaderNameLn = 64
)

// requestHeader is the endpoint's configured headers and, beside them, the
// row's: at most MaxRowHeaders of at most MaxRowHeaderBytes in all, names
// of letters, digits and '-' only, never a forbidden header and never one
// the endpoint configures (its Authorization, its Content-Type): the
// configuration is what the partner trusts. Row headers outside these
// bounds are dropped, in name order, so the choice does not vary.
func requestHeader(ep config.Endpoint, rowHeaders []byte) http.Header {
	h := http.Header{}
	for k, v := range ep.Headers {
		if !forbiddenHeaders[http.CanonicalHeaderKey(k)] {
			h.Set(k, v)
		}
	}
	if len(rowHeaders) == 0 {
		return h
	}
	var m map[string]any
	if json.Unmarshal(rowHeaders, &m) != nil {
		return h
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	added, size := 0, 0
	for _, k := range names {
		s, ok := m[k].(string)
		canon := http.CanonicalHeaderKey(k)
		switch {
		case !ok, !headerName(k), strings.ContainsAny(s, "\r\n\x00"), forbiddenHeaders[canon], h.Get(canon) != "":
			continue
		case added == MaxRowHeaders, size+len(k)+len(s) > MaxRowHeaderBytes:
			return h
		}
		h.Set(k, s)
		added++
		size += len(k) + len(s)
	}
	return h
}

// headerName reports whether k is a header name a row may use: letters,
// digits and '-', at most 64 of them.
func headerName(k string) bool {
	if k == "" || len(k) > maxRowHeaderNameLn {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// Executor makes attempts: it resolves a job's request under the
// configuration in force, waits for its endpoint's protection, sends it,
// and decides what follows. It owns no goroutines: the dispatcher's run
// Execute.
type Executor struct {
	env    *service.Env
	log    zerolog.Logger
	client *deliver.Client
	prot   *protect.Protection
	gate   func(ctx context.Context, commit uint64) error
}

// GateRetryDefault is how long a delivery waits when the read of the
// applied endpoints before its attempt failed.
const GateRetryDefault = time.Second

// Gate sets what an attempt of an event committed at commit waits for
// first: this instance's having applied every change of
// postbox.endpoints committed before it. Set before the first attempt.
func (x *Executor) Gate(f func(ctx context.Context, commit uint64) error) { x.gate = f }

// New returns an Executor sending with client under prot.
func New(env *service.Env, client *deliver.Client, prot *protect.Protection) *Executor {
	return &Executor{env: env, log: env.Logger("deliver"), client: client, prot: prot}
}

// Execute makes one attempt for a job and decides what follows. Its
// context ends only when a shutdown runs out of grace; the delivery is
// then handed back untouched.
func (x *Executor) Execute(ctx context.Context, j *dispatch.Job) state.Result {
	cfg := x.env.Config()
	res := state.Result{DeliveryID: j.DeliveryID, Endpoint: j.Endpoint, Lane: j.Lane, CommitToDeliveryMS: -1}
	if j.CommitLSN != 0 && x.gate != nil {
		if err := x.gate(ctx, j.CommitLSN); err != nil {
			// Not attempted under settings that may be older than the
			// event: back to the queue, no attempt spent, and not claimed
			// again at once (the read fails for the next one too).
			x.log.Warn().Err(err).Str("event_id", j.EventID).Msg("could not read the applied endpoints; the delivery waits")
			res := dispatch.Released(j)
			res.Delay = GateRetryDefault
			return res
		}
	}
	t := resolved(cfg, j)
	if t.Held != "" {
		// The claim skips held endpoints: this one was held since it was
		// claimed.
		return dispatch.Released(j)
	}
	if t.Reason != "" {
		if strings.HasPrefix(t.Reason, policy.ReasonMessagesOff) {
			x.env.Metrics.MessagesRefused(1)
		}
		res.Status, res.Attempted, res.LastError, res.At = postboxtype.DeliveryDeadLetter, true, t.Reason, x.env.Now()
		x.log.Warn().Str("event_id", j.EventID).Str("endpoint", j.Endpoint).Str("reason", t.Reason).Msg("dead letter")
		return res
	}
	ep := t.Endpoint
	// Held back (breaker open or half-open, or paused by the receiver):
	// back to the queue without spending an attempt; claims skip the
	// lane until it may be tried again.
	if hold, _ := x.prot.Hold(j.Key(), ep.FailureThreshold, j.Probe, x.env.Now()); hold {
		return dispatch.Released(j)
	}
	if !ep.RateLimit.IsZero() {
		// Above the rate the event waits, holding only its own lane's
		// slot; it never fails for it.
		if err := x.prot.Wait(ctx, j.Key(), ep.RateLimit); err != nil {
			return dispatch.Released(j)
		}
	}
	req := deliver.Request{
		EventID: j.EventID,
		Method:  ep.Method,
		URL:     t.URL,
		Body:    t.Body,
		Header:  requestHeader(ep, j.Headers),
		Secrets: cfg.SigningSecrets(ep),
		Timeout: ep.Timeout,
	}
	if !j.Received.IsZero() {
		res.StreamToAttempt = max(time.Since(j.Received), 1)
	}
	resp := x.client.Do(ctx, req)
	res.At = x.env.Now()
	if ctx.Err() != nil && resp.Err != nil {
		// Shutdown ran out of grace: hand the delivery back untouched.
		return dispatch.Released(j)
	}
	res.Attempted, res.Sampled = true, true
	res.Attempt, res.Target, res.Sent, res.EndpointRevision = j.Attempt, t.Recorded, t.Sent, ep.Revision
	res.ResponseMS = millis(resp.Duration)
	res.StatusCode = resp.StatusCode
	res.Response = logsafe.Text(responseSnippet(resp.Body), cfg.LogPayloads)
	v := policy.Classify(policy.Attempt{StatusCode: resp.StatusCode, Header: resp.Header, Body: resp.Body,
		Err: resp.Err, Timeout: ep.Timeout}, ep)
	res.LastError = v.Reason
	res.ErrorClass = errorClass(v, resp.StatusCode)
	res.Signal = signal(v, resp.StatusCode)
	x.prot.Observe(j.Key(), res.Signal, res.At)
	if resp.StatusCode == http.StatusTooManyRequests || v.RetryAfter > 0 {
		// The receiver asks for less: the whole lane waits, so the
		// other queued events do not burn their attempts meanwhile.
		res.Pause = v.RetryAfter
		if res.Pause == 0 {
			res.Pause = policy.Backoff(j.Attempt, ep.BackoffBase, ep.BackoffCap, x.env.Rand)
		}
		res.Pause = min(res.Pause, ep.BackoffCap)
	}
	ev := x.log.Debug()
	switch {
	case v.Kind == policy.Success:
		res.Status, res.LastError = postboxtype.DeliveryDelivered, ""
		if !j.CommittedAt.IsZero() {
			res.CommitToDeliveryMS = millis(res.At.Sub(j.CommittedAt))
		}
	case v.Kind == policy.Retry && j.Attempt < ep.MaxAttempts:
		res.Status = postboxtype.DeliveryFailed
		res.Delay = policy.Backoff(j.Attempt, ep.BackoffBase, ep.BackoffCap, x.env.Rand)
		if v.RetryAfter > 0 || res.Pause > 0 {
			res.Delay = max(res.Pause, min(v.RetryAfter, ep.BackoffCap))
		}
		ev = x.log.Info()
	case v.Kind == policy.Retry:
		res.Status = postboxtype.DeliveryDeadLetter
		res.LastError = fmt.Sprintf("max_attempts (%d) exhausted: %s", ep.MaxAttempts, v.Reason)
		ev = x.log.Warn()
	default:
		res.Status = postboxtype.DeliveryDeadLetter
		ev = x.log.Warn()
	}
	if cfg.LogPayloads {
		// Only with log_payloads: the full URL (its redact_path segments
		// still hidden) and the body sent.
		ev = ev.Str("url", loggedURL(t.URL, ep.RedactPath)).Bytes("body", t.Body)
	}
	if j.Lane != "" {
		ev = ev.Str("lane", j.Lane)
	}
	ev.Str("event_id", j.EventID).Str("endpoint", j.Endpoint).Int("attempt", j.Attempt).
		Int("status_code", resp.StatusCode).Dur("duration", resp.Duration).Stringer("outcome", res.Status).
		Str("reason", res.LastError).Dur("retry_in", res.Delay).Msg("attempt")
	return res
}

// loggedURL is raw, query string included, with redact_path applied.
func loggedURL(raw string, redact config.RedactPath) string {
	if redact == 0 {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return logsafe.Redacted
	}
	return redactPath(u, redact).String()
}

// signal is what an attempt says about its endpoint's health: a success,
// or a failure of the endpoint itself (5xx, timeouts, connection errors, a
// body that fails the success rule). A 429 is the receiver pacing us, and
// other 4xx are about the event, not the endpoint.
func signal(v policy.Verdict, code int) state.Signal {
	switch {
	case v.Kind == policy.Success:
		return state.SignalSuccess
	case v.Kind == policy.Retry && code != http.StatusTooManyRequests:
		return state.SignalFailure
	}
	return state.SignalNone
}

// errorClass groups a failed attempt for the attempts table: by the
// response's status class, the success rule, or the transport failure.
func errorClass(v policy.Verdict, code int) string {
	switch {
	case v.Kind == policy.Success:
		return ""
	case strings.HasPrefix(v.Reason, policy.ReasonBlockedTarget):
		return policy.ReasonBlockedTarget
	case strings.HasPrefix(v.Reason, "body rule"):
		return "body_rule"
	case code >= 500:
		return "http_5xx"
	case code >= 400:
		return "http_4xx"
	case code > 0:
		return fmt.Sprintf("http_%dxx", code/100)
	case strings.HasPrefix(v.Reason, "timeout"):
		return "timeout"
	}
	return "connection"
}

// responseSnippet is the start of a response body as stored: at most 1 KiB
// of valid UTF-8.
func responseSnippet(b []byte) string {
	const max = 1 << 10
	if len(b) > max {
		b = b[:max]
	}
	return strings.ReplaceAll(strings.ToValidUTF8(string(b), ""), "\x00", "")
}

// millis is d in fractional milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
