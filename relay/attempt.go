package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/deliver"
	"github.com/postbox-relay/postbox/relay/dispatch"
	"github.com/postbox-relay/postbox/relay/policy"
	"github.com/postbox-relay/postbox/relay/store"
)

// target is an event's resolved request target, or the reason it has none.
type target struct {
	ep     config.Endpoint
	url    string
	reason string // a dead-letter reason, "" when deliverable
}

// resolve decides where an event goes under cfg. The reasons are SPEC §11's:
// each starts with its code, so dead letters group by it.
func resolve(cfg *config.Config, endpoint, rowURL string, payloadLen int, invalid string) target {
	ep := cfg.Endpoint(endpoint)
	t := target{ep: ep, url: rowURL}
	if t.url == "" {
		t.url = ep.URL
	}
	switch {
	case invalid != "":
		t.reason = invalid
	case t.url == "":
		t.reason = fmt.Sprintf("%s: no endpoint %q is configured and the row has no url", policy.ReasonUnknownEndpoint, endpoint)
	case payloadLen > int(cfg.MaxBody):
		t.reason = fmt.Sprintf("%s: %d bytes is above max_body (%d)", policy.ReasonPayloadTooLarge, payloadLen, cfg.MaxBody)
	default:
		if err := config.ValidateURL(t.url); err != nil {
			t.reason = fmt.Sprintf("%s: %v", policy.ReasonInvalidURL, err)
		}
	}
	return t
}

// forbiddenHeaders cannot be set by configuration or by a row: hop-by-hop
// headers, framing, and the signature headers.
var forbiddenHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Host": true,
	"Content-Length": true, "Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	"Idempotency-Key": true,
}

func requestHeader(ep config.Endpoint, rowHeaders []byte) http.Header {
	h := http.Header{}
	for k, v := range ep.Headers {
		if !forbiddenHeaders[http.CanonicalHeaderKey(k)] {
			h.Set(k, v)
		}
	}
	if len(rowHeaders) > 0 {
		var m map[string]any
		if json.Unmarshal(rowHeaders, &m) == nil {
			for k, v := range m {
				if forbiddenHeaders[http.CanonicalHeaderKey(k)] || strings.ContainsAny(k, " :\r\n") {
					continue
				}
				if s, ok := v.(string); ok && !strings.ContainsAny(s, "\r\n") {
					h.Set(k, s)
				}
			}
		}
	}
	return h
}

// execute makes one attempt for a job and decides what follows.
func (r *Relay) execute(ctx context.Context, j *dispatch.Job) store.Result {
	cfg := r.cfg.Load()
	res := store.Result{DeliveryID: j.DeliveryID, Endpoint: j.Endpoint, CommitToDeliveryMS: -1}
	t := resolve(cfg, j.Endpoint, j.URL, len(j.Payload), "")
	if t.reason != "" {
		res.Status, res.Attempted, res.LastError, res.At = store.StatusDeadLetter, true, t.reason, r.now()
		r.log.Warn().Str("event_id", j.EventID).Str("endpoint", j.Endpoint).Str("reason", t.reason).Msg("dead letter")
		return res
	}
	ep := t.ep
	// Held back (breaker open or half-open, or paused by the receiver):
	// back to the queue without spending an attempt; claims skip the
	// endpoint until it may be tried again.
	if hold, _ := r.guard.holdUntil(j.Endpoint, ep.FailureThreshold, j.Probe, r.owner, r.now()); hold {
		return dispatch.Released(j)
	}
	if !ep.RateLimit.IsZero() {
		// Above the rate the event waits, holding only its own endpoint's
		// slot; it never fails for it.
		if err := r.limit.wait(ctx, j.Endpoint, ep.RateLimit); err != nil {
			return dispatch.Released(j)
		}
	}
	req := deliver.Request{
		EventID: j.EventID,
		Method:  ep.Method,
		URL:     t.url,
		Header:  requestHeader(ep, j.Headers),
		Secrets: ep.Secrets,
		Timeout: ep.Timeout,
	}
	if ep.Method != http.MethodGet {
		req.Body = j.Payload
	}
	resp := r.client.Do(ctx, req)
	res.At = r.now()
	if ctx.Err() != nil && resp.Err != nil {
		// Shutdown ran out of grace: hand the delivery back untouched.
		return dispatch.Released(j)
	}
	res.Attempted, res.Sampled = true, true
	res.ResponseMS = int(resp.Duration.Milliseconds())
	res.StatusCode = resp.StatusCode
	res.Response = responseSnippet(resp.Body)
	v := policy.Classify(policy.Attempt{StatusCode: resp.StatusCode, Header: resp.Header, Body: resp.Body,
		Err: resp.Err, Timeout: ep.Timeout}, ep)
	res.LastError = v.Reason
	res.Signal = signal(v, resp.StatusCode)
	r.guard.observe(j.Endpoint, res.Signal, res.At)
	if resp.StatusCode == http.StatusTooManyRequests || v.RetryAfter > 0 {
		// The receiver asks for less: the whole endpoint waits, so the
		// other queued events do not burn their attempts meanwhile.
		res.Pause = v.RetryAfter
		if res.Pause == 0 {
			res.Pause = policy.Backoff(j.Attempt, ep.BackoffBase, ep.BackoffCap, r.rand)
		}
		res.Pause = min(res.Pause, ep.BackoffCap)
	}
	ev := r.log.Debug()
	switch {
	case v.Kind == policy.Success:
		res.Status, res.LastError = store.StatusDelivered, ""
		if !j.CommittedAt.IsZero() {
			res.CommitToDeliveryMS = int(res.At.Sub(j.CommittedAt).Milliseconds())
		}
	case v.Kind == policy.Retry && j.Attempt < ep.MaxAttempts:
		res.Status = store.StatusFailed
		res.Delay = policy.Backoff(j.Attempt, ep.BackoffBase, ep.BackoffCap, r.rand)
		if v.RetryAfter > 0 || res.Pause > 0 {
			res.Delay = max(res.Pause, min(v.RetryAfter, ep.BackoffCap))
		}
		ev = r.log.Info()
	case v.Kind == policy.Retry:
		res.Status = store.StatusDeadLetter
		res.LastError = fmt.Sprintf("max_attempts (%d) exhausted: %s", ep.MaxAttempts, v.Reason)
		ev = r.log.Warn()
	default:
		res.Status = store.StatusDeadLetter
		ev = r.log.Warn()
	}
	ev.Str("event_id", j.EventID).Str("endpoint", j.Endpoint).Int("attempt", j.Attempt).
		Int("status_code", resp.StatusCode).Dur("duration", resp.Duration).Str("outcome", res.Status).
		Str("reason", res.LastError).Dur("retry_in", res.Delay).Msg("attempt")
	return res
}

// signal is what an attempt says about its endpoint's health: a success,
// or a failure of the endpoint itself (5xx, timeouts, connection errors, a
// body that fails the success rule). A 429 is the receiver pacing us, and
// other 4xx are about the event, not the endpoint.
func signal(v policy.Verdict, code int) store.Signal {
	switch {
	case v.Kind == policy.Success:
		return store.SignalSuccess
	case v.Kind == policy.Retry && code != http.StatusTooManyRequests:
		return store.SignalFailure
	}
	return store.SignalNone
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
