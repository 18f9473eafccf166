package main

import (
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// partnerBooks is a partner's receiver that keeps its own books: per event type,
// the distinct events it accepted and the sum of their payouts, and the
// events it refused. It refuses what a payload asks it to (422: a dead
// letter) and answers 503 to late ones (retried, so still pending).
type partnerBooks struct {
	*httptest.Server
	mu       sync.Mutex
	accepted map[string]map[string]bool // event type → webhook-ids
	refused  map[string]map[string]bool
	late     int
	tries    map[string]int // per webhook-id, for flaky events
}

func newPartnerBooks(t *testing.T) *partnerBooks {
	tl := &partnerBooks{accepted: map[string]map[string]bool{}, refused: map[string]map[string]bool{}, tries: map[string]int{}}
	tl.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Kind   string `json:"kind"`
			Answer int    `json:"answer"`
		}
		_ = json.Unmarshal(body, &p)
		tl.mu.Lock()
		defer tl.mu.Unlock()
		book := tl.accepted
		id := r.Header.Get("webhook-id")
		if tl.tries[id]++; p.Answer == -1 && tl.tries[id] == 1 {
			p.Answer = http.StatusServiceUnavailable // flaky: once, then fine
		} else if p.Answer == -1 {
			p.Answer = 0
		}
		switch p.Answer {
		case http.StatusServiceUnavailable:
			tl.late++
			w.WriteHeader(p.Answer)
			return
		case http.StatusUnprocessableEntity:
			book = tl.refused
		}
		if book[p.Kind] == nil {
			book[p.Kind] = map[string]bool{}
		}
		book[p.Kind][id] = true
		if p.Answer != 0 {
			w.WriteHeader(p.Answer)
		}
	}))
	t.Cleanup(tl.Close)
	return tl
}

func (tl *partnerBooks) count(book map[string]map[string]bool) map[string]int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	out := map[string]int{}
	for k, ids := range book {
		out[k] = len(ids)
	}
	return out
}

// reportJSON is what `postbox report --json` prints.
type reportJSON struct {
	From, To, TZ string
	Days         []struct {
		Endpoint     string             `json:"endpoint"`
		Day          string             `json:"day"`
		EventType    string             `json:"event_type"`
		Committed    int                `json:"committed"`
		Delivered    int                `json:"delivered"`
		DeadLettered int                `json:"dead_lettered"`
		Pending      int                `json:"pending"`
		Sums         map[string]float64 `json:"sums"`
	} `json:"days"`
}

