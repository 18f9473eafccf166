// Package policy decides what happens after an attempt: success, retry
// (and when), or dead letter. It holds the backoff, the classification of
// responses and errors, and the partners' success rules.
package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/guard"
)

// Backoff returns the wait before retry n (n ≥ 1 is the number of attempts
// made so far): uniform(0, min(base·2^(n-1), cap)), "full jitter". rnd
// returns a float in [0,1); nil means math/rand/v2.
func Backoff(n int, base, cap time.Duration, rnd func() float64) time.Duration {
	if n < 1 {
		n = 1
	}
	ceiling := cap
	if n-1 < 62 {
		if d := base << (n - 1); d > 0 && d < cap && d>>(n-1) == base {
			ceiling = d
		}
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	return time.Duration(rnd() * float64(ceiling))
}

// Kind is the class of an attempt's outcome.
type Kind int

const (
	// Success: the delivery is done.
	Success Kind = iota
	// Retry: a transient failure; try again after a backoff.
	Retry
	// Permanent: retrying cannot help; dead-letter at once.
	Permanent
)

func (k Kind) String() string {
	return [...]string{"success", "retry", "permanent"}[k]
}

// Verdict is the classification of one attempt.
type Verdict struct {
	Kind Kind
	// Reason is a short, log-safe description: "http 503", "timeout",
	// "body rule: response lacks \"success=true\"".
	Reason string
	// RetryAfter is the receiver's Retry-After (429, 503), capped by the
	// caller at backoff_cap; zero when absent.
	RetryAfter time.Duration
}

// Attempt is what the classifier looks at.
type Attempt struct {
	StatusCode int
	Header     http.Header
	Body       []byte // the first bytes of the response body
	Err        error  // transport error; StatusCode is 0 then
	Timeout    time.Duration
}

// ReasonMessagesOff: the event was written with outbox.Emit (a logical
// decoding message) while outbox_messages is off; it is never attempted.
const ReasonMessagesOff = "messages_off"

// Permanent failure reasons that are not HTTP statuses.
const (
	ReasonUnknownEndpoint = "unknown_endpoint"
	ReasonInvalidURL      = "invalid_url"
	ReasonBlockedTarget   = "blocked_target"
	ReasonPayloadTooLarge = "payload_too_large"
	ReasonTemplateError   = "template_error"
	// ReasonRowURLNotAllowed: the row named an endpoint configured with a
	// url, gave its own, and the endpoint does not allow_row_url.
	ReasonRowURLNotAllowed = "row_url_not_allowed"
	// ReasonNoSubscriber: the row named no endpoint, and no enabled
	// endpoint was subscribed to its event type (or its filter held): the
	// row is kept as a dead letter under endpoint "" rather than dropped.
	ReasonNoSubscriber = "no_subscriber"
)

// Classify decides an attempt's outcome for endpoint ep. Transport errors
// and status codes are classified by go-retryablehttp's policy (so TLS
// certificate, scheme and redirect errors are permanent, connection errors
// and 429/5xx except 501 retried), widened by 408 and 425 and by
// the endpoint's retry_on. A response that passes the status check but not
// the endpoint's success rule is a failure of its status's class.
func Classify(a Attempt, ep config.Endpoint) Verdict {
	if a.Err != nil {
		return classifyError(a)
	}
	code := a.StatusCode
	if isSuccessStatus(code, ep.Success) {
		if ep.Success.BodyContains != "" && !strings.Contains(string(a.Body), ep.Success.BodyContains) {
			kind := Retry
			if ep.Success.BodyMismatch == config.BodyMismatchDeadLetter {
				kind = Permanent
			}
			return Verdict{Kind: kind, Reason: fmt.Sprintf("body rule: http %d response lacks %q", code, ep.Success.BodyContains)}
		}
		return Verdict{Kind: Success, Reason: fmt.Sprintf("http %d", code)}
	}
	reason := fmt.Sprintf("http %d", code)
	if code >= 300 && code < 400 {
		// Redirects are never followed: the receiver must be configured
		// with its final URL.
		return Verdict{Kind: Permanent, Reason: reason + ": redirect not followed"}
	}
	retry := slices.Contains(ep.RetryOn, code) || code == http.StatusRequestTimeout || code == http.StatusTooEarly
	if !retry {
		resp := &http.Response{StatusCode: code, Status: reason, Header: a.Header}
		retry, _ = retryablehttp.ErrorPropagatedRetryPolicy(context.Background(), resp, nil)
	}
	if !retry {
		return Verdict{Kind: Permanent, Reason: reason}
	}
	v := Verdict{Kind: Retry, Reason: reason}
	if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
		// DefaultBackoff with min 0 returns exactly the parsed Retry-After
		// (seconds or HTTP-date) and 0 when there is none.
		resp := &http.Response{StatusCode: code, Header: a.Header}
		v.RetryAfter = retryablehttp.DefaultBackoff(0, ep.BackoffCap, 0, resp)
	}
	return v
}

func isSuccessStatus(code int, s config.Success) bool {
	if len(s.Status) > 0 {
		return slices.Contains(s.Status, code)
	}
	return code >= 200 && code < 300
}

func classifyError(a Attempt) Verdict {
	var blocked *guard.BlockedError
	if errors.As(a.Err, &blocked) {
		return Verdict{Kind: Permanent, Reason: ReasonBlockedTarget + ": " + blocked.Error()}
	}
	if errors.Is(a.Err, context.DeadlineExceeded) {
		return Verdict{Kind: Retry, Reason: fmt.Sprintf("timeout after %s", a.Timeout)}
	}
	retry, _ := retryablehttp.ErrorPropagatedRetryPolicy(context.Background(), nil, a.Err)
	kind := Permanent
	if retry {
		kind = Retry
	}
	return Verdict{Kind: kind, Reason: ErrorReason(a.Err)}
}

// ErrorReason describes a transport error without the request URL (whose
// query string may carry click ids or payouts): *url.Error is unwrapped.
func ErrorReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return truncate(err.Error(), 300)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
