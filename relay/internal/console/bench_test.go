package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// BenchmarkPages times each page with a million deliveries (and their
// events and attempts) in the last 24 hours over ten endpoints: one in 199
// dead-lettered, one in 307 of the last ten minutes awaiting a retry. Seeding takes a minute or
// two; then each page is requested b.N times through the console's
// handler, queries included.
//
//	go test -run '^$' -bench Pages -benchtime 5x ./relay/internal/console
func BenchmarkPages(b *testing.B) {
	tb := setup(b, setupOpts{loopback: true})
	eps := make([]string, 10)
	for i := range eps {
		eps[i] = fmt.Sprintf("partner-%d", i)
	}
	start := time.Now()
	seedHistory(b, tb.pool, 1_000_000, eps, 24*time.Hour, 199, 307)
	// What a relay's maintenance does every minute.
	require.NoError(b, telemetry.RefreshPercentiles(context.Background(), tb.pool))
	b.Logf("seeded 1,000,000 deliveries in %s", time.Since(start).Round(time.Second))
	var eventID, clickID string
	require.NoError(b, tb.pool.QueryRow(context.Background(), `
		SELECT event_id::text, payload->>'click_id' FROM postbox.events WHERE endpoint = 'partner-3' ORDER BY id DESC LIMIT 1 OFFSET 5000`).
		Scan(&eventID, &clickID))
	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"endpoints", "/endpoints"},
		{"endpoint", "/endpoints/partner-3"},
		{"dead-letters", "/dead-letters"},
		{"dead-letters-24h-one-endpoint", "/dead-letters?since=24h&endpoint=partner-3"},
		{"events-newest", "/events"},
		{"events-by-payload", "/events?payload=click_id%3D" + clickID},
		{"events-by-endpoint-status", "/events?endpoint=partner-3&status=dead_letter"},
		{"event", "/events/" + eventID},
	}
	c := &http.Client{}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := c.Get(tb.server.URL + p.path)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %s", p.path, resp.Status)
				}
			}
		})
	}
}
