// Package report answers reconciliation questions about one endpoint's
// traffic: per day and event type, how many events were committed, how
// many of them were delivered, dead-lettered or are still pending (Daily,
// from the rollups of migration 038, kept for report_retention), and the
// deliveries of one day, one line each (WriteDayCSV, from the events and
// deliveries themselves, while they are retained).
//
// An event belongs to the day of its commit (its ingest, for one found by
// reconciliation) in the time zone asked for. Rollups are kept per
// quarter hour (UTC), so a day is exact in every zone whose offset is a
// whole number of quarter hours; a zone that is not (local mean time
// before 1900, say) is refused rather than answered approximately.
package report

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is a pgx pool, connection or transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Day is one day's counts of one event type. Committed = Delivered +
// DeadLettered + Pending. Sums holds the report_sum payload fields summed
// over the committed events (fields that no event carried are absent).
type Day struct {
	Day          string             `json:"day"` // YYYY-MM-DD in the time zone asked for
	EventType    string             `json:"event_type"`
	Committed    int64              `json:"committed"`
	Delivered    int64              `json:"delivered"`
	DeadLettered int64              `json:"dead_lettered"`
	Pending      int64              `json:"pending"`
	Sums         map[string]float64 `json:"sums,omitempty"`
}

// EndpointDay is a Day of one endpoint, for reports of all endpoints.
type EndpointDay struct {
	Endpoint string `json:"endpoint"`
	Day
}

// Bucket is the rollups' granularity: every offset of a zone in use is a
// multiple of it.
const Bucket = 15 * time.Minute

// MaxDays bounds one report: 400 days is report_retention's default.
const MaxDays = 800

