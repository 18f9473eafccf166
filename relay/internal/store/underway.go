package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Events under way (docs/architecture.md): an instance alone keeps events
// in memory without writing their deliveries, and writes each delivery
// once, in the state its first attempt left it. A range of event ids in
// postbox.under_way names them as the instance's while it lives; the
// delivery's insert holds the range FOR SHARE, so a sweep that deletes the
// range (its owner dead, or the owner done with it) and gives its events
// without a delivery pending ones never races an insert: one of the two
// writes each event's delivery.

const addUnderWaySQL = `
INSERT INTO postbox.under_way (owner, first_event, last_event) VALUES ($1, $2, $3) RETURNING id`

// addUnderWay records that owner holds the events first..last (those of
// them without a delivery) and returns the range's id.
func addUnderWay(ctx context.Context, q Querier, owner string, first, last int64) (int64, error) {
	var id int64
	if err := q.QueryRow(ctx, addUnderWaySQL, owner, first, last).Scan(&id); err != nil {
		return 0, fmt.Errorf("add under way: %w", err)
	}
	return id, nil
}

// LaneFunc gives an event's lane from its endpoint and row URL (see
// config.Config.Lane): its endpoint's name when it has none of its own.
// A nil LaneFunc gives every event its endpoint's.
type LaneFunc func(endpoint, rowURL string) string

// sweepOwnersUnderWay takes the ranges of dead owners and gives each of their
// events without a delivery a pending one, in the lane lane gives it. It
// skips a range a recording holds (an owner thought dead may be frozen in
// the middle of one, for as long as it is frozen): a later sweep takes it.
func sweepOwnersUnderWay(ctx context.Context, tx pgx.Tx, owners []string, lane LaneFunc) (int64, error) {
	return sweepUnderWay(ctx, tx, lane, `
		DELETE FROM postbox.under_way WHERE id IN (
		  SELECT id FROM postbox.under_way WHERE owner = ANY($1) FOR UPDATE SKIP LOCKED)
		RETURNING first_event, last_event`, owners)
}

// SweepOwnUnderWay deletes ranges of owner (done with, or lost track of)
// and gives each of their events without a delivery a pending one, and
// reports how many it queued: none for a range whose events were all
// recorded.
func (s *Store) SweepOwnUnderWay(ctx context.Context, owner string, ranges []int64, lane LaneFunc) (int64, error) {
	if len(ranges) == 0 {
		return 0, nil
	}
	var n int64
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) (err error) {
		n, err = sweepUnderWay(ctx, tx, lane, `
			DELETE FROM postbox.under_way WHERE owner = $1 AND id = ANY($2) RETURNING first_event, last_event`, owner, ranges)
		return err
	})
	return n, err
}

// StaleUnderWay returns owner's ranges older than age, the oldest first:
// those the owner no longer holds in memory are to be swept.
func (s *Store) StaleUnderWay(ctx context.Context, owner string, age time.Duration, limit int) ([]int64, error) {
	rows, err := s.Pool.Query(ctx, `
		SELECT id FROM postbox.under_way WHERE owner = $1 AND created_at < now() - $2 * interval '1 second'
		ORDER BY id LIMIT $3`, owner, age.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("stale ranges under way: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("stale ranges under way: %w", err)
	}
	return ids, nil
}

// sweepEventsSQL reads the events without a delivery of ranges, range by
// range, each through the primary key (the lateral subquery's OFFSET keeps
// the planner from joining all events with all deliveries). The range
// repeated on the deliveries lets the planner read each range's
// deliveries in one pass beside its events (a merge anti join), where it
// looked up each event's: over 200 ranges of 40 events, all delivered,
// it read 17 times fewer pages and took a third less time.
const sweepEventsSQL = `
SELECT e.id, e.endpoint, e.url
FROM unnest($1::int8[], $2::int8[]) AS r(first_event, last_event)
CROSS JOIN LATERAL (
  SELECT e.id, e.endpoint, coalesce(e.url, '') AS url FROM postbox.events e
  WHERE e.id BETWEEN r.first_event AND r.last_event
    AND NOT EXISTS (SELECT 1 FROM postbox.deliveries d
                    WHERE d.event_pk = e.id AND d.event_pk BETWEEN r.first_event AND r.last_event)
  OFFSET 0
) e`

// sweepUnderWay deletes ranges by the statement del (RETURNING their first
// and last events) and gives their events without a delivery pending
// ones. The delete comes first, in a statement of its own: it waits for a
// recording that holds a range FOR SHARE, and the statements after it,
// with snapshots taken after, see what that recording wrote.
func sweepUnderWay(ctx context.Context, tx pgx.Tx, lane LaneFunc, del string, args ...any) (int64, error) {
	rows, err := tx.Query(ctx, del, args...)
	if err != nil {
		return 0, fmt.Errorf("sweep under way: %w", err)
	}
	var firsts, lasts []int64
	for rows.Next() {
		var f, l int64
		if err := rows.Scan(&f, &l); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sweep under way: %w", err)
		}
		firsts, lasts = append(firsts, f), append(lasts, l)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sweep under way: %w", err)
	}
	if len(firsts) == 0 {
		return 0, nil
	}
	rows, err = tx.Query(ctx, sweepEventsSQL, firsts, lasts)
	if err != nil {
		return 0, fmt.Errorf("sweep under way: %w", err)
	}
	var pks []int64
	var lanes []string
	for rows.Next() {
		var pk int64
		var endpoint, rowURL string
		if err := rows.Scan(&pk, &endpoint, &rowURL); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sweep under way: %w", err)
		}
		l := ""
		if lane != nil {
			l = lane(endpoint, rowURL)
		}
		pks, lanes = append(pks, pk), append(lanes, l)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sweep under way: %w", err)
	}
	if len(pks) == 0 {
		return 0, nil
	}
	// No one else writes these deliveries: the ranges' rows are locked
	// until this commits, and every other writer of an event under way
	// holds its range FOR SHARE.
	tag, err := tx.Exec(ctx, `
		INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status)
		SELECT e.id, e.endpoint, nullif(nullif(r.lane, ''), e.endpoint), 'pending'
		FROM unnest($1::int8[], $2::text[]) AS r(event_pk, lane)
		JOIN postbox.events e ON e.id = r.event_pk`, pks, lanes)
	if err != nil {
		return 0, fmt.Errorf("sweep under way: %w", err)
	}
	return tag.RowsAffected(), nil
}

