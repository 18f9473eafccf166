package deliver_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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
