package store

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Claimed is a delivery claimed from the queue, with its event.
type Claimed struct {
	DeliveryID   int64
	Endpoint     string
	AttemptCount int
	EventID      string
	URL          string
	EventType    string
	Payload      []byte
	Headers      []byte
	CreatedAt    time.Time
	CommittedAt  time.Time // zero when unknown
}

// claimSQL claims due deliveries, at most free[endpoint] (or $3 for an
// endpoint not listed) per endpoint, so one endpoint's backlog cannot fill
// a batch. The endpoints with queued rows are found with a skip scan of
// deliveries_due (one index probe per endpoint, however deep its queue).
const claimSQL = `
WITH RECURSIVE eps AS (
  (SELECT endpoint FROM postbox.deliveries
   WHERE status IN ('pending', 'failed') ORDER BY endpoint LIMIT 1)
  UNION ALL
  SELECT (SELECT d.endpoint FROM postbox.deliveries d
          WHERE d.status IN ('pending', 'failed') AND d.endpoint > eps.endpoint
          ORDER BY d.endpoint LIMIT 1)
  FROM eps WHERE eps.endpoint IS NOT NULL
),
caps AS (
  SELECT eps.endpoint, coalesce(f.free, $3) AS free
  FROM eps LEFT JOIN unnest($1::text[], $2::int4[]) AS f(endpoint, free) ON f.endpoint = eps.endpoint
  WHERE eps.endpoint IS NOT NULL AND coalesce(f.free, $3) > 0
),
picked AS (
  SELECT d.id FROM caps CROSS JOIN LATERAL (
    SELECT id FROM postbox.deliveries
    WHERE endpoint = caps.endpoint AND status IN ('pending', 'failed') AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT caps.free
    FOR UPDATE SKIP LOCKED
  ) d
  LIMIT $4
)
UPDATE postbox.deliveries d
SET status = 'in_flight', lease_owner = $5, updated_at = now()
FROM picked, postbox.events e
WHERE d.id = picked.id AND e.id = d.event_pk
RETURNING d.id, d.endpoint, d.attempt_count, e.event_id::text, coalesce(e.url, ''), e.event_type,
          e.payload::text, e.headers::text, e.created_at, e.committed_at`

