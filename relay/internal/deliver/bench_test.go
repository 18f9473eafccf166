package deliver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
)

// BenchmarkAttempt is one signed POST over a kept-alive connection to a
// local receiver: the relay's per-attempt cost apart from the database.
func BenchmarkAttempt(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	secret, err := outbox.ParseSecret(outbox.NewSecret())
	if err != nil {
		b.Fatal(err)
	}
	c := deliver.NewClient(deliver.Options{})
	body := []byte(`{"type":"conversion","click_id":"clk_7Hq2","payout":"12.50","currency":"EUR"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res := c.Do(ctx, deliver.Request{EventID: "evt_2YzQ8mT3", Method: http.MethodPost, URL: srv.URL, Body: body,
			Secrets: []outbox.Secret{secret}, Timeout: 15 * time.Second})
		if res.Err != nil || res.StatusCode != http.StatusNoContent {
			b.Fatalf("%d %v", res.StatusCode, res.Err)
		}
	}
}