// Days returns the start of each local day from the one holding from up to
// the one holding to (to itself excluded when it is a day's start), and
// the start of the day after the last.
func Days(from, to time.Time, tz *time.Location) ([]time.Time, error) {
	if tz == nil {
		tz = time.UTC
	}
	if to.Before(from) {
		return nil, fmt.Errorf("report: --to (%s) is before --from (%s)", to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	start := dayStart(from.In(tz))
	var days []time.Time
	for d := start; d.Before(to) || d.Equal(start); d = dayStart(d.AddDate(0, 0, 1)) {
		if len(days) == MaxDays {
			return nil, fmt.Errorf("report: more than %d days", MaxDays)
		}
		if _, off := d.Zone(); off%int(Bucket/time.Second) != 0 {
			return nil, fmt.Errorf("report: time zone %s is %s from UTC on %s, not a whole number of quarter hours", tz, time.Duration(off)*time.Second, d.Format(time.DateOnly))
		}
		days = append(days, d)
	}
	return append(days, dayStart(days[len(days)-1].AddDate(0, 0, 1))), nil
}

// dayStart is midnight of t's day in t's zone (the first instant of the
// day where a transition skips midnight).
func dayStart(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, t.Location())
}

// Daily returns the counts of endpoint per day of tz and event type, from
// the day holding from to the day holding to (to excluded when it is the
// start of a day), days in order and event types by name within a day;
// a day without events has no rows.
func Daily(ctx context.Context, q Querier, endpoint string, from, to time.Time, tz *time.Location) ([]Day, error) {
	days, err := daily(ctx, q, true, endpoint, from, to, tz)
	if err != nil {
		return nil, err
	}
	out := make([]Day, len(days))
	for i, d := range days {
		out[i] = d.Day
	}
	return out, nil
}

// DailyAll is Daily for every endpoint with events in the period, ordered
// by endpoint, then day and event type.
func DailyAll(ctx context.Context, q Querier, from, to time.Time, tz *time.Location) ([]EndpointDay, error) {
	return daily(ctx, q, false, "", from, to, tz)
}

// daily adds up the quarter hours of each local day, from the rollups and
// the deltas not folded into them yet. The rows of one endpoint over a
// month are a few thousand at most, read by index;
// all endpoints' are summed per UTC hour first (every offset that is not
// a whole hour is rare, and this keeps the rows sent down 4 times fewer)
// unless the zone needs the quarter hours.
func daily(ctx context.Context, q Querier, one bool, endpoint string, from, to time.Time, tz *time.Location) ([]EndpointDay, error) {
	if tz == nil {
		tz = time.UTC
	}
	days, err := Days(from, to, tz)
	if err != nil {
		return nil, err
	}
	var rows pgx.Rows
	if one {
		rows, err = q.Query(ctx, `
			SELECT endpoint, bucket, event_type, committed, delivered, dead_lettered, sums
			FROM postbox.report_buckets
			WHERE endpoint = $1 AND bucket >= $2 AND bucket < $3
			UNION ALL
			SELECT endpoint, bucket, event_type, committed, delivered, dead_lettered, sums
			FROM postbox.report_deltas
			WHERE endpoint = $1 AND bucket >= $2 AND bucket < $3`,
			endpoint, days[0], days[len(days)-1])
	} else {
		// Binned from the epoch, not truncated: date_trunc would follow
		// the session's TimeZone.
		grain := "1 hour"
		for _, d := range days {
			if _, off := d.Zone(); off%3600 != 0 {
				grain = "15 minutes" // the quarter hours as they are
			}
		}
		rows, err = q.Query(ctx, `
			SELECT endpoint, date_bin('`+grain+`', bucket, timestamptz '2000-01-01 00:00:00+00'), event_type, sum(committed)::int8, sum(delivered)::int8, sum(dead_lettered)::int8,
			       (SELECT jsonb_object_agg(k, v) FROM (SELECT s.key AS k, sum(s.value::numeric) AS v
			                                            FROM unnest(array_agg(sums)) AS u(j), jsonb_each_text(u.j) AS s GROUP BY s.key) x)
			FROM (SELECT * FROM postbox.report_buckets WHERE bucket >= $1 AND bucket < $2
			      UNION ALL
			      SELECT * FROM postbox.report_deltas WHERE bucket >= $1 AND bucket < $2) b
			GROUP BY 1, 2, 3`,
			days[0], days[len(days)-1])
	}
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer rows.Close()
	type key struct{ endpoint, day, typ string }
	acc := map[key]*EndpointDay{}
	for rows.Next() {
		var ep, typ string
		var bucket time.Time
		var c, d, dl int64
		var sums []byte
		if err := rows.Scan(&ep, &bucket, &typ, &c, &d, &dl, &sums); err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		k := key{ep, bucket.In(tz).Format(time.DateOnly), typ}
		a := acc[k]
		if a == nil {
			a = &EndpointDay{Endpoint: ep, Day: Day{Day: k.day, EventType: typ, Sums: map[string]float64{}}}
			acc[k] = a
		}
		a.Committed += c
		a.Delivered += d
		a.DeadLettered += dl
		if len(sums) > 0 {
			var m map[string]json.Number
			if err := json.Unmarshal(sums, &m); err != nil {
				return nil, fmt.Errorf("report: sums: %w", err)
			}
			for f, n := range m {
				v, err := n.Float64()
				if err != nil {
					return nil, fmt.Errorf("report: sum of %s: %w", f, err)
				}
				a.Sums[f] += v
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	out := make([]EndpointDay, 0, len(acc))
	for _, a := range acc {
		a.Pending = a.Committed - a.Delivered - a.DeadLettered
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Endpoint != b.Endpoint {
			return a.Endpoint < b.Endpoint
		}
		if a.Day.Day != b.Day.Day {
			return a.Day.Day < b.Day.Day
		}
		return a.EventType < b.EventType
	})
	return out, nil
}

// CSVHeader is the first line of WriteDayCSV.
var CSVHeader = []string{"event_id", "event_type", "search_keys", "committed_at", "first_attempt", "delivered_at", "attempts", "final_status", "last_status_code"}

// dayCSV reads a day's events of an endpoint with what became of them,
// in commit order: every delivery of the event (replays too) counted in
// attempts; the first attempt from the attempts kept (and the first
// attempt a delivery keeps on its own row); the final status and the last
// status code those of its latest delivery, or in_flight while an
// instance holds it in memory (under way, no row yet).
//
// No index serves "an endpoint's events by commit time": one more index
// on events would cost every ingest. An event is ingested after it
// commits, so the day's events are among those ingested since the day
// began (events_ingested_at, in ingest order), and the rollups know how
// many there are ($4): the scan stops at the last of them, normally a
// day's traffic of every endpoint later.
const dayCSV = `
SELECT e.event_id::text, e.event_type, coalesce(e.search::text, ''), coalesce(e.committed_at, e.ingested_at),
       CASE WHEN d.first_kept THEN d.kept_first
            ELSE least(d.kept_first, (SELECT min(a.started_at) FROM postbox.attempts a WHERE a.delivery_id = d.first_id)) END,
       d.delivered_at, coalesce(d.attempts, 0),
       coalesce(('{pending,in_flight,failed,delivered,dead_letter,replayed}'::text[])[d.status], 'in_flight'), d.code::int4
FROM (
  SELECT e.id, e.event_id, e.event_type, e.search, e.committed_at, e.ingested_at
  FROM postbox.events e
  WHERE e.ingested_at >= $2 AND e.endpoint = $1
    AND coalesce(e.committed_at, e.ingested_at) >= $2 AND coalesce(e.committed_at, e.ingested_at) < $3
  ORDER BY e.ingested_at
  LIMIT $4
) e
-- Per event, over its deliveries, without a sort per event: the latest
-- delivery's status and code ride on its id in max(ARRAY[id, …]), the
-- first's "attempt kept on the row" mark in min(ARRAY[id, …]).
LEFT JOIN LATERAL (
  SELECT sum(x.attempt_count) AS attempts,
         min(x.delivered_at) FILTER (WHERE x.status = 'delivered') AS delivered_at,
         (max(ARRAY[x.id, array_position('{pending,in_flight,failed,delivered,dead_letter,replayed}'::text[], x.status)]))[2] AS status,
         nullif((max(ARRAY[x.id, coalesce(x.last_status_code, 0)]))[2], 0) AS code,
         min(x.id) AS first_id,
         (min(ARRAY[x.id, (x.attempted_by IS NOT NULL)::int]))[2] = 1 AS first_kept,
         min(x.delivered_at - x.last_response_ms * interval '1 millisecond') FILTER (WHERE x.attempted_by IS NOT NULL) AS kept_first
  FROM postbox.deliveries x WHERE x.event_pk = e.id
) d ON true
ORDER BY coalesce(e.committed_at, e.ingested_at), e.id`

// beginner is a pool or a connection: one that can open the transaction
// the CSV reads in, with the memory to sort a day in (work_mem).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// csvWorkMem is the CSV statement's work_mem: a day of 100,000 events
// sorts in memory, not in temporary files.
const csvWorkMem = "64MB"

// dayCount is how many events of endpoint $1 committed in [$2, $3). A day
// event_retention has begun to purge holds fewer: its scan reads to the
// newest event, and writes those still kept.
const dayCount = `
SELECT coalesce(sum(committed), 0)::int8 FROM (
  SELECT committed FROM postbox.report_buckets WHERE endpoint = $1 AND bucket >= $2 AND bucket < $3
  UNION ALL
  SELECT committed FROM postbox.report_deltas WHERE endpoint = $1 AND bucket >= $2 AND bucket < $3) b`

// csvFlushRows is how many lines are buffered before they are written
// through: a client sees the file coming, and memory stays flat.
const csvFlushRows = 1000

// WriteDayCSV writes the deliveries of endpoint's events committed on day
// (YYYY-MM-DD in tz) as CSV (CSVHeader, times RFC 3339 in UTC with
// milliseconds), row by row as the database sends them. It covers the
// events still kept (event_retention); Daily counts them after that.
func WriteDayCSV(ctx context.Context, q Querier, w io.Writer, endpoint string, day string, tz *time.Location) error {
	if tz == nil {
		tz = time.UTC
	}
	d, err := time.ParseInLocation(time.DateOnly, day, tz)
	if err != nil {
		return fmt.Errorf("report: day %q is not YYYY-MM-DD", day)
	}
	days, err := Days(d, d, tz)
	if err != nil {
		return err
	}
	var count int64
	if err := q.QueryRow(ctx, dayCount, endpoint, days[0], days[1]).Scan(&count); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if b, ok := q.(beginner); ok {
		tx, err := b.Begin(ctx)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		defer func() { _ = tx.Rollback(ctx) }() // it only reads
		if _, err := tx.Exec(ctx, `SELECT set_config('work_mem', $1, true)`, csvWorkMem); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		q = tx
	}
	rows, err := q.Query(ctx, dayCSV, endpoint, days[0], days[1], count)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer rows.Close()
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	rec := make([]string, len(CSVHeader))
	n := 0
	for rows.Next() {
		var id, typ, search, status string
		var committed time.Time
		var first, delivered *time.Time
		var attempts int64
		var code *int32
		if err := rows.Scan(&id, &typ, &search, &committed, &first, &delivered, &attempts, &status, &code); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		rec[0], rec[1], rec[2], rec[3] = id, typ, search, stamp(&committed)
		rec[4], rec[5], rec[6], rec[7] = stamp(first), stamp(delivered), strconv.FormatInt(attempts, 10), status
		rec[8] = ""
		if code != nil {
			rec[8] = strconv.Itoa(int(*code))
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
		if n++; n%csvFlushRows == 0 {
			if cw.Flush(); cw.Error() != nil {
				return cw.Error()
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	cw.Flush()
	return cw.Error()
}

// stamp formats a time for the CSV: UTC, milliseconds, empty for none.
func stamp(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
