package telemetry_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// event inserts an event committed and ingested at the given times ago
// (committed nil: found by reconciliation) with search document search
// ("" for none), and returns its primary key and event id.
func event(t *testing.T, pool *pgxpool.Pool, endpoint string, committedAgo *time.Duration, ingestedAgo time.Duration, search string) (int64, string) {
	t.Helper()
	var committed *time.Time
	now := time.Now()
	if committedAgo != nil {
		c := now.Add(-*committedAgo)
		committed = &c
	}
	var doc *string
	if search != "" {
		doc = &search
	}
	var pk int64
	var id string
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, commit_lsn, committed_at, ingested_at, search)
		VALUES (gen_random_uuid(), $1, 'conversion', '{}', $2, CASE WHEN $3::timestamptz IS NOT NULL THEN '0/16B3748'::pg_lsn END, $3, $4, $5::jsonb)
		RETURNING id, event_id::text`, endpoint, now.Add(-ingestedAgo), committed, now.Add(-ingestedAgo), doc).Scan(&pk, &id))
	return pk, id
}

// delivery inserts a delivery of event pk and returns its id.
func delivery(t *testing.T, pool *pgxpool.Pool, pk int64, endpoint, status string, attempts int, replayOf *int64) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, replay_of, delivered_at)
		VALUES ($1, $2, $3, $4, $5, CASE WHEN $3 = 'delivered' THEN now() END) RETURNING id`,
		pk, endpoint, status, attempts, replayOf).Scan(&id))
	return id
}

// attempt records attempt n of delivery id, ago in the past.
func attempt(t *testing.T, pool *pgxpool.Pool, deliveryID int64, endpoint string, n int, ago time.Duration, code int, outcome, errText string) {
	t.Helper()
	var status *int
	if code != 0 {
		status = &code
	}
	class := ""
	if errText != "" {
		class = "http_5xx"
	}
	exec(t, pool, `
		INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
		  error_class, error, response, target, instance)
		VALUES ($1, $2, $3, now() - $4 * interval '1 second', 12.5, $5, $6, nullif($7, ''), nullif($8, ''), 'ok', 'https://example.com/hook', 'i1')`,
		deliveryID, endpoint, n, ago.Seconds(), status, outcome, class, errText)
}

func ago(d time.Duration) *time.Duration { return &d }

func ids(es []postboxtype.EventSummary) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.EventID
	}
	return out
}

// explain returns the plan of sql with args, with sequential scans
// discouraged when noSeqScan is set.
func explain(t *testing.T, pool *pgxpool.Pool, noSeqScan bool, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	var plan []string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if noSeqScan {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, `EXPLAIN `+sql, args...)
		if err != nil {
			return err
		}
		plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}))
	return strings.Join(plan, "\n")
}

