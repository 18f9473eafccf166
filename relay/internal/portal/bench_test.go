package portal_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// seedSQL writes $1 events spread evenly over the window $3 before $5,
// to the endpoints $2 in turn, each with one delivery and its attempts:
// one in $4 dead-lettered after three attempts, the rest delivered at
// the first. Event types alternate over four; every event carries a
// click id (search_keys) and a payout.
const seedSQL = `
WITH ev AS (
  INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, committed_at, ingested_at, search)
  SELECT gen_random_uuid(), ($2::text[])[1 + i % cardinality($2::text[])], (ARRAY['click','registration','ftd','deposit'])[1 + (i / 7) % 4],
         jsonb_build_object('click_id', 'c_' || i, 'payout', 12.5), t, t, t + interval '1 ms',
         jsonb_build_object('click_id', 'c_' || i)
  FROM (SELECT i, $5::timestamptz - (i::float8 / $1) * $3::interval AS t FROM generate_series(1, $1) i) s
  RETURNING id, endpoint, created_at
), d AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, created_at, updated_at, delivered_at,
                                  commit_to_delivery_ms, last_response_ms, last_status_code, last_error)
  SELECT id, endpoint, st, CASE WHEN st = 'dead_letter' THEN 3 ELSE 1 END, created_at, created_at + interval '5 ms',
         CASE WHEN st = 'delivered' THEN created_at + interval '4 ms' END, 4, 3,
         CASE WHEN st = 'delivered' THEN 200 ELSE 503 END,
         CASE WHEN st = 'dead_letter' THEN 'max_attempts (3) exhausted: http 503' END
  FROM (SELECT id, endpoint, created_at, CASE WHEN id % $4 = 0 THEN 'dead_letter' ELSE 'delivered' END AS st FROM ev) s
  RETURNING id, endpoint, status, created_at, attempt_count
)
INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome, error_class, error, target, instance)
SELECT d.id, d.endpoint, a, d.created_at + (a - 1) * interval '1 second', 2 + 40 * random(),
       CASE WHEN d.status = 'delivered' THEN 200 ELSE 503 END,
       CASE WHEN d.status = 'delivered' THEN 'delivered' WHEN a < d.attempt_count THEN 'failed' ELSE 'dead_letter' END,
       CASE WHEN d.status <> 'delivered' THEN 'http_5xx' END,
       CASE WHEN d.status <> 'delivered' THEN 'http 503' END,
       'https://' || d.endpoint || '.example/pb', 'seed'
FROM d, generate_series(1, d.attempt_count) a`

// BenchmarkPortalPages times each portal page of one partner with
// 1,000,000 deliveries (events and attempts) over the last 30 days
// across 1,000 endpoints, one in 97 dead-lettered. Seeding takes a few
// minutes; then each page is requested through the portal's handler,
// queries included, by a client holding the partner's session. A day of
// 100,000 more for that partner is its CSV's.
//
//	go test -run '^$' -bench PortalPages -benchtime 5x ./relay/internal/portal
func BenchmarkPortalPages(b *testing.B) {
	bd := setup(b, opts{allowReplay: true})
	eps := make([]string, 1000)
	for i := range eps {
		eps[i] = fmt.Sprintf("partner-%03d", i)
	}
	ctx := context.Background()
	start := time.Now()
	_, err := bd.pool.Exec(ctx, seedSQL, 1_000_000, eps, 30*24*time.Hour, 97, time.Now())
	require.NoError(b, err)
	// A day of 100,000 more for one partner, for its CSV: yesterday (UTC).
	const who = "partner-042"
	yesterday := time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)
	_, err = bd.pool.Exec(ctx, seedSQL, 100_000, []string{who}, 22*time.Hour, 97, yesterday.Add(23*time.Hour))
	require.NoError(b, err)
	_, err = bd.pool.Exec(ctx, `VACUUM ANALYZE postbox.events, postbox.deliveries, postbox.attempts, postbox.latency_histogram`)
	require.NoError(b, err)
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
	require.Equal(b, http.StatusSeeOther, bd.get(b, c, bd.link(b, who, time.Hour)).status)
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
				// Exports are limited per minute: each is a minute later.
				later := bd.now.Load().Add(time.Minute)
				bd.now.Store(&later)
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