// planUnderWaySQL picks, of events under way ($3, of the ranges $2), those
// whose delivery owner ($1) may write: their range is still its, held
// FOR SHARE (so a sweep deleting it waits for this transaction, or this
// statement waits for the sweep's and then finds the range gone), and they
// have no delivery. It numbers their deliveries and gives the database's
// time, for the copy that writes them. Its ranges are found by key and
// then checked for their owner (a range's id is never another owner's):
// with the owner in the same condition, a plan kept under keyPlans, made
// while postbox.under_way was empty, read all of the owner's ranges
// through its index instead.
const planUnderWaySQL = `
WITH mine AS (SELECT id, owner FROM postbox.under_way WHERE id = ANY($2) FOR SHARE)
SELECT r.ord, nextval('postbox.deliveries_id_seq'), now()
FROM unnest($2::int8[], $3::int8[]) WITH ORDINALITY AS r(range_id, event_pk, ord)
WHERE r.range_id IN (SELECT id FROM mine WHERE owner = $1)
  AND NOT EXISTS (SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = r.event_pk)`

// underWayColumns are the columns recordUnderWay copies.
var underWayColumns = []string{"id", "event_pk", "endpoint", "lane", "status", "attempt_count", "next_attempt_at",
	"last_error", "last_status_code", "last_response_ms", "last_response", "delivered_at", "commit_to_delivery_ms",
	"attempt_target", "attempted_by", "attempt_revision", "updated_at", "attempt_sent", "created_at", "lease_owner"}

// underWayResult is the first outcome of an event under way (its
// Result's EventPK and Range name it), as recordUnderWay writes it.
type underWayResult struct {
	Result *state.Result
	Inline bool // a first attempt that delivered, kept on its row
}