// TestSearchEventsUseIndexes: a payload key finds its event among many
// through events_search, several keys must all match; a search without
// filters reads the newest events through indexes rather than scanning
// the table (the primary key, then events_ingested_at), and
// a search for a rare status starts from that status's
// partial index.
func TestSearchEventsUseIndexes(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	exec(t, pool, `
		INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at, ingested_at, search)
		SELECT gen_random_uuid(), 'aff', '{}', now(), now() - i * interval '1 second', now() - i * interval '1 second',
		       CASE WHEN i % 10 <> 0 THEN jsonb_build_object('click_id', 'c_' || i, 'sub', 's_' || (i % 7)) END
		FROM generate_series(20000, 1, -1) i`) // ingested in id order, as the ingest numbers them
	exec(t, pool, `INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count)
		SELECT id, endpoint, CASE WHEN id % 4000 = 0 THEN 'dead_letter' ELSE 'delivered' END, 1 FROM postbox.events`)
	exec(t, pool, `ANALYZE postbox.events`)
	exec(t, pool, `ANALYZE postbox.deliveries`)
	var want string
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id::text FROM postbox.events WHERE search->>'click_id' = 'c_8812'`).Scan(&want))

	got, err := telemetry.SearchEvents(ctx, pool, telemetry.EventFilter{Payload: map[string]string{"click_id": "c_8812"}})
	require.NoError(t, err)
	require.Equal(t, []string{want}, ids(got))
	got, err = telemetry.SearchEvents(ctx, pool, telemetry.EventFilter{Payload: map[string]string{"click_id": "c_8812", "sub": "s_6"}})
	require.NoError(t, err)
	require.Equal(t, []string{want}, ids(got), "8812 % 7 is 6")
	got, err = telemetry.SearchEvents(ctx, pool, telemetry.EventFilter{Payload: map[string]string{"click_id": "c_8812", "sub": "s_1"}})
	require.NoError(t, err)
	require.Empty(t, got, "every pair must match")
	require.NotNil(t, got, "an empty answer is a list")

	plan := searchPlan(t, pool, telemetry.EventFilter{Payload: map[string]string{"click_id": "c_8812"}})
	require.Contains(t, plan, "events_search", plan)
	require.NotContains(t, plan, "Seq Scan on events", plan)

	plan = searchPlan(t, pool, telemetry.EventFilter{})
	require.NotContains(t, plan, "Seq Scan on events", plan)
	require.Contains(t, plan, "Index Scan Backward using events_pkey", plan) // the newest, for the bound
	require.Contains(t, plan, "Index Scan using events_ingested_at", plan)   // those ingested since

	dead, err := telemetry.SearchEvents(ctx, pool, telemetry.EventFilter{Status: "dead_letter"})
	require.NoError(t, err)
	require.Len(t, dead, 5)
	plan = searchPlan(t, pool, telemetry.EventFilter{Status: "dead_letter"})
	require.NotContains(t, plan, "Seq Scan", plan)
	require.Contains(t, plan, "deliveries_dead", plan)
}

// searchPlan returns the plans of both statements of a search by f (the
// second with the bound the first returns), sequential scans discouraged
// only when the plans are not what the test asks for anyway.
func searchPlan(t *testing.T, pool *pgxpool.Pool, f telemetry.EventFilter) string {
	t.Helper()
	bound, list, args, err := telemetry.SearchEventsQuery(f)
	require.NoError(t, err)
	var at time.Time
	require.NoError(t, pool.QueryRow(context.Background(), bound, args...).Scan(&at))
	plans := func(noSeqScan bool) string {
		return explain(t, pool, noSeqScan, bound, args...) + "\n" + explain(t, pool, noSeqScan, list, append(args, at)...)
	}
	plan := plans(false)
	if len(f.Payload) > 0 && !strings.Contains(plan, "events_search") {
		// A table this small may be cheaper to scan; the index must serve
		// the search once scanning is not.
		plan = plans(true)
	}
	return plan
}

// TestSearchEventsNewestFirst: events come newest commit first, also one
// ingested late (a catch-up) and one found by reconciliation (no commit
// time: its ingest time counts); filters by endpoint, status of the latest
// delivery, time, and the limit.
func TestSearchEventsNewestFirst(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// Ingest order differs from commit order: late was committed two hours
	// ago and ingested just now.
	pkA, a := event(t, pool, "p", ago(10*time.Minute), 10*time.Minute, "")
	pkLate, late := event(t, pool, "p", ago(2*time.Hour), time.Second, "")
	pkC, c := event(t, pool, "p", ago(5*time.Minute), 5*time.Minute, "")
	pkR, reconciled := event(t, pool, "q", nil, 7*time.Minute, "")
	// a: dead-lettered, then replayed and delivered; late: awaiting retry;
	// c: delivered; reconciled: a dead letter.
	dead := delivery(t, pool, pkA, "p", "replayed", 5, nil)
	delivery(t, pool, pkA, "p", "delivered", 1, &dead)
	delivery(t, pool, pkLate, "p", "failed", 2, nil)
	delivery(t, pool, pkC, "p", "delivered", 1, nil)
	delivery(t, pool, pkR, "q", "dead_letter", 3, nil)

	search := func(f telemetry.EventFilter) []postboxtype.EventSummary {
		t.Helper()
		got, err := telemetry.SearchEvents(ctx, pool, f)
		require.NoError(t, err)
		return got
	}
	all := search(telemetry.EventFilter{})
	require.Equal(t, []string{c, reconciled, a, late}, ids(all), "by commit time, the ingest time when unknown")
	require.Equal(t, "delivered", all[2].Status, "the latest delivery's status")
	require.Equal(t, 6, all[2].Attempts, "the attempts of both deliveries")
	require.Equal(t, "p", all[2].Endpoint)
	require.Equal(t, "conversion", all[2].EventType)
	require.NotNil(t, all[2].CommittedAt)
	require.Nil(t, all[1].CommittedAt, "found by reconciliation")

	// The two ingested last are late and c; the newest two committed are
	// c and reconciled.
	require.Equal(t, []string{c, reconciled}, ids(search(telemetry.EventFilter{Limit: 2})))
	require.Equal(t, []string{c, a, late}, ids(search(telemetry.EventFilter{Endpoint: "p"})))
	require.Equal(t, []string{c, a}, ids(search(telemetry.EventFilter{Status: "delivered"})))
	require.Equal(t, []string{reconciled}, ids(search(telemetry.EventFilter{Status: "dead_letter"})),
		"a replayed dead letter is not the latest delivery of its event")
	require.Equal(t, []string{late}, ids(search(telemetry.EventFilter{Status: "failed"})))
	require.Equal(t, []string{c, reconciled, a}, ids(search(telemetry.EventFilter{Since: time.Now().Add(-time.Hour)})))
	require.Equal(t, []string{reconciled, a}, ids(search(telemetry.EventFilter{
		Since: time.Now().Add(-time.Hour), Until: time.Now().Add(-6 * time.Minute)})))
	require.Equal(t, []string{late}, ids(search(telemetry.EventFilter{Until: time.Now().Add(-time.Hour)})))

	_, err := telemetry.SearchEvents(ctx, pool, telemetry.EventFilter{Status: "lost"})
	require.ErrorIs(t, err, telemetry.ErrUnknownStatus)
	require.Contains(t, err.Error(), "dead_letter")
}

func TestCheckSearchKeys(t *testing.T) {
	t.Parallel()
	require.NoError(t, telemetry.CheckSearchKeys([]string{"click_id", "sub"}, map[string]string{"click_id": "c_1"}))
	require.NoError(t, telemetry.CheckSearchKeys(nil, nil))

	err := telemetry.CheckSearchKeys([]string{"click_id"}, map[string]string{"click_id": "c_1", "order_id": "o_9"})
	require.ErrorIs(t, err, telemetry.ErrSearchKeyNotConfigured)
	require.Contains(t, err.Error(), `"order_id"`)
	require.Contains(t, err.Error(), "search_keys: [click_id, order_id]")
	require.Contains(t, err.Error(), "events ingested before the key was added are not indexed")

	err = telemetry.CheckSearchKeys(nil, map[string]string{"a.b": "x"})
	require.ErrorIs(t, err, telemetry.ErrSearchKeyNotConfigured)
	require.Contains(t, err.Error(), "top-level payload field names")
}

// TestEventStory: an event that went to two endpoints has a story for
// each. On p its delivery was retried and then delivered: one delivery,
// both attempts in order. On q it was dead-lettered and replayed: both
// deliveries, the second pointing at the first, each with its attempts.
// Empty lists encode as [].
func TestEventStory(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	pkP, id := event(t, pool, "p", ago(time.Hour), time.Hour, "")
	var pkQ int64
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO postbox.events (event_id, endpoint, payload, created_at, committed_at, commit_lsn)
		VALUES ($1, 'q', '{}', now(), now(), '0/16B3748') RETURNING id`, id).Scan(&pkQ))
	dp := delivery(t, pool, pkP, "p", "delivered", 2, nil)
	attempt(t, pool, dp, "p", 2, 50*time.Minute, 200, "delivered", "")
	attempt(t, pool, dp, "p", 1, 55*time.Minute, 503, "failed", "http 503")
	dead := delivery(t, pool, pkQ, "q", "replayed", 1, nil)
	attempt(t, pool, dead, "q", 1, 40*time.Minute, 401, "dead_letter", "http 401")
	replay := delivery(t, pool, pkQ, "q", "delivered", 1, &dead)
	attempt(t, pool, replay, "q", 1, 10*time.Minute, 200, "delivered", "")
	queued := delivery(t, pool, pkP, "p", "pending", 0, &dp) // a replay not yet attempted

	stories, err := telemetry.LoadEvent(ctx, pool, strings.ToUpper(id))
	require.NoError(t, err)
	require.Len(t, stories, 2)
	p, q := stories[0], stories[1]
	require.Equal(t, "p", p.Endpoint)
	require.Equal(t, id, p.EventID)
	require.Equal(t, "0/16B3748", p.CommitLSN)
	require.NotNil(t, p.CommittedAt)
	require.Len(t, p.Deliveries, 2)
	require.Equal(t, dp, p.Deliveries[0].ID)
	require.Equal(t, "delivered", p.Deliveries[0].Status)
	require.Nil(t, p.Deliveries[0].ReplayOf)
	require.Len(t, p.Deliveries[0].Attempts, 2)
	first, second := p.Deliveries[0].Attempts[0], p.Deliveries[0].Attempts[1]
	require.Equal(t, 1, first.Attempt)
	require.Equal(t, 503, *first.StatusCode)
	require.Equal(t, "http 503", first.Error)
	require.Equal(t, "http_5xx", first.ErrorClass)
	require.Equal(t, 12.5, first.DurationMS)
	require.Equal(t, "https://example.com/hook", first.Target)
	require.Equal(t, 2, second.Attempt)
	require.Equal(t, 200, *second.StatusCode)
	require.True(t, first.StartedAt.Before(second.StartedAt))
	require.Equal(t, queued, p.Deliveries[1].ID)
	require.Empty(t, p.Deliveries[1].Attempts)

	require.Equal(t, "q", q.Endpoint)
	require.Len(t, q.Deliveries, 2)
	require.Equal(t, "replayed", q.Deliveries[0].Status)
	require.Equal(t, 401, *q.Deliveries[0].Attempts[0].StatusCode)
	require.Equal(t, "delivered", q.Deliveries[1].Status)
	require.Equal(t, dead, *q.Deliveries[1].ReplayOf)
	require.Len(t, q.Deliveries[1].Attempts, 1)
	require.NotNil(t, q.Deliveries[1].DeliveredAt)

	doc, err := json.Marshal(stories)
	require.NoError(t, err)
	require.Contains(t, string(doc), `"attempts":[]`, "an empty list is [], not null")
	require.Contains(t, string(doc), `"replay_of":`+jsonInt(dead))
	require.Contains(t, string(doc), `"commit_lsn":"0/16B3748"`)

	for _, missing := range []string{"00000000-0000-0000-0000-000000000001", "not-a-uuid"} {
		stories, err = telemetry.LoadEvent(ctx, pool, missing)
		require.ErrorIs(t, err, telemetry.ErrEventNotFound)
		require.NotNil(t, stories)
		require.Empty(t, stories)
		require.Contains(t, err.Error(), "no event "+missing)
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestRecentAttemptsAndPerMinute: an endpoint's attempts come newest
// first with their event ids; the per-minute counts cover every minute of
// the range, zeros included, and split delivered from failed.
func TestRecentAttemptsAndPerMinute(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	pk, id := event(t, pool, "p", ago(time.Hour), time.Hour, "")
	d := delivery(t, pool, pk, "p", "delivered", 3, nil)
	attempt(t, pool, d, "p", 1, 3*time.Minute, 500, "failed", "http 500")
	attempt(t, pool, d, "p", 2, 3*time.Minute-time.Second, 0, "failed", "timeout after 15s")
	attempt(t, pool, d, "p", 3, 30*time.Second, 200, "delivered", "")
	attempt(t, pool, 0, "other", 0, 10*time.Second, 200, "delivered", "")

	rows, err := telemetry.RecentAttempts(ctx, pool, "p", 2)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, 3, rows[0].Attempt)
	require.Equal(t, 2, rows[1].Attempt)
	require.Nil(t, rows[1].StatusCode, "no response")
	require.Equal(t, id, rows[0].EventID)
	require.Equal(t, d, rows[0].DeliveryID)
	require.Equal(t, "p", rows[0].Endpoint)
	doc, err := json.Marshal(rows[0])
	require.NoError(t, err)
	require.Contains(t, string(doc), `"event_id":"`+id+`"`)
	require.Contains(t, string(doc), `"attempt":3`)
	_, err = telemetry.RecentAttempts(ctx, pool, "", 10)
	require.Error(t, err)

	minutes, err := telemetry.DeliveriesPerMinute(ctx, pool, 10*time.Minute)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(minutes), 10)
	require.LessOrEqual(t, len(minutes), 11)
	delivered, failed := 0, 0
	for i, m := range minutes {
		require.Zero(t, m.Minute.Second())
		if i > 0 {
			require.Equal(t, time.Minute, m.Minute.Sub(minutes[i-1].Minute), "every minute present")
		}
		delivered += m.Delivered
		failed += m.Failed
	}
	require.Equal(t, 2, delivered)
	require.Equal(t, 2, failed)
	require.WithinDuration(t, time.Now(), minutes[len(minutes)-1].Minute, time.Minute)
}

