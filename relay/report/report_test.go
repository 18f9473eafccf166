package report_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/report"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// migrated returns a pool on a fresh database with postbox's schema.
func migrated(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, err := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, table))
	return pool
}

// recount is what the rollups must hold, computed from the rows.
const recount = `
SELECT e.endpoint, postbox.report_bucket(e.committed_at, e.ingested_at), e.event_type, count(*),
       count(*) FILTER (WHERE d.delivered), count(*) FILTER (WHERE NOT coalesce(d.delivered, false) AND d.last_status = 'dead_letter')
FROM postbox.events e
LEFT JOIN LATERAL (SELECT bool_or(status = 'delivered') AS delivered, (array_agg(status ORDER BY id DESC))[1] AS last_status
                   FROM postbox.deliveries WHERE event_pk = e.id) d ON true
GROUP BY 1, 2, 3
EXCEPT
SELECT endpoint, bucket, event_type, sum(committed), sum(delivered), sum(dead_lettered)
FROM (SELECT * FROM postbox.report_buckets UNION ALL SELECT * FROM postbox.report_deltas) b
GROUP BY 1, 2, 3`

func requireExact(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM (`+recount+`) x`).Scan(&n))
	require.Zero(t, n, "rollups differ from the rows")
}

// TestRollupsFollowTheRows: each change a delivery goes through (first
// attempt delivered, retries, dead letter, replay, replay delivered, a
// delivered event replayed) leaves the rollups equal to a count of the
// rows, and Daily reads them per local day.
func TestRollupsFollowTheRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := migrated(t)
	_, err := pool.Exec(ctx, `INSERT INTO postbox.report_fields VALUES ('payout')`)
	require.NoError(t, err)

	// Six events of partner "a" on 2026-03-01 22:10 UTC (23:10 in Paris),
	// two of them the next UTC day 00:20 (01:20 Paris), one of "b".
	_, err = pool.Exec(ctx, `
		INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, committed_at)
		SELECT gen_random_uuid(), ep, typ, jsonb_build_object('payout', pay), ts, ts
		FROM (VALUES ('a', 'ftd', '12.50', timestamptz '2026-03-01 22:10Z'),
		             ('a', 'ftd', '7.25', '2026-03-01 22:11Z'),
		             ('a', 'ftd', 'x', '2026-03-01 22:12Z'),
		             ('a', 'click', '0', '2026-03-01 22:13Z'),
		             ('a', 'ftd', '1', '2026-03-02 00:20Z'),
		             ('a', 'click', '1', '2026-03-02 00:21Z'),
		             ('b', 'ftd', '100', '2026-03-01 22:10Z')) v(ep, typ, pay, ts)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO postbox.deliveries (event_pk, endpoint, status) SELECT id, endpoint, 'pending' FROM postbox.events`)
	require.NoError(t, err)
	requireExact(t, pool)

	var ids []int64
	rows, err := pool.Query(ctx, `SELECT d.id FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk ORDER BY e.id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	set := func(status string, id int64) {
		t.Helper()
		_, err := pool.Exec(ctx, `UPDATE postbox.deliveries SET status = $1, delivered_at = CASE WHEN $1 = 'delivered' THEN now() END WHERE id = $2`, status, id)
		require.NoError(t, err)
		requireExact(t, pool)
	}
	replay := func(id int64) int64 {
		t.Helper()
		var nid int64
		require.NoError(t, pool.QueryRow(ctx, `
			WITH old AS (UPDATE postbox.deliveries SET status = CASE status WHEN 'dead_letter' THEN 'replayed' ELSE status END
			             WHERE id = $1 RETURNING event_pk, endpoint)
			INSERT INTO postbox.deliveries (event_pk, endpoint, status, replay_of) SELECT event_pk, endpoint, 'pending', $1 FROM old RETURNING id`, id).Scan(&nid))
		requireExact(t, pool)
		return nid
	}
	set("delivered", ids[0])
	set("failed", ids[1])
	set("dead_letter", ids[1])
	r1 := replay(ids[1])
	set("delivered", r1)
	set("dead_letter", ids[2])
	// The leader folds the deltas; the sums stay what they were.
	st := &store.Store{Pool: pool}
	n, err := st.CompactReport(ctx)
	require.NoError(t, err)
	require.Positive(t, n)
	requireExact(t, pool)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM postbox.report_deltas`).Scan(&left))
	require.Zero(t, left)
	r2 := replay(ids[0]) // a delivered event sent again
	set("dead_letter", r2)
	set("in_flight", ids[3])
	set("delivered", ids[4])
	// A row written delivered at once (as an instance writes those it
	// held in memory), beside a pending one: the event counts once.
	_, err = pool.Exec(ctx, `INSERT INTO postbox.deliveries (event_pk, endpoint, status, delivered_at) SELECT event_pk, endpoint, 'delivered', now() FROM postbox.deliveries WHERE id = $1`, ids[5])
	require.NoError(t, err)
	requireExact(t, pool)
	set("delivered", ids[5])

	paris, err := time.LoadLocation("Europe/Paris")
	require.NoError(t, err)
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, paris)
	days, err := report.Daily(ctx, pool, "a", from, from.AddDate(0, 0, 2), paris)
	require.NoError(t, err)
	require.Equal(t, []report.Day{
		{Day: "2026-03-01", EventType: "click", Committed: 1, Pending: 1, Sums: map[string]float64{"payout": 0}},
		{Day: "2026-03-01", EventType: "ftd", Committed: 3, Delivered: 2, DeadLettered: 1, Sums: map[string]float64{"payout": 19.75}},
		{Day: "2026-03-02", EventType: "click", Committed: 1, Delivered: 1, Sums: map[string]float64{"payout": 1}},
		{Day: "2026-03-02", EventType: "ftd", Committed: 1, Delivered: 1, Sums: map[string]float64{"payout": 1}},
	}, days)

	// All endpoints at once: the same rows for "a", whatever the session's
	// TimeZone, in a whole-hour zone and in a half-hour one.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET TimeZone = 'Asia/Kathmandu'`)
	require.NoError(t, err)
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	for _, tz := range []*time.Location{paris, kolkata} {
		one, err := report.Daily(ctx, pool, "a", from, from.AddDate(0, 0, 2), tz)
		require.NoError(t, err)
		all, err := report.DailyAll(ctx, conn, from, from.AddDate(0, 0, 2), tz)
		require.NoError(t, err)
		var mine []report.Day
		for _, d := range all {
			if d.Endpoint == "a" {
				mine = append(mine, d.Day)
			}
		}
		require.Equal(t, one, mine, tz.String())
	}
	_, err = conn.Exec(ctx, `RESET TimeZone`)
	require.NoError(t, err)

	// In UTC all of 1 March's events are one day, 2 March's another.
	days, err = report.Daily(ctx, pool, "a", time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC), time.UTC)
	require.NoError(t, err)
	require.Len(t, days, 2)
	require.Equal(t, int64(4), days[0].Committed+days[1].Committed)

	var buf bytes.Buffer
	require.NoError(t, report.WriteDayCSV(ctx, pool, &buf, "a", "2026-03-01", paris))
	recs, err := csv.NewReader(&buf).ReadAll()
	require.NoError(t, err)
	require.Equal(t, report.CSVHeader, recs[0])
	require.Len(t, recs, 5)
	statuses := []string{}
	for _, r := range recs[1:] {
		statuses = append(statuses, r[7])
	}
	require.Equal(t, []string{"dead_letter", "delivered", "dead_letter", "in_flight"}, statuses)
}

// TestHalfHourZones: a zone half an hour from UTC is exact; one that is
// not a whole number of quarter hours is refused.
func TestHalfHourZones(t *testing.T) {
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	days, err := report.Days(time.Date(2026, 1, 1, 0, 0, 0, 0, kolkata), time.Date(2026, 1, 3, 0, 0, 0, 0, kolkata), kolkata)
	require.NoError(t, err)
	require.Len(t, days, 3)
	_, err = report.Days(time.Date(1850, 1, 1, 0, 0, 0, 0, kolkata), time.Date(1850, 1, 2, 0, 0, 0, 0, kolkata), kolkata)
	require.ErrorContains(t, err, "quarter hours")
}
