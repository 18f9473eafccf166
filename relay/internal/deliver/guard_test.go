package deliver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/deliver"
	"github.com/postbox-relay/postbox/relay/internal/guard"
)

// A receiver cannot make postbox read more than 64 KiB of response
// headers.
func TestResponseHeadersAreBounded(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 100 {
			w.Header().Set(fmt.Sprintf("X-Pad-%d", i), strings.Repeat("x", 1000))
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	g := guard.Guard{AllowAll: true}
	c := deliver.NewClient(deliver.Options{DialContext: guard.Dialer(func() guard.Guard { return g }, loopbackOnly(t))})
	resp := c.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodPost, URL: srv.URL, Body: []byte("{}"), Timeout: 5 * time.Second})
	require.Error(t, resp.Err)
	require.Contains(t, resp.Err.Error(), "header")
}

// loopbackOnly is a tripwire beneath the guard: these tests send traffic
// to loopback only, so any other address that got past the guard is
// refused here, before its connect, and fails the test.
func loopbackOnly(t *testing.T) func(netip.AddrPort) error {
	return func(ap netip.AddrPort) error {
		if ap.Addr().Unmap().IsLoopback() {
			return nil
		}
		t.Errorf("the guard let %s through to a dial", ap)
		return errors.New("tripwire: not loopback")
	}
}

// TestGuardedDialerNeverConnects: a hostname that resolves to loopback, and
// IPv6 loopback, are refused at connect time; the listening server sees
// nothing.
func TestGuardedDialerNeverConnects(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	c := deliver.NewClient(deliver.Options{DialContext: guard.Dialer(func() guard.Guard { return guard.Guard{} }, loopbackOnly(t))})
	for _, u := range []string{"http://localhost:" + port + "/x?click_id=1", "http://127.0.0.1:" + port + "/", "http://[::ffff:127.0.0.1]:" + port + "/"} {
		resp := c.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodGet, URL: u, Timeout: 2 * time.Second})
		var be *guard.BlockedError
		require.True(t, errors.As(resp.Err, &be), "%s: %v", u, resp.Err)
		require.Contains(t, be.Class, "loopback")
	}
	require.Zero(t, hits.Load(), "nothing reached the server")
	// The same client with the guard open does reach it.
	open := deliver.NewClient(deliver.Options{DialContext: guard.Dialer(func() guard.Guard { return guard.Guard{AllowAll: true} }, loopbackOnly(t))})
	resp := open.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodGet, URL: srv.URL, Timeout: 2 * time.Second})
	require.NoError(t, resp.Err)
	require.EqualValues(t, 1, hits.Load())
}

// TestRedirectsAreNeverFollowed: an allowed receiver redirecting to a
// private address gets its 3xx back as the answer; the target sees nothing.
func TestRedirectsAreNeverFollowed(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	inner, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })}
	go func() { _ = target.Serve(inner) }()
	defer target.Close()
	redirector := httptest.NewServer(http.RedirectHandler("http://"+inner.Addr().String()+"/admin", http.StatusFound))
	defer redirector.Close()
	g := guard.Guard{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	c := deliver.NewClient(deliver.Options{DialContext: guard.Dialer(func() guard.Guard { return g }, loopbackOnly(t))})
	resp := c.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodPost, URL: redirector.URL, Body: []byte("{}"), Timeout: 2 * time.Second})
	require.NoError(t, resp.Err)
	require.Equal(t, http.StatusFound, resp.StatusCode)
	require.Zero(t, hits.Load())
}
