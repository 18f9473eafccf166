package store

import (
	"context"
	"fmt"
)

// ParkBatchDefault bounds the deliveries one Park or Unpark statement
// moves, so that a lane with a deep backlog is parked over several sweeps
// rather than in one long statement.
const ParkBatchDefault = 10000

// parkSQL parks up to $1 queued deliveries of lanes whose breaker is open
// or half-open: next_attempt_at = 'infinity' takes them out of the
// claim's indexes (into deliveries_parked), so the claim's skip scans no
// longer visit those lanes. Claims skip such lanes anyway; parking only
// makes them free to skip.
const parkSQL = `
WITH cand AS (
  SELECT c.id FROM postbox.endpoint_health h CROSS JOIN LATERAL (
    (SELECT id FROM postbox.deliveries
     WHERE coalesce(lane, endpoint) = h.endpoint AND status = 'pending' AND next_attempt_at < 'infinity' LIMIT $1)
    UNION ALL
    (SELECT id FROM postbox.deliveries
     WHERE coalesce(lane, endpoint) = h.endpoint AND status = 'failed' AND next_attempt_at < 'infinity' LIMIT $1)
  ) c
  WHERE h.state <> 'closed'
  LIMIT $1
)
UPDATE postbox.deliveries d SET next_attempt_at = 'infinity'
WHERE d.id IN (SELECT id FROM postbox.deliveries WHERE id IN (SELECT id FROM cand)
               AND status IN ('pending', 'failed') FOR UPDATE SKIP LOCKED)`

// unparkSQL makes due now up to $1 parked deliveries of lanes whose
// breaker is closed (or that have no health row any more): of the lanes
// in $2, or when $2 is NULL of every parked lane, found by a skip scan of
// deliveries_parked.
const unparkSQL = `
WITH RECURSIVE parked AS (
  (SELECT coalesce(lane, endpoint) AS lane FROM postbox.deliveries
   WHERE $2::text[] IS NULL AND status IN ('pending', 'failed') AND next_attempt_at = 'infinity'
   ORDER BY coalesce(lane, endpoint) LIMIT 1)
  UNION ALL
  SELECT (SELECT coalesce(d.lane, d.endpoint) FROM postbox.deliveries d
          WHERE d.status IN ('pending', 'failed') AND d.next_attempt_at = 'infinity'
            AND coalesce(d.lane, d.endpoint) > p.lane
          ORDER BY coalesce(d.lane, d.endpoint) LIMIT 1)
  FROM parked p WHERE p.lane IS NOT NULL
),
lanes AS (
  SELECT lane FROM parked WHERE lane IS NOT NULL
  UNION
  SELECT unnest($2::text[])
),
free AS (
  SELECT lane FROM lanes
  WHERE NOT EXISTS (SELECT 1 FROM postbox.endpoint_health h WHERE h.endpoint = lanes.lane AND h.state <> 'closed')
),
cand AS (
  SELECT c.id FROM free CROSS JOIN LATERAL (
    SELECT id FROM postbox.deliveries
    WHERE coalesce(lane, endpoint) = free.lane AND status IN ('pending', 'failed') AND next_attempt_at = 'infinity'
    LIMIT $1) c
  LIMIT $1
)
UPDATE postbox.deliveries d SET next_attempt_at = now()
WHERE d.id IN (SELECT id FROM postbox.deliveries WHERE id IN (SELECT id FROM cand)
               AND status IN ('pending', 'failed') FOR UPDATE SKIP LOCKED)`

// Park takes up to limit queued deliveries of lanes whose circuit breaker
// is open or half-open out of the claim's sight (see parkSQL). It returns
// how many it parked. A breaker's probe still finds them.
func (s *Store) Park(ctx context.Context, limit int) (int64, error) {
	tag, err := s.Pool.Exec(ctx, parkSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("park held deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Unpark makes due now up to limit parked deliveries of lanes whose
// breaker is closed: of lanes, or of every parked lane when lanes is nil.
// It returns how many.
func (s *Store) Unpark(ctx context.Context, lanes []string, limit int) (int64, error) {
	tag, err := s.Pool.Exec(ctx, unparkSQL, limit, lanes)
	if err != nil {
		return 0, fmt.Errorf("unpark deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}
