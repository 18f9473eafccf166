package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Claimed is a delivery claimed from the queue, with its event.
type Claimed struct {
	state.Event
	DeliveryID int64
	// Lane is the delivery's lane when it is not its endpoint's own: the
	// endpoint and its row URL's host (config.Config.Lane).
	Lane         string
	AttemptCount int
	CommittedAt  time.Time // zero when unknown
	// EventPK and Range name an event under way (DeliveryID is 0): its
	// delivery is written when its attempt ends (RecordUnderWay).
	EventPK, Range int64
}

// Key is c's lane key: its Lane, or its endpoint's.
func (c *Claimed) Key() string {
	return state.LaneKey(c.Endpoint, c.Lane)
}

// claimedColumns is what every claim returns, from d (deliveries) and e
// (events).
const claimedColumns = `d.id, d.endpoint, coalesce(d.lane, ''), d.attempt_count, e.event_id::text, coalesce(e.url, ''), e.event_type,
          e.payload::text, e.headers::text, e.created_at, e.committed_at, e.message`

// healthyLane is true for lane %[1]s of endpoint %[2]s when its breaker is
// closed and neither it nor its endpoint is paused: pausing an endpoint
// holds all of its lanes. An endpoint's own lane is its name (both %s the
// same).
const healthyLane = `NOT EXISTS (SELECT 1 FROM postbox.endpoint_health h
  WHERE h.endpoint = %[1]s AND (h.state <> 'closed' OR h.paused_until > now())
     OR h.endpoint = %[2]s AND %[2]s <> %[1]s AND h.paused_until > now())`

// laneName is the endpoint of lane key %s: what comes before its last
// config.LaneSep.
const laneName = `CASE WHEN strpos(%[1]s, ' → ') > 0 THEN regexp_replace(%[1]s, ' → [^→]*$', '') ELSE %[1]s END`

// laneScan is a recursive CTE, name AS (…), of the lanes that have
// deliveries d matching cond: a skip scan, one probe of the partial index
// cond selects per lane, however deep the lane's queue. Its last row is
// NULL.
func laneScan(name, cond string) string {
	return name + ` AS (
  (SELECT coalesce(d.lane, d.endpoint) AS lane FROM postbox.deliveries d WHERE ` + cond + `
   ORDER BY coalesce(d.lane, d.endpoint) LIMIT 1)
  UNION ALL
  SELECT (SELECT coalesce(d.lane, d.endpoint) FROM postbox.deliveries d
          WHERE ` + cond + ` AND coalesce(d.lane, d.endpoint) > s.lane
          ORDER BY coalesce(d.lane, d.endpoint) LIMIT 1)
  FROM ` + name + ` s WHERE s.lane IS NOT NULL
)`
}

// The deliveries the claim looks at (deliveries_pending, deliveries_retry)
// and the parked ones (deliveries_parked, see Park).
const (
	queuedPending = `d.status = 'pending' AND d.next_attempt_at < 'infinity'`
	queuedRetry   = `d.status = 'failed' AND d.next_attempt_at < 'infinity'`
	queuedParked  = `d.status IN ('pending', 'failed') AND d.next_attempt_at = 'infinity'`
)

// dueNow narrows a lane scan to the lanes with a delivery due: a lane
// whose queue is all later (a retry not yet due, a Retry-After) has
// nothing to claim. The scan's probes still read the index in lane order,
// but the index's entries that are not due are skipped in the index
// itself, without a probe, a health check and two claim probes per lane:
// a storm of failing partners leaves thousands of lanes whose only
// deliveries are retries due later.
const dueNow = ` AND d.next_attempt_at <= now()`