// copier is a Querier that copies too: a pool, a connection or a
// transaction.
type copier interface {
	Querier
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// recordUnderWay writes the deliveries of events under way once, in the
// state their first attempts left them: what recordResultsSQL's update
// does to an in-flight delivery with no attempt before, as a copy. A
// released delivery (no attempt made) is pending after its delay; a
// delivered one keeps its attempt on its row (Inline). It returns the
// delivery ids by event id: those of fenced ranges, or of events with a
// delivery already, are missing. Call it in a transaction: the ranges'
// locks must last until the copy is committed.
func recordUnderWay(ctx context.Context, q copier, owner string, rs []underWayResult) (map[int64]int64, error) {
	n := len(rs)
	ranges, events := make([]int64, n), make([]int64, n)
	for i := range rs {
		ranges[i], events[i] = rs[i].Result.Range, rs[i].Result.EventPK
	}
	ids := make(map[int64]int64, n)
	var picked []int
	var now time.Time
	// In a transaction (the recorder's) keyPlans holds until recordPlans;
	// outside one, for the batch's implicit transaction.
	b := &pgx.Batch{}
	b.Queue(keyPlans)
	b.Queue(planUnderWaySQL, owner, ranges, events).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var ord, id int64
			if err := rows.Scan(&ord, &id, &now); err != nil {
				return err
			}
			if _, twice := ids[events[ord-1]]; twice {
				continue // one delivery per event, whatever the batch says
			}
			picked = append(picked, int(ord-1))
			ids[events[ord-1]] = id
		}
		return rows.Err()
	})
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("record under way: %w", err)
	}
	if len(picked) == 0 {
		return ids, nil
	}
	_, err := q.CopyFrom(ctx, pgx.Identifier{"postbox", "deliveries"}, underWayColumns,
		pgx.CopyFromSlice(len(picked), func(k int) ([]any, error) {
			u := &rs[picked[k]]
			r := u.Result
			// NULL where recordResultsSQL's update leaves the column so.
			var lane, lastErr, code, ms, resp, deliveredAt, c2d, target, by, sent any
			if r.Lane != "" {
				lane = r.Lane
			}
			status, attempts, due, created := string(r.Status), int32(0), now, now
			if start := attemptStart(*r); r.Attempted && start.Before(now) {
				// Created when its first attempt started (from memory, as
				// the event was ingested): never after it was delivered.
				created = start
			}
			switch r.Status {
			case state.Released:
				status, due = string(postboxtype.DeliveryPending), now.Add(r.Delay)
			case postboxtype.DeliveryFailed:
				due = now.Add(r.Delay)
			case postboxtype.DeliveryDelivered:
				deliveredAt = r.At
				if r.CommitToDeliveryMS != -1 {
					c2d = float32(r.CommitToDeliveryMS)
				}
			}
			if r.Attempted {
				attempts, ms, lastErr, resp = 1, float32(r.ResponseMS), orNull(r.LastError), orNull(r.Response)
				if r.StatusCode != 0 {
					code = int32(r.StatusCode)
				}
			}
			var rev, keptBy any
			if r.Keep && r.Status == postboxtype.DeliveryFailed {
				keptBy = owner
			}
			if u.Inline {
				target, by, sent = orNull(r.Target), owner, orNull(r.Sent)
				if r.EndpointRevision != 0 {
					rev = r.EndpointRevision
				}
			}
			return []any{ids[r.EventPK], r.EventPK, r.Endpoint, lane, status, attempts, due, lastErr, code, ms, resp,
				deliveredAt, c2d, target, by, rev, now, sent, created, keptBy}, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("record under way: copy: %w", err)
	}
	return ids, nil
}

// loadUnderWaySQL reads kept events by id, as a claim returns deliveries,
// while they have no delivery and their range is still owner's. The
// ranges are found by key, then checked for their owner, as in
// planUnderWaySQL.
const loadUnderWaySQL = `
WITH ranges AS MATERIALIZED (SELECT id, owner FROM postbox.under_way WHERE id = ANY($2))
SELECT 0::int8, e.endpoint, '', 0, e.event_id::text, coalesce(e.url, ''), e.event_type,
       e.payload::text, e.headers::text, e.created_at, e.committed_at, e.message,
       coalesce(e.commit_lsn - '0/0', 0)::int8, e.id, r.range_id
FROM unnest($1::int8[], $2::int8[]) AS r(event_pk, range_id)
JOIN ranges u ON u.id = r.range_id AND u.owner = $3
JOIN postbox.events e ON e.id = r.event_pk
WHERE NOT EXISTS (SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = e.id)
ORDER BY e.id`

// LoadUnderWay reads the events under way that owner keeps, to attempt
// them: each Claimed has DeliveryID 0 and its EventPK and Range. Those of
// ranges no longer owner's (swept, owner thought dead) or with a delivery
// already are left out.
func (s *Store) LoadUnderWay(ctx context.Context, owner string, events, ranges []int64) ([]Claimed, error) {
	var out []Claimed
	b := &pgx.Batch{}
	b.Queue(keyPlans)
	b.Queue(loadUnderWaySQL, events, ranges, owner).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			c, err := scanClaimedWith(rows, true)
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	if err := s.Pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("load under way: %w", err)
	}
	return out, nil
}

// queueUnderWaySQL gives kept events pending deliveries, to be claimed by
// any instance, while their range is owner's (FOR SHARE, as for
// planUnderWaySQL) and they have no delivery.
const queueUnderWaySQL = `
INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status)
SELECT e.id, e.endpoint, nullif(nullif(r.lane, ''), e.endpoint), 'pending'
FROM unnest($2::int8[], $3::int8[], $4::text[]) AS r(event_pk, range_id, lane)
JOIN (SELECT id FROM postbox.under_way WHERE id = ANY($3) AND owner = $1 FOR SHARE) u ON u.id = r.range_id
JOIN postbox.events e ON e.id = r.event_pk
WHERE NOT EXISTS (SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = e.id)`

// QueueUnderWay returns kept events to the queue (another instance has
// registered, or their lane takes no work now) and reports how many it
// queued.
func (s *Store) QueueUnderWay(ctx context.Context, owner string, events, ranges []int64, lanes []string) (int64, error) {
	tag, err := s.Pool.Exec(ctx, queueUnderWaySQL, owner, events, ranges, lanes)
	if err != nil {
		return 0, fmt.Errorf("queue under way: %w", err)
	}
	return tag.RowsAffected(), nil
}
