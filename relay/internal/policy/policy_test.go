package policy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/policy"
)

func TestBackoffIsFullJitterBoundedByCap(t *testing.T) {
	t.Parallel()
	base, cap := 30*time.Second, time.Hour
	top := func() float64 { return 0.999999 }
	for n, want := range map[int]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 4: 4 * time.Minute,
		5: 8 * time.Minute, 7: 32 * time.Minute, 8: time.Hour, 40: time.Hour, 100: time.Hour} {
		got := policy.Backoff(n, base, cap, top)
		require.InDelta(t, float64(want), float64(got), float64(time.Millisecond)*10, "retry %d", n)
	}
	require.Zero(t, policy.Backoff(3, base, cap, func() float64 { return 0 }), "full jitter starts at zero")
	// With the real source every wait stays in [0, ceiling).
	for n := 1; n <= 10; n++ {
		ceiling := min(base<<(n-1), cap)
		for range 200 {
			d := policy.Backoff(n, base, cap, nil)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, ceiling)
		}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	ep := config.Endpoint{BackoffCap: time.Hour}
	for code, want := range map[int]policy.Kind{
		200: policy.Success, 201: policy.Success, 204: policy.Success,
		301: policy.Permanent, 302: policy.Permanent, 307: policy.Permanent,
		400: policy.Permanent, 401: policy.Permanent, 403: policy.Permanent, 404: policy.Permanent,
		405: policy.Permanent, 410: policy.Permanent, 413: policy.Permanent, 422: policy.Permanent,
		408: policy.Retry, 425: policy.Retry, 429: policy.Retry,
		500: policy.Retry, 502: policy.Retry, 503: policy.Retry, 504: policy.Retry,
		501: policy.Permanent,
	} {
		v := policy.Classify(policy.Attempt{StatusCode: code}, ep)
		require.Equal(t, want, v.Kind, "status %d", code)
		require.Contains(t, v.Reason, fmt.Sprint(code))
	}
}

func TestClassifyRetryOnWidens(t *testing.T) {
	t.Parallel()
	ep := config.Endpoint{RetryOn: []int{404, 409}}
	require.Equal(t, policy.Retry, policy.Classify(policy.Attempt{StatusCode: 404}, ep).Kind)
	require.Equal(t, policy.Permanent, policy.Classify(policy.Attempt{StatusCode: 400}, ep).Kind)
}

func TestClassifySuccessRule(t *testing.T) {
	t.Parallel()
	ep := config.Endpoint{Success: config.Success{Status: []int{200}, BodyContains: "success=true"}}
	ok := policy.Classify(policy.Attempt{StatusCode: 200, Body: []byte("success=true;id=1")}, ep)
	require.Equal(t, policy.Success, ok.Kind)
	bad := policy.Classify(policy.Attempt{StatusCode: 200, Body: []byte("success=false; err_msg=unknown click")}, ep)
	require.NotEqual(t, policy.Success, bad.Kind)
	require.Contains(t, bad.Reason, `lacks "success=true"`)
	// 204 is not in the rule's list.
	require.NotEqual(t, policy.Success, policy.Classify(policy.Attempt{StatusCode: 204}, ep).Kind)

	// success=false is retried unless the endpoint says the body's answer
	// is final.
	require.Equal(t, policy.Retry, bad.Kind)
	for mode, kind := range map[string]policy.Kind{"": policy.Retry, config.BodyMismatchRetry: policy.Retry, config.BodyMismatchDeadLetter: policy.Permanent} {
		ep.Success.BodyMismatch = mode
		v := policy.Classify(policy.Attempt{StatusCode: 200, Body: []byte("success=false")}, ep)
		require.Equal(t, kind, v.Kind, mode)
		require.Contains(t, v.Reason, "body rule")
	}
}

func TestRetryAfterBothForms(t *testing.T) {
	t.Parallel()
	ep := config.Endpoint{BackoffCap: time.Hour}
	h := http.Header{"Retry-After": []string{"120"}}
	v := policy.Classify(policy.Attempt{StatusCode: 429, Header: h}, ep)
	require.Equal(t, policy.Retry, v.Kind)
	require.Equal(t, 120*time.Second, v.RetryAfter)
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	v = policy.Classify(policy.Attempt{StatusCode: 503, Header: http.Header{"Retry-After": []string{date}}}, ep)
	require.InDelta(t, float64(90*time.Second), float64(v.RetryAfter), float64(2*time.Second))
	v = policy.Classify(policy.Attempt{StatusCode: 500, Header: h}, ep)
	require.Zero(t, v.RetryAfter, "only 429 and 503 carry Retry-After")
}

func TestClassifyTransportErrors(t *testing.T) {
	t.Parallel()
	ep := config.Endpoint{}
	wrap := func(err error) error {
		return &url.Error{Op: "Post", URL: "https://t.example/pb?click_id=SECRET123", Err: err}
	}
	refused := wrap(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")})
	v := policy.Classify(policy.Attempt{Err: refused}, ep)
	require.Equal(t, policy.Retry, v.Kind)
	require.NotContains(t, v.Reason, "SECRET123", "no query strings in reasons")
	require.NotContains(t, v.Reason, "t.example/pb")

	timeout := policy.Classify(policy.Attempt{Err: wrap(context.DeadlineExceeded), Timeout: 15 * time.Second}, ep)
	require.Equal(t, policy.Retry, timeout.Kind)
	require.Equal(t, "timeout after 15s", timeout.Reason)

	dns := wrap(&net.DNSError{Err: "no such host", Name: "t.example", IsNotFound: true})
	require.Equal(t, policy.Retry, policy.Classify(policy.Attempt{Err: dns}, ep).Kind)

	cert := wrap(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})
	require.Equal(t, policy.Permanent, policy.Classify(policy.Attempt{Err: cert}, ep).Kind)
}