// claimSQL claims due deliveries: per lane at most free[lane] (or for a
// lane not listed, its endpoint's cap in $7/$8, or $3), first attempts
// and retries interleaved so neither starves the other, and round-robin
// across lanes under the overall limit $4, so one lane's backlog cannot
// fill a batch. A lane is an endpoint, or an endpoint and a row URL's host
// (config.Config.Lane). The lanes with queued rows are found by skip
// scans (one index probe per lane, however deep its queue). Ordered
// endpoints ($6) are claimed by claimOrderedSQL; lanes with an open
// breaker or a pause wait, and the deliveries of an open breaker's lane
// are parked out of the scans' sight (see Park).
var claimSQL = `
WITH RECURSIVE ` + laneScan("pending_lanes", queuedPending+dueNow) + `,
` + laneScan("retry_lanes", queuedRetry+dueNow) + `,
lanes AS (
  SELECT lane, ` + fmt.Sprintf(laneName, "lane") + ` AS name
  FROM (SELECT lane FROM pending_lanes WHERE lane IS NOT NULL
        UNION
        SELECT lane FROM retry_lanes WHERE lane IS NOT NULL) l
),
caps AS (
  SELECT lanes.lane, coalesce(f.free, g.free, $3) AS free
  FROM lanes
  LEFT JOIN unnest($1::text[], $2::int4[]) AS f(lane, free) ON f.lane = lanes.lane
  LEFT JOIN unnest($7::text[], $8::int4[]) AS g(name, free) ON g.name = lanes.name
  WHERE coalesce(f.free, g.free, $3) > 0
    AND NOT (lanes.name = ANY($6::text[]))
    AND ` + fmt.Sprintf(healthyLane, "lanes.lane", "lanes.name") + `
),
firsts AS (
  SELECT caps.lane, caps.free, d.id, d.next_attempt_at, 0 AS kind FROM caps CROSS JOIN LATERAL (
    SELECT d.id, d.next_attempt_at FROM postbox.deliveries d
    WHERE coalesce(d.lane, d.endpoint) = caps.lane AND ` + queuedPending + ` AND d.next_attempt_at <= now()
    ORDER BY next_attempt_at, id LIMIT caps.free
    FOR UPDATE SKIP LOCKED) d
),
retries AS (
  SELECT caps.lane, caps.free, d.id, d.next_attempt_at, 1 AS kind FROM caps CROSS JOIN LATERAL (
    SELECT d.id, d.next_attempt_at FROM postbox.deliveries d
    WHERE coalesce(d.lane, d.endpoint) = caps.lane AND ` + queuedRetry + ` AND d.next_attempt_at <= now()
    ORDER BY next_attempt_at, id LIMIT caps.free
    FOR UPDATE SKIP LOCKED) d
),
ranked AS (
  SELECT id, lane, free,
         row_number() OVER (PARTITION BY lane ORDER BY rn, kind) AS pos
  FROM (SELECT *, row_number() OVER (PARTITION BY lane, kind ORDER BY next_attempt_at, id) AS rn
        FROM (SELECT * FROM firsts UNION ALL SELECT * FROM retries) u) x
),
picked AS (
  SELECT id FROM ranked WHERE pos <= free ORDER BY pos, lane LIMIT $4
)
UPDATE postbox.deliveries d
SET status = 'in_flight', lease_owner = $5, updated_at = now(), kept = false
FROM postbox.events e
WHERE d.id = ANY(ARRAY(SELECT id FROM picked)) AND e.id = d.event_pk -- by primary key, whatever the statistics say
RETURNING ` + claimedColumns

// claimOrderedSQL claims, for each ordered endpoint, its oldest live
// delivery if that is due and nothing of the endpoint is in flight: one at
// a time, in ingest (commit) order, a failure holding back only its own
// endpoint. The status check in the locking query is re-evaluated on the
// newest row version, so a head another instance just delivered is not
// claimed again.
var claimOrderedSQL = `
WITH heads AS (
  SELECT h.id FROM unnest($1::text[]) AS o(endpoint)
  CROSS JOIN LATERAL (
    SELECT d.id, d.status, d.next_attempt_at FROM postbox.deliveries d
    WHERE d.endpoint = o.endpoint
      AND (d.status IN ('pending', 'failed') OR (d.status = 'in_flight' AND NOT d.kept)) -- deliveries_live_order
    ORDER BY d.id LIMIT 1) h
  WHERE h.status <> 'in_flight' AND h.next_attempt_at <= now()
    AND ` + fmt.Sprintf(healthyLane, "o.endpoint", "o.endpoint") + `
),
locked AS (
  SELECT id FROM postbox.deliveries
  WHERE id IN (SELECT id FROM heads) AND status IN ('pending', 'failed') AND next_attempt_at <= now()
  FOR UPDATE SKIP LOCKED
)
UPDATE postbox.deliveries d
SET status = 'in_flight', lease_owner = $2, updated_at = now(), kept = false
FROM locked, postbox.events e
WHERE d.id = locked.id AND e.id = d.event_pk
RETURNING ` + claimedColumns

// Claim takes due deliveries for owner (a registered instance, see
// Heartbeat). free caps the claim per lane (see config.Config.Lane); a
// lane not in free gets its endpoint's cap in caps, or defaultFree; limit
// caps the total. Ordered endpoints are left to ClaimOrdered.
func (s *Store) Claim(ctx context.Context, owner string, defaultFree int, free, caps map[string]int, limit int, ordered []string) ([]Claimed, error) {
	lanes, frees := unzipCaps(free)
	names, nameCaps := unzipCaps(caps)
	if ordered == nil {
		ordered = []string{}
	}
	return s.claim(ctx, claimSQL, lanes, frees, defaultFree, limit, owner, ordered, names, nameCaps)
}

