package store

import (
	"context"
	"fmt"
)

// ParkBatchDefault bounds the deliveries one Park or Unpark statement
// moves, so that a lane with a deep backlog is parked in short statements
// rather than one long one.
const ParkBatchDefault = 2000

// parkSQL parks up to $1 queued deliveries of lanes whose breaker is open
// or half-open: next_attempt_at = 'infinity' takes them out of the
// claim's indexes (into deliveries_parked), so the claim's skip scans no
// longer visit those lanes. Claims skip such lanes anyway; parking only
// makes them free to skip. The lanes are found as the claim finds them,
// by skip scans of the lanes with queued deliveries: once they are
// parked, that is only the lanes that may deliver, however many breakers
// are open.
const parkSQL = `
WITH RECURSIVE pending_lanes AS (
  (SELECT coalesce(lane, endpoint) AS lane FROM postbox.deliveries WHERE status = 'pending' AND next_attempt_at < 'infinity'
   ORDER BY coalesce(lane, endpoint) LIMIT 1)
  UNION ALL
  SELECT (SELECT coalesce(d.lane, d.endpoint) FROM postbox.deliveries d
          WHERE d.status = 'pending' AND d.next_attempt_at < 'infinity' AND coalesce(d.lane, d.endpoint) > p.lane
          ORDER BY coalesce(d.lane, d.endpoint) LIMIT 1)
  FROM pending_lanes p WHERE p.lane IS NOT NULL
),
retry_lanes AS (
  (SELECT coalesce(lane, endpoint) AS lane FROM postbox.deliveries WHERE status = 'failed' AND next_attempt_at < 'infinity'
   ORDER BY coalesce(lane, endpoint) LIMIT 1)
  UNION ALL
  SELECT (SELECT coalesce(d.lane, d.endpoint) FROM postbox.deliveries d
          WHERE d.status = 'failed' AND d.next_attempt_at < 'infinity' AND coalesce(d.lane, d.endpoint) > r.lane
          ORDER BY coalesce(d.lane, d.endpoint) LIMIT 1)
  FROM retry_lanes r WHERE r.lane IS NOT NULL
),
held AS (
  SELECT l.lane FROM (SELECT lane FROM pending_lanes UNION SELECT lane FROM retry_lanes) l
  JOIN postbox.endpoint_health h ON h.endpoint = l.lane AND h.state <> 'closed'
),
cand AS (
  SELECT c.id FROM held CROSS JOIN LATERAL (
    (SELECT id FROM postbox.deliveries
     WHERE coalesce(lane, endpoint) = held.lane AND status = 'pending' AND next_attempt_at < 'infinity' LIMIT $1)
    UNION ALL
    (SELECT id FROM postbox.deliveries
     WHERE coalesce(lane, endpoint) = held.lane AND status = 'failed' AND next_attempt_at < 'infinity' LIMIT $1)
  ) c
  LIMIT $1
)
UPDATE postbox.deliveries d SET next_attempt_at = 'infinity'
WHERE d.id IN (SELECT id FROM postbox.deliveries WHERE id IN (SELECT id FROM cand)
               AND status IN ('pending', 'failed') FOR UPDATE SKIP LOCKED)`

// unparkSQL makes due now up to $1 parked deliveries of lanes whose
// breaker is closed: of the lanes in $2, or when $2 is NULL of every lane
// whose health row says closed, and with $3 of every parked lane too (a
// skip scan of deliveries_parked), which finds lanes whose health row is
// gone (postbox writes none away, an operator may).
const unparkSQL = `
WITH RECURSIVE parked AS (
  (SELECT coalesce(lane, endpoint) AS lane FROM postbox.deliveries
   WHERE $3 AND status IN ('pending', 'failed') AND next_attempt_at = 'infinity'
   ORDER BY coalesce(lane, endpoint) LIMIT 1)
  UNION ALL
  SELECT (SELECT coalesce(d.lane, d.endpoint) FROM postbox.deliveries d
          WHERE d.status IN ('pending', 'failed') AND d.next_attempt_at = 'infinity'
            AND coalesce(d.lane, d.endpoint) > p.lane
          ORDER BY coalesce(d.lane, d.endpoint) LIMIT 1)
  FROM parked p WHERE p.lane IS NOT NULL
),
lanes AS (
  SELECT endpoint AS lane FROM postbox.endpoint_health WHERE $2::text[] IS NULL AND state = 'closed'
  UNION
  SELECT unnest($2::text[])
  UNION
  SELECT lane FROM parked WHERE lane IS NOT NULL
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
// breaker is closed: of lanes, or of every closed lane when lanes is nil;
// with all, of every parked lane whose breaker is not open, health row or
// none (a skip scan of the parked lanes: the sweep does it now and then).
// It returns how many.
func (s *Store) Unpark(ctx context.Context, lanes []string, limit int, all bool) (int64, error) {
	tag, err := s.Pool.Exec(ctx, unparkSQL, limit, lanes, all)
	if err != nil {
		return 0, fmt.Errorf("unpark deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}
