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
var parkSQL = `
WITH RECURSIVE ` + laneScan("pending_lanes", queuedPending) + `,
` + laneScan("retry_lanes", queuedRetry) + `,
held AS (
  SELECT l.lane FROM (SELECT lane FROM pending_lanes UNION SELECT lane FROM retry_lanes) l
  JOIN postbox.endpoint_health h ON h.endpoint = l.lane AND h.state <> 'closed'
),
cand AS (
  SELECT c.id FROM held CROSS JOIN LATERAL (
    (SELECT d.id FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = held.lane AND ` + queuedPending + ` LIMIT $1)
    UNION ALL
    (SELECT d.id FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = held.lane AND ` + queuedRetry + ` LIMIT $1)
  ) c
  LIMIT $1
)
UPDATE postbox.deliveries d SET next_attempt_at = 'infinity'
WHERE d.id IN (SELECT id FROM postbox.deliveries WHERE id IN (SELECT id FROM cand)
               AND status IN ('pending', 'failed') AND lease_owner IS NULL FOR UPDATE SKIP LOCKED)`

// unparkSQL makes due now up to $1 parked deliveries of lanes whose
// breaker is closed: of the lanes in $2, or when $2 is NULL of every lane
// whose health row says closed, and with $3 of every parked lane too (a
// skip scan of deliveries_parked), which finds lanes whose health row is
// gone (postbox writes none away, an operator may).
var unparkSQL = `
WITH RECURSIVE ` + laneScan("parked", "$3 AND "+queuedParked) + `,
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
    SELECT d.id FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = free.lane AND ` + queuedParked + `
    LIMIT $1) c
  LIMIT $1
)
UPDATE postbox.deliveries d SET next_attempt_at = now()
WHERE d.id IN (SELECT id FROM postbox.deliveries WHERE id IN (SELECT id FROM cand)
               AND status IN ('pending', 'failed') AND lease_owner IS NULL FOR UPDATE SKIP LOCKED)`

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