// LoadOwned reads the deliveries of ids that owner holds in flight, as a
// claim returns them, without writing anything: deliveries the ingest
// wrote in flight for owner and kept by id (dispatch.Dispatcher.ReserveKeep).
// Those no longer owner's (the sweep of another instance took them back,
// thinking this one gone) are left out.
func (s *Store) LoadOwned(ctx context.Context, owner string, ids []int64) ([]Claimed, error) {
	var out []Claimed
	// One round trip: a batch runs in one implicit transaction, to which
	// noTableScan's setting is local.
	b := &pgx.Batch{}
	b.Queue(noTableScan)
	b.Queue(loadOwnedSQL, ids, owner).Query(func(rows pgx.Rows) error {
		var err error
		out, err = collectClaimed(rows)
		return err
	})
	if err := s.Pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

// loadOwnedSQL reaches deliveries by primary key and their events by
// theirs, whatever the statistics (see recordResultsSQL).
const loadOwnedSQL = `
SELECT ` + claimedColumns + `
FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
WHERE d.id = ANY($1) AND d.status IS NOT DISTINCT FROM 'in_flight' AND d.lease_owner IS NOT DISTINCT FROM $2
ORDER BY d.id`

func unzipCaps(m map[string]int) ([]string, []int32) {
	keys := make([]string, 0, len(m))
	vals := make([]int32, 0, len(m))
	for k, n := range m {
		keys = append(keys, k)
		vals = append(vals, int32(n))
	}
	return keys, vals
}

// ClaimOrdered claims the next delivery of each ordered endpoint that has
// nothing in flight.
func (s *Store) ClaimOrdered(ctx context.Context, owner string, endpoints []string) ([]Claimed, error) {
	if len(endpoints) == 0 {
		return nil, nil
	}
	return s.claim(ctx, claimOrderedSQL, endpoints, owner)
}

func (s *Store) claim(ctx context.Context, sql string, args ...any) ([]Claimed, error) {
	rows, err := s.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	out, err := collectClaimed(rows)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

func collectClaimed(rows pgx.Rows) ([]Claimed, error) {
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		c, err := scanClaimed(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func scanClaimed(row pgx.Row) (Claimed, error) {
	return scanClaimedWith(row, false)
}

// scanClaimedWith scans claimedColumns and, with underWay, an event
// under way's id and range after them.
func scanClaimedWith(row pgx.Row, underWay bool) (Claimed, error) {
	var c Claimed
	var payload string
	var headers *string
	var committed *time.Time
	dest := []any{&c.DeliveryID, &c.Endpoint, &c.Lane, &c.AttemptCount, &c.EventID, &c.URL, &c.EventType,
		&payload, &headers, &c.CreatedAt, &committed, &c.Message}
	if underWay {
		dest = append(dest, &c.EventPK, &c.Range)
	}
	if err := row.Scan(dest...); err != nil {
		return c, err
	}
	c.Payload = []byte(payload)
	if headers != nil {
		c.Headers = []byte(*headers)
	}
	if committed != nil {
		c.CommittedAt = *committed
	}
	return c, nil
}

// By id, whatever the statistics. The statements that read or write an
// owner's in-flight deliveries by id (RecordResults, LoadOwned, Rescue)
// test status and lease_owner with IS NOT DISTINCT FROM, which no index
// serves, so the planner reaches the rows only through the primary key
// (neither column is compared with NULL, so the meaning is equality's);
// noTableScan and recordPlans, set for the statement's transaction, take
// away the scans it otherwise guessed on stale statistics.
//
// recordPlans, the recorder's, also rules out nested loops and keeps its
// statements' plans across batches (plan_cache_mode); keyPlans, for
// statements that reach every table by key from the arrays they are
// given, allows nested loops alone and keeps the plan too. Pinned so, a
// plan cannot turn into a scan of a grown table, and it is not paid for
// at every run (docs/benchmarks.md). recordPlans allows the other joins
// again for the statements after it in a transaction.
const (
	noTableScan = `SELECT set_config('enable_seqscan', 'off', true)`
	recordPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_nestloop', 'off', true),
	                      set_config('enable_hashjoin', 'on', true), set_config('enable_mergejoin', 'on', true),
	                      set_config('plan_cache_mode', 'force_generic_plan', true)`
	keyPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	                   set_config('enable_mergejoin', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`
)

const recordResultsSQL = `
WITH u AS (
UPDATE postbox.deliveries d SET
  status = CASE WHEN r.status = 'released'
                THEN CASE WHEN d.attempt_count = 0 THEN 'pending' ELSE 'failed' END
                ELSE r.status END,
  attempt_count = d.attempt_count + CASE WHEN r.attempted THEN 1 ELSE 0 END,
  next_attempt_at = CASE WHEN r.status IN ('failed', 'released') THEN now() + r.delay_s * interval '1 second'
                         ELSE d.next_attempt_at END,
  last_error = CASE WHEN r.attempted THEN nullif(r.last_error, '') ELSE d.last_error END,
  last_status_code = CASE WHEN r.attempted THEN nullif(r.status_code, 0) ELSE d.last_status_code END,
  last_response_ms = CASE WHEN r.attempted THEN r.response_ms ELSE d.last_response_ms END,
  last_response = CASE WHEN r.attempted THEN nullif(r.response, '') ELSE d.last_response END,
  delivered_at = CASE WHEN r.status = 'delivered' THEN r.at ELSE d.delivered_at END,
  commit_to_delivery_ms = CASE WHEN r.status = 'delivered' THEN nullif(r.c2d_ms, -1) ELSE d.commit_to_delivery_ms END,
  attempt_target = CASE WHEN r.inline AND d.attempt_count = 0 THEN nullif(r.target, '') ELSE d.attempt_target END,
  attempted_by = CASE WHEN r.inline AND d.attempt_count = 0 THEN $11 ELSE d.attempted_by END,
  lease_owner = NULL, updated_at = now()
FROM unnest($1::int8[], $2::text[], $3::float8[], $4::bool[], $5::text[], $6::int4[], $7::float4[], $8::text[], $9::timestamptz[], $10::float4[],
            $12::bool[], $13::text[])
  AS r(id, status, delay_s, attempted, last_error, status_code, response_ms, response, at, c2d_ms, inline, target)
WHERE d.id = ANY($1) AND d.id = r.id
  AND d.status IS NOT DISTINCT FROM 'in_flight' AND d.lease_owner IS NOT DISTINCT FROM $11
RETURNING CASE WHEN r.inline AND d.attempted_by IS NOT NULL THEN d.id END AS inlined
)
SELECT inlined FROM u WHERE inlined IS NOT NULL`

const insertAttemptsSQL = `
INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
                              error_class, error, response, target, instance)
SELECT id, endpoint, attempt, started_at, duration_ms, nullif(status_code, 0), outcome,
       nullif(error_class, ''), nullif(error, ''), nullif(response, ''), nullif(target, ''), $12
FROM unnest($1::int8[], $2::text[], $3::int4[], $4::timestamptz[], $5::float4[], $6::int4[], $7::text[],
            $8::text[], $9::text[], $10::text[], $11::text[])
  AS a(id, endpoint, attempt, started_at, duration_ms, status_code, outcome, error_class, error, response, target)`

// attemptRows are the columns of the attempts a batch inserts.
type attemptRows struct {
	ids                                                 []int64
	endpoints, outcomes, classes, errs, bodies, targets []string
	nums, codes                                         []int32
	started                                             []time.Time
	ms                                                  []float32
}

func (a *attemptRows) add(r state.Result) {
	a.ids, a.endpoints, a.nums = append(a.ids, r.DeliveryID), append(a.endpoints, r.Endpoint), append(a.nums, int32(r.Attempt))
	a.started = append(a.started, attemptStart(r))
	a.ms, a.codes, a.outcomes = append(a.ms, float32(r.ResponseMS)), append(a.codes, int32(r.StatusCode)), append(a.outcomes, string(r.Status))
	a.classes, a.errs, a.bodies, a.targets = append(a.classes, r.ErrorClass), append(a.errs, r.LastError), append(a.bodies, r.Response), append(a.targets, r.Target)
}

// attemptStart is when r's request started: its outcome's time less its
// response time.
func attemptStart(r state.Result) time.Time {
	return r.At.Add(-time.Duration(r.ResponseMS * float64(time.Millisecond)))
}

func (a *attemptRows) args(instance string) []any {
	return []any{a.ids, a.endpoints, a.nums, a.started, a.ms, a.codes, a.outcomes, a.classes, a.errs, a.bodies, a.targets, instance}
}

// copyAttemptsMin is the number of attempts from which a batch copies
// its attempt rows into the table (COPY FROM STDIN, binary) instead of
// inserting them from arrays. COPY writes a page's worth of new rows as one
// WAL record where an insert writes one per row, and every record costs the
// walsender a turn of its loop; it skips the arrays' unnest too. It costs
// a round trip of its own, so small batches (live traffic's) insert.
const copyAttemptsMin = 32

// attemptColumnNames are postbox.attempts' columns in copyRows' order.
var attemptColumnNames = []string{"delivery_id", "endpoint", "attempt", "started_at", "duration_ms", "status_code",
	"outcome", "error_class", "error", "response", "target", "instance"}

// copyRows are the attempts as COPY's rows, with insertAttemptsSQL's NULLs
// (no status code, no error class, error, response or target).
func (a *attemptRows) copyRows(instance string) pgx.CopyFromSource {
	return pgx.CopyFromSlice(len(a.ids), func(i int) ([]any, error) {
		var code any
		if a.codes[i] != 0 {
			code = a.codes[i]
		}
		return []any{a.ids[i], a.endpoints[i], a.nums[i], a.started[i], a.ms[i], code,
			a.outcomes[i], orNull(a.classes[i]), orNull(a.errs[i]), orNull(a.bodies[i]), orNull(a.targets[i]), instance}, nil
	})
}

// firstOnDelivery reports whether r's attempt is kept on its delivery's
// row rather than in an attempt row of its own (migration 026): a first
// attempt that delivered. The update keeps it there only if the delivery
// had no attempt before (attempt_count 0); RecordResults inserts a row for
// any it did not keep.
func firstOnDelivery(r state.Result) bool {
	return r.Sampled && r.Attempted && r.Attempt == 1 && r.Status == postboxtype.DeliveryDelivered
}

// HealthFunc computes an endpoint's new health from its current row (a
// closed one when it has none) and the batch's results for it, in order.
type HealthFunc func(cur Health, rs []state.Result) Health

// HealthChange is one endpoint's health before and after a batch.
type HealthChange struct {
	Old, New Health
}

// RecordResults writes a batch of results in one transaction: the
// deliveries (only those still leased to owner: a lease lost to another
// instance is not overwritten), each request's attempt, and the health of
// each endpoint concerned, computed by apply while its row is locked, so
// instances recording at once see each other's streaks. It returns the
// health of those endpoints before and after.
//
// An attempt is a row of postbox.attempts, but with hist, a first attempt
// that delivered (firstOnDelivery) is kept on its delivery's row by the
// update itself (postbox.all_attempts shows both): one index entry where
// the row cost a heap tuple and two. The update returns the deliveries it
// kept one on; one it did not (the lease was lost) gets its row.
//
// The attempts' latency is counted in hist and added to the histograms
// with the first batch after HistogramFlushDefault (or by
// FlushHistograms); with hist nil, the attempts table's trigger counts
// them in this transaction. Results the ingest wrote (Written) update
// neither the delivery nor the attempts: they are counted into hist (their
// rows were inserted with the trigger set aside, so with hist nil they are
// not counted; the relay always has one) and move the health.
func (s *Store) RecordResults(ctx context.Context, owner string, rs []state.Result, apply HealthFunc, hist *Histograms) ([]HealthChange, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	n := len(rs)
	ids, statuses, delays := make([]int64, 0, n), make([]string, 0, n), make([]float64, 0, n)
	attempted, errs, codes := make([]bool, 0, n), make([]string, 0, n), make([]int32, 0, n)
	ms, bodies, ats, c2d := make([]float32, 0, n), make([]string, 0, n), make([]time.Time, 0, n), make([]float32, 0, n)
	inlines, targets := make([]bool, 0, n), make([]string, 0, n)
	// attempts are inserted; written, those the ingest wrote (Written),
	// are only counted into the histograms, and so are inline, first
	// attempts that delivered, which the update keeps on their deliveries
	// (firstOnDelivery).
	var attempts attemptRows
	var written, inline []int  // indexes into rs
	var under []UnderWayResult // events under way: their deliveries are inserted
	for i := range rs {
		r := &rs[i]
		if r.Written {
			written = append(written, i)
			continue
		}
		if r.DeliveryID == 0 && r.Range != 0 {
			under = append(under, UnderWayResult{Result: r,
				Inline: hist != nil && firstOnDelivery(*r)})
			continue
		}
		in := hist != nil && firstOnDelivery(*r)
		ids, statuses, delays = append(ids, r.DeliveryID), append(statuses, string(r.Status)), append(delays, r.Delay.Seconds())
		attempted, errs, codes = append(attempted, r.Attempted), append(errs, r.LastError), append(codes, int32(r.StatusCode))
		ms, bodies = append(ms, float32(r.ResponseMS)), append(bodies, r.Response)
		ats, c2d = append(ats, r.At), append(c2d, float32(r.CommitToDeliveryMS))
		inlines, targets = append(inlines, in), append(targets, r.Target)
		switch {
		case in:
			inline = append(inline, i)
		case r.Sampled:
			attempts.add(*r)
		}
	}
	byEndpoint := groupForHealth(rs)
	// Health rows are locked in name order, so concurrent instances lock
	// them in the same order.
	names := make([]string, 0, len(byEndpoint))
	for name := range byEndpoint {
		names = append(names, name)
	}
	sort.Strings(names)

	var counts map[histKey]int64
	flush := false
	if hist != nil && len(attempts.ids)+len(written)+len(inline)+len(under) > 0 {
		counts = countAttempts(&attempts)
		for i := range under {
			if r := under[i].Result; r.Sampled {
				counts[histKey{r.Endpoint, latencyBin(attemptStart(*r)), latencyBucket(float32(r.ResponseMS))}]++
			}
		}
		for _, i := range slices.Concat(written, inline) {
			r := &rs[i]
			counts[histKey{r.Endpoint, latencyBin(attemptStart(*r)), latencyBucket(float32(r.ResponseMS))}]++
		}
		if pending, due := hist.Pending(); pending && !time.Now().Before(due) {
			flush = true
			for k, n := range hist.counts {
				counts[k] += n
			}
		}
	}
	var changes []HealthChange
	// Endpoints whose results are all successes are read without a lock,
	// and most stay as they were (see recordHealth); when one turns out to
	// change, the transaction runs again with every row locked, as the
	// others always are.
	for lockAll := false; ; lockAll = true {
		err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			// First, while the planner may still loop over the batch
			// (recordPlans, below, rules that out for the rest of the
			// transaction): the events under way are found by key.
			// Their attempts that are not kept on their rows get rows of
			// their own, in the batch below: after histogramMode, as the
			// recorder counts them in memory.
			var underAttempts attemptRows
			if len(under) > 0 {
				ids, err := RecordUnderWay(ctx, tx, owner, under)
				if err != nil {
					return err
				}
				for i := range under {
					u := &under[i]
					if id := ids[u.Result.EventPK]; id != 0 && u.Result.Sampled && !u.Inline {
						r := *u.Result
						r.DeliveryID = id
						underAttempts.add(r)
					}
				}
			}
			// Pinned for every batch, also one that updates no delivery
			// (its results all written by the ingest, as at live rates
			// most are): its reads of the endpoints' health were otherwise
			// planned at every run, dearer than running them.
			b := &pgx.Batch{}
			b.Queue(recordPlans)
			var onRow map[int64]bool // the inline attempts the update kept
			if len(ids) > 0 {
				b.Queue(recordResultsSQL, ids, statuses, delays, attempted, errs, codes, ms, bodies, ats, c2d, owner,
					inlines, targets).Query(func(rows pgx.Rows) error {
					got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
					onRow = make(map[int64]bool, len(got))
					for _, id := range got {
						onRow[id] = true
					}
					return err
				})
			}
			if hist != nil && len(attempts.ids)+len(inline)+len(underAttempts.ids) > 0 {
				b.Queue(histogramMode)
			}
			if len(attempts.ids) > 0 && len(attempts.ids) < copyAttemptsMin {
				b.Queue(insertAttemptsSQL, attempts.args(owner)...)
			}
			if len(underAttempts.ids) > 0 {
				b.Queue(insertAttemptsSQL, underAttempts.args(owner)...)
			}
			if flush {
				queueHistogramUpsert(b, counts)
			}
			var locking, reading []string
			for _, name := range names {
				if !lockAll && allSucceeded(byEndpoint[name]) {
					reading = append(reading, name)
				} else {
					locking = append(locking, name)
				}
			}
			var locked, read map[string]Health
			if len(locking) > 0 {
				b.Queue(selectHealthSQL+` WHERE endpoint = ANY($1) ORDER BY endpoint FOR UPDATE`, locking).Query(func(rows pgx.Rows) error {
					var err error
					locked, err = collectHealth(rows)
					return err
				})
			}
			if len(reading) > 0 {
				b.Queue(selectHealthSQL+` WHERE endpoint = ANY($1)`, reading).Query(func(rows pgx.Rows) error {
					var err error
					read, err = collectHealth(rows)
					return err
				})
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			// An inline attempt whose delivery the update did not keep it on
			// (no longer this instance's: its lease was taken) gets its row.
			var apart attemptRows
			for _, i := range inline {
				if !onRow[rs[i].DeliveryID] {
					apart.add(rs[i])
				}
			}
			if len(apart.ids) > 0 {
				if _, err := tx.Exec(ctx, insertAttemptsSQL, apart.args(owner)...); err != nil {
					return fmt.Errorf("insert attempts: %w", err)
				}
			}
			if len(attempts.ids) >= copyAttemptsMin {
				if _, err := tx.CopyFrom(ctx, pgx.Identifier{"postbox", "attempts"}, attemptColumnNames, attempts.copyRows(owner)); err != nil {
					return fmt.Errorf("copy attempts: %w", err)
				}
			}
			var err error
			changes, err = s.recordHealth(ctx, tx, locking, locked, reading, read, byEndpoint, apply)
			return err
		})
		if errors.Is(err, errHealthChanged) && !lockAll {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("record results: %w", err)
		}
		break
	}
	switch {
	case flush:
		clear(hist.counts)
		hist.flushed = time.Now()
	case counts != nil:
		for k, n := range counts {
			hist.counts[k] += n
		}
	}
	return changes, nil
}

// groupForHealth returns, by lane, the results that feed its health (see
// HealthFunc), in their order, copied once into one array.
func groupForHealth(rs []state.Result) map[string][]state.Result {
	counts := map[string]int{}
	total := 0
	for i := range rs {
		if r := &rs[i]; feedsHealth(r) {
			counts[r.Key()]++
			total++
		}
	}
	all := make([]state.Result, total)
	out := make(map[string][]state.Result, len(counts))
	off := 0
	for k, n := range counts {
		out[k] = all[off : off : off+n]
		off += n
	}
	for i := range rs {
		if r := &rs[i]; feedsHealth(r) {
			out[r.Key()] = append(out[r.Key()], *r)
		}
	}
	return out
}

// feedsHealth reports whether a result changes its lane's health: an
// attempt, a breaker signal or a pause.
func feedsHealth(r *state.Result) bool {
	return r.Sampled || r.Attempted || r.Signal != state.SignalNone || r.Pause > 0
}

// Instance describes a running postbox for the registry.
type Instance struct {
	ID        string
	Hostname  string
	PID       int
	Version   string
	Streaming bool
	// Fault is the database fault the instance runs into ("" when none),
	// since FaultSince.
	Fault      string
	FaultSince time.Time
}

// LifeGraceDefault is how long an instance registered with a connection
// for life (see Heartbeat) still counts as alive after that connection
// ended, unless it heartbeats again meanwhile: long enough for an instance
// whose connection was cut (a backend ended by an operator, a network
// blip) to connect again, short enough that a crashed one's deliveries
// return within seconds.
const LifeGraceDefault = 3 * time.Second

// lifeLockSQL takes the session's advisory lock on the instance's id ($1),
// unless it holds it already: the lock stands for the instance's life
// while its session lasts. Taking it writes nothing, so an instance whose
// connection was cut holds it again on its new one even while the database
// refuses writes (read-only), when its heartbeat cannot register the new
// backend.
const lifeLockSQL = `
	SELECT pg_try_advisory_lock(x.k) FROM (SELECT hashtextextended($1, 0) AS k) AS x
	WHERE NOT EXISTS (SELECT 1 FROM pg_locks l
	                  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.objsubid = 1
	                    AND ((l.classid::int8 << 32) | l.objid::int8) = x.k)`

// aliveSQL is the condition that the instance i is alive: registered and
// unexpired, and, if it registered a connection for life, that connection
// still open, or one of its successors holding its advisory lock, or a
// heartbeat within the grace (LifeGraceDefault). A connection registered
// before the server (re)started counts as open: the instances connect
// again, and their leases decide.
//
// The grace is written into it, not passed, and the statements that run
// each heartbeat (DeadOwners, Peers) take no parameter: a statement
// without parameters keeps one plan per connection, where one with them is
// planned at every run (the sessions' plan_cache_mode, see Configure), and
// the views of locks and backends make those two dear to plan
// (docs/benchmarks.md).
var aliveSQL = `i.expires_at > now()
	AND (i.backend_pid IS NULL
	     OR i.backend_start < pg_postmaster_start_time()
	     OR i.heartbeat_at > now() - interval '` + strconv.FormatInt(LifeGraceDefault.Microseconds(), 10) + ` microseconds'
	     OR EXISTS (SELECT 1 FROM pg_locks l
	                WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
	                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	                  AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(i.id, 0))
	     OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = i.backend_pid AND a.backend_start = i.backend_start))`

// Heartbeat registers the instance (or renews its registration) for
// lease: its deliveries in flight stay its own until then. With live set,
// q is the connection the instance holds for its whole life: the instance
// takes its advisory lock there (lifeLockSQL) and registers its backend,
// and counts as dead once neither is there any more, a grace after its
// last heartbeat (see aliveSQL).
func (s *Store) Heartbeat(ctx context.Context, q Querier, in Instance, lease time.Duration, live bool) error {
	if live {
		if _, err := q.Exec(ctx, lifeLockSQL, in.ID); err != nil {
			return fmt.Errorf("heartbeat: hold the instance's lock: %w", err)
		}
	}
	_, err := q.Exec(ctx, `
		INSERT INTO postbox.instances AS i (id, hostname, pid, version, expires_at, streaming, backend_pid, backend_start, fault, fault_since)
		SELECT $1, $2, $3, $4, now() + $5 * interval '1 second', $6, a.pid, a.backend_start, $8, $9
		FROM (SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid() AND $7
		      UNION ALL SELECT NULL, NULL WHERE NOT $7) AS a
		ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at, streaming = excluded.streaming,
		  backend_pid = CASE WHEN $7 THEN excluded.backend_pid ELSE i.backend_pid END,
		  backend_start = CASE WHEN $7 THEN excluded.backend_start ELSE i.backend_start END,
		  fault = excluded.fault, fault_since = excluded.fault_since`,
		in.ID, in.Hostname, in.PID, in.Version, lease.Seconds(), in.Streaming, live, nullString(in.Fault), nullTime(in.FaultSince))
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Peers returns how many other instances are alive (aliveSQL), as
// DeadOwners judges them. The statement lists all of them, id included,
// so that it takes no parameter (see aliveSQL).
func (s *Store) Peers(ctx context.Context, id string) (int, error) {
	rows, err := s.Pool.Query(ctx, aliveInstancesSQL)
	if err != nil {
		return 0, fmt.Errorf("count instances: %w", err)
	}
	alive, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("count instances: %w", err)
	}
	n := 0
	for _, other := range alive {
		if other != id {
			n++
		}
	}
	return n, nil
}

// aliveInstancesSQL lists the instances alive, for Peers. It takes no
// parameter (see aliveSQL).
var aliveInstancesSQL = `SELECT i.id FROM postbox.instances i WHERE ` + aliveSQL

// Deregister removes the instance from the registry (a clean shutdown).
func (s *Store) Deregister(ctx context.Context, id string) error {
	_, err := s.Pool.Exec(ctx, `DELETE FROM postbox.instances WHERE id = $1`, id)
	return err
}

// DeadOwners returns the owners of deliveries in flight that are gone
// (aliveSQL): their connection for life has ended on this server and they
// did not come back within the grace (crashed or killed), or their
// registration has expired (frozen, or cut off from the database past
// their lease). The owners are read from deliveries_lease_owner, one
// lookup each.
func (s *Store) DeadOwners(ctx context.Context) ([]string, error) {
	rows, err := s.Pool.Query(ctx, deadOwnersSQL)
	if err != nil {
		return nil, fmt.Errorf("find stopped instances: %w", err)
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find stopped instances: %w", err)
	}
	return owners, nil
}

// deadOwnersSQL is DeadOwners' statement. It takes no parameter (see
// aliveSQL).
var deadOwnersSQL = `
	WITH RECURSIVE owners AS (
	  (SELECT lease_owner FROM postbox.deliveries WHERE status = 'in_flight' ORDER BY lease_owner LIMIT 1)
	  UNION ALL
	  SELECT (SELECT d.lease_owner FROM postbox.deliveries d
	          WHERE d.status = 'in_flight' AND d.lease_owner > owners.lease_owner
	          ORDER BY d.lease_owner LIMIT 1)
	  FROM owners WHERE owners.lease_owner IS NOT NULL
	)
	SELECT lease_owner FROM owners
	WHERE lease_owner IS NOT NULL
	  AND NOT EXISTS (SELECT 1 FROM postbox.instances i
	                  WHERE i.id = owners.lease_owner AND ` + aliveSQL + `)
	UNION
	SELECT u.owner FROM postbox.under_way u
	WHERE NOT EXISTS (SELECT 1 FROM postbox.instances i WHERE i.id = u.owner AND ` + aliveSQL + `)`

// ReleaseAbandonedOf returns to the queue, due at once, up to limit
// deliveries in flight of owners that are still gone (see DeadOwners; the
// caller, maintain's sweep, waits until it has seen an owner gone for a
// while). It also forgets registrations expired an hour ago. The
// interrupted attempt is not counted: it may or may not have reached the
// receiver. Their events under way get pending deliveries in the lanes
// lane gives them.
func (s *Store) ReleaseAbandonedOf(ctx context.Context, owners []string, limit int, lane LaneFunc) (int64, error) {
	var n int64
	if len(owners) > 0 {
		rows, err := s.Pool.Query(ctx, `
			SELECT o FROM unnest($1::text[]) AS o
			WHERE NOT EXISTS (SELECT 1 FROM postbox.instances i WHERE i.id = o AND `+aliveSQL+`)`, owners)
		if err != nil {
			return 0, fmt.Errorf("release abandoned deliveries: %w", err)
		}
		dead, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, fmt.Errorf("release abandoned deliveries: %w", err)
		}
		if len(dead) > 0 {
			tag, err := s.Pool.Exec(ctx, `
				UPDATE postbox.deliveries
				SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
				    lease_owner = NULL, next_attempt_at = now(), updated_at = now()
				WHERE id IN (SELECT id FROM postbox.deliveries
				             WHERE status = 'in_flight' AND lease_owner = ANY($1)
				             LIMIT $2 FOR UPDATE SKIP LOCKED)`, dead, limit)
			if err != nil {
				return 0, fmt.Errorf("release abandoned deliveries: %w", err)
			}
			n = tag.RowsAffected()
			// Their events under way get pending deliveries.
			err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
				queued, err := SweepUnderWay(ctx, tx, dead, lane)
				n += queued
				return err
			})
			if err != nil {
				return 0, fmt.Errorf("release abandoned events under way: %w", err)
			}
		}
	}
	if _, err := s.Pool.Exec(ctx, `DELETE FROM postbox.instances WHERE expires_at < now() - interval '1 hour'`); err != nil {
		return 0, fmt.Errorf("forget expired instances: %w", err)
	}
	return n, nil
}

