// Claims from the delivery queue (Claim, ClaimOrdered, LoadOwned), and the
// plan settings that the statements reaching deliveries by id pin.

package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/internal/state"
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
	// delivery is written when its attempt ends (recordUnderWay).
	EventPK, Range int64
}

// Key is c's lane key: its Lane, or its endpoint's.
func (c *Claimed) Key() string {
	return state.LaneKey(c.Endpoint, c.Lane)
}

// claimedColumns is what every claim returns, from d (deliveries) and e
// (events). A delivery's url, which a replay may set, stands before its
// event's: an empty one leaves the row's url out (migration 035).
const claimedColumns = `d.id, d.endpoint, coalesce(d.lane, ''), d.attempt_count, e.event_id::text, coalesce(d.url, e.url, ''), e.event_type,
          e.payload::text, e.headers::text, e.created_at, e.committed_at, e.message,
          coalesce(e.commit_lsn - '0/0', 0)::int8`

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
// and the parked ones (deliveries_parked, see Park). A failed delivery
// with an owner is a retry that instance keeps (RecordResults): no one
// else's to claim or park.
const (
	queuedPending = `d.status = 'pending' AND d.next_attempt_at < 'infinity'`
	queuedRetry   = `d.status = 'failed' AND d.next_attempt_at < 'infinity' AND d.lease_owner IS NULL`
	queuedParked  = `d.status IN ('pending', 'failed') AND d.next_attempt_at = 'infinity' AND d.lease_owner IS NULL`
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
    AND lease_owner IS NULL
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

// NextRetryIn is how long until the earliest retry not yet due falls due,
// whoever scheduled it (ok false when none is queued): an instance that
// claimed all it could waits for it (claim.Claimer). One probe of
// deliveries_next_retry. Reported as a duration from the server's now, so
// that the clocks of the server and the instance need not agree.
func (s *Store) NextRetryIn(ctx context.Context) (time.Duration, bool, error) {
	var ms *float64
	err := s.Pool.QueryRow(ctx, `
		SELECT extract(epoch FROM min(d.next_attempt_at) - now()) * 1000 FROM postbox.deliveries d
		WHERE `+queuedRetry+` AND d.next_attempt_at > now()`).Scan(&ms)
	if err != nil {
		return 0, false, fmt.Errorf("read the next retry's time: %w", err)
	}
	if ms == nil {
		return 0, false, nil
	}
	return time.Duration(*ms * float64(time.Millisecond)), true, nil
}

// LoadOwned reads the deliveries of ids that owner holds in flight, as a
// claim returns them, without writing anything: deliveries the ingest
// wrote in flight for owner and kept by id (dispatch.Dispatcher.ReserveKeep).
// Those no longer owner's (the sweep of another instance took them back,
// thinking this one gone) are left out.
func (s *Store) LoadOwned(ctx context.Context, owner string, ids []int64) ([]Claimed, error) {
	var out []Claimed
	// One round trip: a batch runs in one implicit transaction, to which
	// keyPlans' settings are local. The plan is kept: planned at each run
	// it cost most of the read (kept retries read back beside a storm).
	b := &pgx.Batch{}
	b.Queue(keyPlans)
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
WHERE d.id = ANY($1) AND (d.status IS NOT DISTINCT FROM 'in_flight' OR d.status IS NOT DISTINCT FROM 'failed')
  AND d.lease_owner IS NOT DISTINCT FROM $2
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
	var commitLSN int64
	dest := []any{&c.DeliveryID, &c.Endpoint, &c.Lane, &c.AttemptCount, &c.EventID, &c.URL, &c.EventType,
		&payload, &headers, &c.CreatedAt, &committed, &c.Message, &commitLSN}
	if underWay {
		dest = append(dest, &c.EventPK, &c.Range)
	}
	if err := row.Scan(dest...); err != nil {
		return c, err
	}
	c.Payload, c.CommitLSN = []byte(payload), uint64(commitLSN)
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