// TestReportMatchesTheReceiversCount: against a running relay, the day's
// report of an endpoint counts per event type what its receiver counted:
// delivered what it accepted, dead-lettered what it refused, pending what
// it keeps answering 503 to, and the payouts it was sent; --all holds the
// same rows; the day's CSV has one line per event, with the receiver's
// verdict as its final status and status code.
func TestReportMatchesTheReceiversCount(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	tl := newPartnerBooks(t)
	other := newPartnerBooks(t)
	_, cfg := streamingRelay(t, dbURL, pool, "report_sum: [payout]\nsearch_keys: [click_id]\nendpoints:\n  partner:\n    url: "+tl.URL+"/pb?aff=7\n"+
		"    backoff_base: 1h\n    failure_threshold: 1000\n  other:\n    url: "+other.URL+"\n")
	// 40 FTDs (5 refused), 25 clicks (3 refused, 2 late), 4 late refunds,
	// and the other partner's 7 FTDs.
	_, err := pool.Exec(t.Context(), `
		INSERT INTO postbox.outbox (endpoint, event_type, payload)
		SELECT 'partner', kind, jsonb_build_object('kind', kind, 'click_id', 'c_' || kind || i, 'payout', (i * 1.25)::text, 'answer', answer)
		FROM (SELECT 'ftd' AS kind, i, CASE WHEN i % 8 = 0 THEN 422 ELSE 0 END AS answer FROM generate_series(1, 40) i
		      UNION ALL SELECT 'click', i, CASE WHEN i <= 3 THEN 422 WHEN i <= 5 THEN 503 ELSE 200 END FROM generate_series(1, 25) i
		      UNION ALL SELECT 'refund', i, 503 FROM generate_series(1, 4) i) v`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO postbox.outbox (endpoint, event_type, payload)
		SELECT 'other', 'ftd', jsonb_build_object('kind', 'ftd', 'payout', 1000, 'answer', CASE WHEN i <= 2 THEN -1 ELSE 0 END) FROM generate_series(1, 7) i`)
	require.NoError(t, err)
	waitForT(t, 60*time.Second, "every event answered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status IN ('delivered', 'dead_letter', 'failed') AND attempt_count > 0`) == 76
	})
	waitForT(t, 30*time.Second, "the other partner's flaky events delivered at their second attempt", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'other' AND status = 'delivered'`) == 7
	})
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'other' AND attempt_count = 2`))
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered' AND last_error IS NOT NULL`),
		"a delivery's last error is cleared when it succeeds")
	accepted, refused := tl.count(tl.accepted), tl.count(tl.refused)
	require.Equal(t, map[string]int{"ftd": 35, "click": 20}, accepted)
	require.Equal(t, map[string]int{"ftd": 5, "click": 3}, refused)

	// Each attempt recorded its target as sent, query included, beside
	// the target the log and the pages show.
	require.Equal(t, queryInt(t, pool, `SELECT count(*) FROM postbox.all_attempts WHERE endpoint = 'partner'`),
		queryInt(t, pool, `SELECT count(*) FROM postbox.all_attempts WHERE endpoint = 'partner' AND sent = $1 AND target = $2`,
			tl.URL+"/pb?aff=7", tl.URL+"/pb"))
	var oneID string
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT e.event_id::text FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id
		WHERE e.endpoint = 'partner' AND d.status = 'delivered' LIMIT 1`).Scan(&oneID))
	code, out, errOut := postbox(t, "event", oneID, "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "aff=7", "the query is shown only with log_payloads")
	withPayloads := writeConfig(t, dbURL, "log_payloads: true\nendpoints:\n  partner:\n    url: "+tl.URL+"/pb\n")
	code, out, errOut = postbox(t, "event", oneID, "--config", withPayloads)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "sent as "+tl.URL+"/pb?aff=7")

	day := time.Now().UTC().Format(time.DateOnly)
	code, out, errOut = postbox(t, "report", "--config", cfg, "--endpoint", "partner", "--from", day, "--to", day, "--json")
	require.Equal(t, exitOK, code, errOut)
	var rep reportJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	got := map[string][4]int{}
	sums := map[string]float64{}
	for _, d := range rep.Days {
		require.Equal(t, day, d.Day)
		got[d.EventType] = [4]int{d.Committed, d.Delivered, d.DeadLettered, d.Pending}
		sums[d.EventType] = d.Sums["payout"]
	}
	want := map[string][4]int{}
	for kind, committed := range map[string]int{"ftd": 40, "click": 25, "refund": 4} {
		want[kind] = [4]int{committed, accepted[kind], refused[kind], committed - accepted[kind] - refused[kind]}
	}
	require.Equal(t, want, got, "the report counts what the receiver counted")
	require.Equal(t, map[string]float64{"ftd": 1.25 * 820, "click": 1.25 * 325, "refund": 1.25 * 10}, sums)

	code, out, errOut = postbox(t, "report", "--config", cfg, "--all", "--from", day, "--to", day, "--json")
	require.Equal(t, exitOK, code, errOut)
	var all reportJSON
	require.NoError(t, json.Unmarshal([]byte(out), &all), out)
	require.Len(t, all.Days, 4)
	for _, d := range all.Days {
		if d.Endpoint == "other" {
			require.Equal(t, 7, d.Committed)
			require.Equal(t, other.count(other.accepted)["ftd"], d.Delivered)
			require.Equal(t, 7000.0, d.Sums["payout"])
			continue
		}
		require.Equal(t, got[d.EventType], [4]int{d.Committed, d.Delivered, d.DeadLettered, d.Pending})
	}

	code, out, errOut = postbox(t, "report", "--config", cfg, "--endpoint", "partner", "--from", day, "--to", day)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "SUM payout")
	require.Regexp(t, `total\s+69\s+55\s+8\s+6\s+1443.75`, out)

	code, out, errOut = postbox(t, "report", "--config", cfg, "--endpoint", "partner", "--deliveries", day)
	require.Equal(t, exitOK, code, errOut)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err)
	require.Equal(t, []string{"event_id", "event_type", "search_keys", "committed_at", "first_attempt", "delivered_at", "attempts", "final_status", "last_status_code"}, recs[0])
	require.Len(t, recs, 70)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, r := range recs[1:] {
		id, kind, status, code := r[0], r[1], r[7], r[8]
		require.Contains(t, r[2], `"click_id": "c_`+kind, r)
		require.NotEmpty(t, r[3])
		require.NotEmpty(t, r[4], "every event was attempted")
		switch {
		case tl.accepted[kind][id]:
			require.Equal(t, []string{"delivered", "200", "1"}, []string{status, code, r[6]}, r)
			require.NotEmpty(t, r[5])
			require.GreaterOrEqual(t, r[5], r[4], "delivered after its first attempt started")
		case tl.refused[kind][id]:
			require.Equal(t, []string{"dead_letter", "422"}, []string{status, code}, r)
			require.Empty(t, r[5])
		default:
			require.Equal(t, []string{"failed", "503"}, []string{status, code}, r)
		}
	}
}