// StaleOwned returns up to limit deliveries owner has held in flight,
// unchanged, for longer than age: candidates for Rescue once the owner has
// checked that it does not hold them in memory.
func (s *Store) StaleOwned(ctx context.Context, owner string, age time.Duration, limit int) ([]int64, error) {
	rows, err := s.Pool.Query(ctx, `
		SELECT id FROM postbox.deliveries
		WHERE status = 'in_flight' AND lease_owner = $1 AND updated_at < now() - $2::interval
		LIMIT $3`, owner, age, limit)
	if err != nil {
		return nil, fmt.Errorf("find stale claims: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("find stale claims: %w", err)
	}
	return ids, nil
}

// Rescue returns to the queue, due at once, those of ids that owner still
// holds in flight: claims whose statement committed although its answer
// was lost (a broken connection), so that no attempt will ever record them.
func (s *Store) Rescue(ctx context.Context, owner string, ids []int64) (int64, error) {
	var n int64
	b := &pgx.Batch{}
	b.Queue(noTableScan) // by id, as RecordResults (see recordResultsSQL)
	b.Queue(`
		UPDATE postbox.deliveries
		SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
		    lease_owner = NULL, next_attempt_at = now(), updated_at = now()
		WHERE id = ANY($2) AND status IS NOT DISTINCT FROM 'in_flight' AND lease_owner IS NOT DISTINCT FROM $1`, owner, ids).Exec(func(tag pgconn.CommandTag) error {
		n = tag.RowsAffected()
		return nil
	})
	if err := s.Pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("rescue stale claims: %w", err)
	}
	return n, nil
}

// ReleaseOwned returns every delivery owner still holds to the queue, due
// at once: for a clean shutdown after the in-flight attempts are recorded.
// Its events under way get pending deliveries in the lanes lane gives.
func (s *Store) ReleaseOwned(ctx context.Context, owner string, lane LaneFunc) (int64, error) {
	tag, err := s.Pool.Exec(ctx, `
		UPDATE postbox.deliveries
		SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
		    lease_owner = NULL, next_attempt_at = now(), updated_at = now()
		WHERE status = 'in_flight' AND lease_owner = $1`, owner)
	if err != nil {
		return 0, fmt.Errorf("release deliveries: %w", err)
	}
	n := tag.RowsAffected()
	// Its events under way, not attempted or not recorded, are queued as
	// a dead owner's would be.
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		queued, err := SweepUnderWay(ctx, tx, []string{owner}, lane)
		n += queued
		return err
	})
	if err != nil {
		return n, fmt.Errorf("release events under way: %w", err)
	}
	return n, nil
}