// Claim takes due deliveries for owner (a registered instance, see
// Heartbeat). free caps the claim per endpoint; endpoints not in free get
// defaultFree; limit caps the total.
func (s *Store) Claim(ctx context.Context, owner string, defaultFree int, free map[string]int, limit int) ([]Claimed, error) {
	names := make([]string, 0, len(free))
	caps := make([]int32, 0, len(free))
	for name, n := range free {
		names = append(names, name)
		caps = append(caps, int32(n))
	}
	rows, err := s.Pool.Query(ctx, claimSQL, names, caps, defaultFree, limit, owner)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		var c Claimed
		var payload string
		var headers *string
		var committed *time.Time
		if err := rows.Scan(&c.DeliveryID, &c.Endpoint, &c.AttemptCount, &c.EventID, &c.URL, &c.EventType,
			&payload, &headers, &c.CreatedAt, &committed); err != nil {
			return nil, fmt.Errorf("claim deliveries: %w", err)
		}
		c.Payload = []byte(payload)
		if headers != nil {
			c.Headers = []byte(*headers)
		}
		if committed != nil {
			c.CommittedAt = *committed
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

// Result is the outcome of one claimed delivery.
type Result struct {
	DeliveryID int64
	Endpoint   string
	// Status is delivered, failed (retry after Delay), dead_letter, or
	// released (back to the queue, no attempt counted).
	Status string
	Delay  time.Duration
	// Attempted counts toward max_attempts and sets last_error and the
	// other last_* columns.
	Attempted bool
	// Sampled is true when a request was sent: it records a latency
	// sample and counts in the endpoint's success or failure streak.
	Sampled            bool
	LastError          string
	StatusCode         int // 0 when there was no response
	ResponseMS         int
	Response           string // the start of the response body
	At                 time.Time
	CommitToDeliveryMS int // -1 when unknown
}

const recordResultsSQL = `
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
  lease_owner = NULL, updated_at = now()
FROM unnest($1::int8[], $2::text[], $3::float8[], $4::bool[], $5::text[], $6::int4[], $7::int4[], $8::text[], $9::timestamptz[], $10::int4[])
  AS r(id, status, delay_s, attempted, last_error, status_code, response_ms, response, at, c2d_ms)
WHERE d.id = ANY($1) AND d.id = r.id AND d.status = 'in_flight' AND d.lease_owner = $11`

const insertSamplesSQL = `
INSERT INTO postbox.latency_samples (endpoint, response_ms, status_code, outcome, measured_at)
SELECT * FROM unnest($1::text[], $2::int4[], $3::int4[], $4::text[], $5::timestamptz[])`

const upsertHealthSQL = `
INSERT INTO postbox.endpoint_health AS h
  (endpoint, consecutive_failures, last_success_at, last_failure_at, last_error, last_status_code)
SELECT * FROM unnest($1::text[], $2::int4[], $3::timestamptz[], $4::timestamptz[], $5::text[], $6::int4[])
ON CONFLICT (endpoint) DO UPDATE SET
  consecutive_failures = CASE WHEN excluded.last_success_at IS NOT NULL THEN excluded.consecutive_failures
                              ELSE h.consecutive_failures + excluded.consecutive_failures END,
  last_success_at = coalesce(excluded.last_success_at, h.last_success_at),
  last_failure_at = coalesce(excluded.last_failure_at, h.last_failure_at),
  last_error = coalesce(excluded.last_error, h.last_error),
  last_status_code = coalesce(excluded.last_status_code, h.last_status_code)`

// RecordResults writes a batch of results in one transaction: the
// deliveries (only those still leased to owner: a lease lost to another
// instance is not overwritten), one latency sample per attempt, and the
// endpoints' success and failure streaks. It returns how many deliveries
// it updated.
func (s *Store) RecordResults(ctx context.Context, owner string, rs []Result) (int64, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	n := len(rs)
	ids, statuses, delays := make([]int64, n), make([]string, n), make([]float64, n)
	attempted, errs, codes := make([]bool, n), make([]string, n), make([]int32, n)
	ms, bodies, ats, c2d := make([]int32, n), make([]string, n), make([]time.Time, n), make([]int32, n)
	var sEp []string
	var sMS, sCode []int32
	var sOutcome []string
	var sAt []time.Time
	type health struct {
		failures    int32
		lastSuccess *time.Time
		lastFailure *time.Time
		lastError   *string
		lastCode    *int32
	}
	hs := map[string]*health{}
	for i, r := range rs {
		ids[i], statuses[i], delays[i] = r.DeliveryID, r.Status, r.Delay.Seconds()
		attempted[i], errs[i], codes[i] = r.Attempted, r.LastError, int32(r.StatusCode)
		ms[i], bodies[i], ats[i], c2d[i] = int32(r.ResponseMS), r.Response, r.At, int32(r.CommitToDeliveryMS)
		if !r.Sampled {
			continue
		}
		outcome := r.Status
		sEp, sMS, sCode, sOutcome, sAt = append(sEp, r.Endpoint), append(sMS, int32(r.ResponseMS)), append(sCode, int32(r.StatusCode)), append(sOutcome, outcome), append(sAt, r.At)
		h := hs[r.Endpoint]
		if h == nil {
			h = &health{}
			hs[r.Endpoint] = h
		}
		at := r.At
		if r.Status == StatusDelivered {
			h.failures, h.lastSuccess = 0, &at
		} else {
			h.failures++
			h.lastFailure = &at
			e := r.LastError
			h.lastError = &e
			if r.StatusCode != 0 {
				c := int32(r.StatusCode)
				h.lastCode = &c
			}
		}
	}
	// Health rows in name order, so concurrent instances lock them in the
	// same order.
	names := make([]string, 0, len(hs))
	for name := range hs {
		names = append(names, name)
	}
	sort.Strings(names)
	var hEp []string
	var hFail []int32
	var hSucc, hFailAt []*time.Time
	var hErr []*string
	var hCode []*int32
	for _, name := range names {
		h := hs[name]
		hEp, hFail, hSucc, hFailAt, hErr, hCode = append(hEp, name), append(hFail, h.failures), append(hSucc, h.lastSuccess), append(hFailAt, h.lastFailure), append(hErr, h.lastError), append(hCode, h.lastCode)
	}

	var updated int64
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(recordResultsSQL, ids, statuses, delays, attempted, errs, codes, ms, bodies, ats, c2d, owner).Exec(func(ct pgconn.CommandTag) error {
			updated = ct.RowsAffected()
			return nil
		})
		if len(sEp) > 0 {
			b.Queue(insertSamplesSQL, sEp, sMS, sCode, sOutcome, sAt)
		}
		if len(hEp) > 0 {
			b.Queue(upsertHealthSQL, hEp, hFail, hSucc, hFailAt, hErr, hCode)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, fmt.Errorf("record results: %w", err)
	}
	return updated, nil
}

// Instance describes a running postbox for the registry.
type Instance struct {
	ID       string
	Hostname string
	PID      int
	Version  string
}

// Heartbeat registers the instance (or renews its registration) for
// lease: its deliveries in flight stay its own until then.
func (s *Store) Heartbeat(ctx context.Context, in Instance, lease time.Duration) error {
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO postbox.instances (id, hostname, pid, version, expires_at)
		VALUES ($1, $2, $3, $4, now() + $5 * interval '1 second')
		ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at`,
		in.ID, in.Hostname, in.PID, in.Version, lease.Seconds())
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Deregister removes the instance from the registry (a clean shutdown).
func (s *Store) Deregister(ctx context.Context, id string) error {
	_, err := s.Pool.Exec(ctx, `DELETE FROM postbox.instances WHERE id = $1`, id)
	return err
}

// ReleaseAbandoned returns to the queue, due at once, up to limit
// deliveries in flight whose owner is no longer registered (it crashed, was
// killed, or froze past its lease), and forgets expired registrations. The
// interrupted attempt is not counted: it may or may not have reached the
// receiver.
func (s *Store) ReleaseAbandoned(ctx context.Context, limit int) (int64, error) {
	tag, err := s.Pool.Exec(ctx, `
		WITH RECURSIVE owners AS (
		  (SELECT lease_owner FROM postbox.deliveries WHERE status = 'in_flight' ORDER BY lease_owner LIMIT 1)
		  UNION ALL
		  SELECT (SELECT d.lease_owner FROM postbox.deliveries d
		          WHERE d.status = 'in_flight' AND d.lease_owner > owners.lease_owner
		          ORDER BY d.lease_owner LIMIT 1)
		  FROM owners WHERE owners.lease_owner IS NOT NULL
		),
		dead AS (
		  SELECT lease_owner FROM owners
		  WHERE lease_owner IS NOT NULL
		    AND NOT EXISTS (SELECT 1 FROM postbox.instances i WHERE i.id = owners.lease_owner AND i.expires_at > now())
		)
		UPDATE postbox.deliveries
		SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
		    lease_owner = NULL, next_attempt_at = now(), updated_at = now()
		WHERE id IN (SELECT id FROM postbox.deliveries
		             WHERE status = 'in_flight' AND lease_owner IN (SELECT lease_owner FROM dead)
		             LIMIT $1 FOR UPDATE SKIP LOCKED)`, limit)
	if err != nil {
		return 0, fmt.Errorf("release abandoned deliveries: %w", err)
	}
	if _, err := s.Pool.Exec(ctx, `DELETE FROM postbox.instances WHERE expires_at < now() - interval '1 hour'`); err != nil {
		return 0, fmt.Errorf("forget expired instances: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ReleaseOwned returns every delivery owner still holds to the queue, due
// at once: for a clean shutdown after the in-flight attempts are recorded.
func (s *Store) ReleaseOwned(ctx context.Context, owner string) (int64, error) {
	tag, err := s.Pool.Exec(ctx, `
		UPDATE postbox.deliveries
		SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
		    lease_owner = NULL, next_attempt_at = now(), updated_at = now()
		WHERE status = 'in_flight' AND lease_owner = $1`, owner)
	if err != nil {
		return 0, fmt.Errorf("release deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}
