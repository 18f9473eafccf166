package deliver_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/deliver"
)

// TestUserInfoBecomesBasicAuth: a target URL's user information is sent as
// basic authentication, unless a configured Authorization header says
// otherwise.
func TestUserInfoBecomesBasicAuth(t *testing.T) {
	t.Parallel()
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	u.User = url.UserPassword("partner", "s3cret")
	c := deliver.NewClient(deliver.Options{})

	resp := c.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodGet, URL: u.String(), Timeout: 2 * time.Second})
	require.NoError(t, resp.Err)
	require.Equal(t, "Basic cGFydG5lcjpzM2NyZXQ=", <-got)

	resp = c.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodGet, URL: u.String(), Timeout: 2 * time.Second,
		Header: http.Header{"Authorization": {"Bearer configured"}}})
	require.NoError(t, resp.Err)
	require.Equal(t, "Bearer configured", <-got)
}

// TestTransportErrorsNameTheRequest: a failed attempt's error is a
// *url.Error naming the method, as http.Client's are, so that the retry
// policy and the redaction of URLs in reasons treat it alike; its URL has
// no query string or user info, wherever the error is shown.
func TestTransportErrorsNameTheRequest(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now: refused

	c := deliver.NewClient(deliver.Options{})
	resp := c.Do(context.Background(), deliver.Request{EventID: "e", Method: http.MethodPost, URL: "http://partner:s3cret@" + addr + "/pb?click_id=c1",
		Body: []byte("{}"), Timeout: 2 * time.Second})
	var ue *url.Error
	require.True(t, errors.As(resp.Err, &ue), "%T %v", resp.Err, resp.Err)
	require.Equal(t, "Post", ue.Op)
	require.Equal(t, "http://"+addr+"/pb", ue.URL)
	require.Contains(t, ue.Err.Error(), "refused")
	require.NotContains(t, resp.Err.Error(), "click_id")
	require.NotContains(t, resp.Err.Error(), "s3cret")
}

// TestResponseBodyIsReadUpToItsBound: a body of a declared length is read
// whole, one without a length up to MaxResponseBody, and none is none.
func TestResponseBodyIsReadUpToItsBound(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", deliver.MaxResponseBody+1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sized":
			w.Header().Set("Content-Length", "8")
			_, _ = io.WriteString(w, "accepted")
		case "/chunked":
			_, _ = io.WriteString(w, big[:10])
			w.(http.Flusher).Flush() // no length: sent chunked
			_, _ = io.WriteString(w, big[10:])
		case "/large":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			_, _ = io.WriteString(w, big)
		case "/short":
			// Declares more than it sends, then closes the connection.
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, "partial")
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	c := deliver.NewClient(deliver.Options{})
	do := func(method, path string) deliver.Response {
		return c.Do(context.Background(), deliver.Request{EventID: "e", Method: method, URL: srv.URL + path, Timeout: 5 * time.Second})
	}

	resp := do(http.MethodGet, "/sized")
	require.NoError(t, resp.Err)
	require.Equal(t, "accepted", string(resp.Body))
	for _, path := range []string{"/chunked", "/large"} {
		resp = do(http.MethodGet, path)
		require.NoError(t, resp.Err, path)
		require.Equal(t, big[:deliver.MaxResponseBody], string(resp.Body), path)
	}
	resp = do(http.MethodGet, "/short")
	require.NoError(t, resp.Err, "the status arrived; the body's end did not")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "partial", string(resp.Body))
	resp = do(http.MethodGet, "/none")
	require.NoError(t, resp.Err)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Empty(t, resp.Body)
	resp = do(http.MethodHead, "/sized")
	require.NoError(t, resp.Err)
	require.Empty(t, resp.Body)
}
