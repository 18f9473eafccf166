package portal_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/seed"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// BenchmarkPortalPages times each portal page of one partner with
// 1,000,000 deliveries (events and attempts) over the last 30 days
// across 1,000 endpoints (package seed: 3 in 100 dead-lettered, 2
// awaiting a retry). Seeding takes minutes; then each page is requested through the portal's handler,
// queries included, by a client holding the partner's session. A day of
// 100,000 more for that partner is its CSV's.
//
//	go test -run '^$' -bench PortalPages -benchtime 5x -timeout 60m ./relay/internal/portal
func BenchmarkPortalPages(b *testing.B) {
	bd := setup(b, opts{allowReplay: true})
	ctx := context.Background()
	start := time.Now()
	// The report's seed: the rollups are written by the schema's triggers
	// as the relay's own rows would write them.
	now := time.Now()
	require.NoError(b, seed.Day(ctx, bd.pool, "", 1_000_000, 1000, now.Add(-30*24*time.Hour), now))
	// A day of 100,000 more for one partner, for its CSV: yesterday (UTC).
	who := seed.Endpoint(42)
	yesterday := time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)
	require.NoError(b, seed.Day(ctx, bd.pool, who, 100_000, 1, yesterday.Add(time.Hour), yesterday.Add(23*time.Hour)))
	require.NoError(b, seed.Analyze(ctx, bd.pool))
	require.NoError(b, telemetry.RefreshPercentiles(ctx, bd.pool))
	b.Logf("seeded 1,100,000 deliveries over 30 days across 1,000 endpoints in %s", time.Since(start).Round(time.Second))
	var eventID, clickID, deadID string
	require.NoError(b, bd.pool.QueryRow(ctx, `
		SELECT event_id::text, payload->>'click_id' FROM postbox.events WHERE endpoint = $1 ORDER BY id DESC LIMIT 1 OFFSET 500`, who).
		Scan(&eventID, &clickID))
	require.NoError(b, bd.pool.QueryRow(ctx, `
		SELECT e.event_id::text FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id
		WHERE e.endpoint = $1 AND d.status = 'dead_letter' LIMIT 1`, who).Scan(&deadID))
	c := client(b)
	require.Equal(b, http.StatusSeeOther, bd.get(b, c, bd.link(b, who, 24*time.Hour)).status)
	pages := []struct{ name, path string }{
		{"deliveries-7d", "/portal/"},
		{"deliveries-30d", "/portal/?period=30d"},
		{"deliveries-dead-30d", "/portal/?period=30d&status=dead_letter"},
		{"deliveries-type-30d", "/portal/?period=30d&type=ftd"},
		{"deliveries-range", "/portal/?since=" + url.QueryEscape(time.Now().Add(-20*24*time.Hour).UTC().Format("2006-01-02")) + "&until=" + url.QueryEscape(time.Now().Add(-10*24*time.Hour).UTC().Format("2006-01-02"))},
		{"search-click-id", "/portal/?period=30d&key=click_id&value=" + clickID},
		{"event", "/portal/events/" + eventID},
		{"event-dead", "/portal/events/" + deadID},
		{"health", "/portal/health"},
		{"verify", "/portal/verify"},
		{"report-30d", "/portal/report"},
		{"report-30d-tz", "/portal/report?tz=Asia%2FKolkata"},
		{"day-csv-100k", "/portal/report/day.csv?day=" + yesterday.Format("2006-01-02")},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				if strings.Contains(p.path, ".csv") {
					// Exports are limited per minute: each is a minute later.
					later := bd.now.Load().Add(time.Minute)
					bd.now.Store(&later)
				}
				resp, err := c.Get(bd.server.URL + p.path)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %s", p.path, resp.Status)
				}
				b.ReportMetric(float64(n), "bytes")
			}
		})
	}
}