// TestEventsByTypeAndPages: `postbox events --type` finds one type only,
// and --after pages on past the 1,000 a page holds, newest first, each
// event once.
func TestEventsByTypeAndPages(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	cfg := writeConfig(t, dbURL, "")
	code, _, errOut := postbox(t, "migrate", "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	// 2,500 events, a few in the same millisecond, of two types.
	_, err := pool.Exec(t.Context(), `
		INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, committed_at)
		SELECT gen_random_uuid(), 'archive', CASE WHEN i % 5 = 0 THEN 'ftd' ELSE 'click' END, '{}', now(),
		       now() - (i / 3) * interval '1 millisecond'
		FROM generate_series(1, 2500) i`)
	require.NoError(t, err)

	pages := func(args ...string) (all eventsJSON, n int) {
		after := ""
		for {
			a := append([]string{"events", "--config", cfg, "--json"}, args...)
			if after != "" {
				a = append(a, "--after", after)
			}
			code, out, errOut := postbox(t, a...)
			require.Equal(t, exitOK, code, errOut)
			var page eventsJSON
			require.NoError(t, json.Unmarshal([]byte(out), &page), out)
			all, n = append(all, page...), n+1
			_, next, ok := strings.Cut(strings.TrimSpace(errOut), "--after ")
			if !ok {
				return all, n
			}
			after = next
		}
	}
	all, n := pages("--limit", "1000")
	require.Len(t, all, 2500)
	require.Equal(t, 3, n)
	seen := map[string]bool{}
	for i, e := range all {
		require.False(t, seen[e.EventID], "each event once")
		seen[e.EventID] = true
		if i > 0 {
			require.False(t, e.CommittedAt.After(*all[i-1].CommittedAt), "newest first")
		}
	}
	ftd, _ := pages("--type", "ftd", "--limit", "150")
	require.Len(t, ftd, 500)
	for _, e := range ftd {
		require.Equal(t, "ftd", e.EventType)
	}
	code, out, _ := postbox(t, "events", "--config", cfg, "--type", "ftd", "--limit", "10")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "the next page: --after ")
	code, _, errOut = postbox(t, "events", "--config", cfg, "--after", "yesterday")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--after")
}