// TestLatencySeries: p50/p95/p99 per five-minute bin from the
// histograms, within 2 % of the samples', bins outside 24 h left out.
func TestLatencySeries(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	at := func(ago string) string {
		return `postbox.latency_bin(now() - interval '` + ago + `') + interval '1 minute'`
	}
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
		SELECT 'ep', i, 200, 'delivered', `+at("1 hour")+` FROM generate_series(1, 100) i`)
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
		SELECT 'ep', 10 * i, 200, 'delivered', `+at("10 minutes")+` FROM generate_series(1, 200) i`)
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome, started_at)
		SELECT 'ep', 99999, 200, 'delivered', now() - interval '25 hours' FROM generate_series(1, 10)`)
	exec(t, pool, `INSERT INTO postbox.attempts (endpoint, duration_ms, status_code, outcome)
		SELECT 'other', 5, 200, 'delivered' FROM generate_series(1, 10)`)

	series, err := telemetry.LatencySeries(ctx, pool, "ep")
	require.NoError(t, err)
	require.Len(t, series, 2)
	require.True(t, series[0].Bin.Before(series[1].Bin))
	require.Equal(t, time.Duration(0), series[0].Bin.Sub(series[0].Bin.Truncate(5*time.Minute)))
	require.EqualValues(t, 100, series[0].Count)
	require.InEpsilon(t, 50, series[0].P50MS, 0.02)
	require.InEpsilon(t, 95, series[0].P95MS, 0.02)
	require.InEpsilon(t, 99, series[0].P99MS, 0.02)
	require.EqualValues(t, 200, series[1].Count)
	require.InEpsilon(t, 1000, series[1].P50MS, 0.02)
	require.InEpsilon(t, 1900, series[1].P95MS, 0.02)
	require.InEpsilon(t, 1980, series[1].P99MS, 0.02)

	none, err := telemetry.LatencySeries(ctx, pool, "nobody")
	require.NoError(t, err)
	require.NotNil(t, none)
	require.Empty(t, none)
}
