package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Purges delete in batches of at most this many rows, each its own
// statement, so a purge never holds long locks or makes one huge
// transaction.
const purgeBatch = 5000

// purge runs the batch statement until it deletes less than a batch, ctx
// ends, or it has deleted max rows; it returns how many it deleted.
func (s *Store) purge(ctx context.Context, what, sql string, args ...any) (int64, error) {
	var total int64
	for ctx.Err() == nil && total < 100*purgeBatch {
		tag, err := s.Pool.Exec(ctx, sql, args...)
		if err != nil {
			return total, fmt.Errorf("purge %s: %w", what, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			break
		}
	}
	return total, nil
}

// PurgeAttempts deletes attempts older than retention.
func (s *Store) PurgeAttempts(ctx context.Context, retention time.Duration) (int64, error) {
	return s.purge(ctx, "attempts", `
		DELETE FROM postbox.attempts WHERE ctid = ANY (ARRAY(
		  SELECT ctid FROM postbox.attempts
		  WHERE started_at < now() - $1 * interval '1 second' LIMIT $2))`, retention.Seconds(), purgeBatch)
}

// PurgeHistograms deletes the latency histograms' bins that end before
// the window.
func (s *Store) PurgeHistograms(ctx context.Context, window time.Duration) (int64, error) {
	return s.purge(ctx, "latency histograms", `
		DELETE FROM postbox.latency_histogram WHERE ctid = ANY (ARRAY(
		  SELECT ctid FROM postbox.latency_histogram
		  WHERE bin < postbox.latency_bin(now() - $1 * interval '1 second') LIMIT $2))`, window.Seconds(), purgeBatch)
}

// PurgeDeliveries deletes delivered, dead-lettered and replayed
// deliveries older than retention, each status by its own partial index.
func (s *Store) PurgeDeliveries(ctx context.Context, retention time.Duration) (int64, error) {
	var total int64
	for _, p := range []struct{ what, status, at string }{
		{"delivered rows", "delivered", "delivered_at"},
		{"dead letters", "dead_letter", "updated_at"},
		{"replayed dead letters", "replayed", "updated_at"},
	} {
		// The status is written into the statement, not bound, so the
		// planner can match it to the partial index.
		n, err := s.purge(ctx, p.what, `
			DELETE FROM postbox.deliveries WHERE id IN (
			  SELECT id FROM postbox.deliveries
			  WHERE status = '`+p.status+`' AND `+p.at+` < now() - $1 * interval '1 second' LIMIT $2)`,
			retention.Seconds(), purgeBatch)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// PurgeEvents deletes events ingested longer than retention ago that have
// no delivery waiting, with their remaining (finished) deliveries: past
// it, an event can no longer be replayed.
//
// Events are numbered as they are ingested, so those past retention come
// first by id: the purge reads the primary key from the oldest up to the
// first event still within retention, found once per call.
func (s *Store) PurgeEvents(ctx context.Context, retention time.Duration) (int64, error) {
	below := int64(math.MaxInt64) // every event is past retention
	err := s.Pool.QueryRow(ctx, `
		SELECT id FROM postbox.events WHERE ingested_at >= now() - $1 * interval '1 second' ORDER BY id LIMIT 1`,
		retention.Seconds()).Scan(&below)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("purge events: %w", err)
	}
	var total int64
	for ctx.Err() == nil && total < 100*purgeBatch {
		var n int64
		err := s.Pool.QueryRow(ctx, `
			WITH gone AS (
			  DELETE FROM postbox.events WHERE id IN (
			    SELECT e.id FROM postbox.events e
			    WHERE e.id < $3 AND e.ingested_at < now() - $1 * interval '1 second'
			      AND NOT EXISTS (SELECT 1 FROM postbox.deliveries d
			                      WHERE d.event_pk = e.id AND d.status IN ('pending', 'in_flight', 'failed'))
			      AND NOT EXISTS (SELECT 1 FROM postbox.under_way u
			                      WHERE e.id BETWEEN u.first_event AND u.last_event)
			    ORDER BY e.id LIMIT $2)
			  RETURNING id
			),
			finished AS (DELETE FROM postbox.deliveries WHERE event_pk IN (SELECT id FROM gone))
			SELECT count(*) FROM gone`, retention.Seconds(), purgeBatch, below).Scan(&n)
		if err != nil {
			return total, fmt.Errorf("purge events: %w", err)
		}
		total += n
		if n < purgeBatch {
			break
		}
	}
	return total, nil
}

// PurgeIdleLanes deletes the health and rate-limit rows of lanes of row
// URLs ("name → host:port", see config.Lane) that nothing has changed for
// longer than retention and that have no delivery queued or in flight:
// rows can name any host, so their lanes would otherwise be kept forever.
// An endpoint's own row (a bare name) is kept. A lane used again starts
// closed and unthrottled, as a new one does. sep is config.LaneSep
// (config imports this package).
func (s *Store) PurgeIdleLanes(ctx context.Context, retention time.Duration, sep string) (int64, error) {
	n, err := s.purge(ctx, "idle lanes' health", `
		DELETE FROM postbox.endpoint_health WHERE endpoint IN (
		  SELECT h.endpoint FROM postbox.endpoint_health h
		  WHERE strpos(h.endpoint, $3) > 0
		    AND coalesce(greatest(h.opened_at, h.last_success_at, h.last_failure_at, h.paused_until, h.probe_started_at, h.stats_at),
		                 '-infinity') < now() - $1 * interval '1 second'
		    AND `+laneIdle("h.endpoint")+`
		  LIMIT $2)`, retention.Seconds(), purgeBatch, sep)
	if err != nil {
		return n, err
	}
	m, err := s.purge(ctx, "idle lanes' rate buckets", `
		DELETE FROM postbox.rate_buckets WHERE endpoint IN (
		  SELECT b.endpoint FROM postbox.rate_buckets b
		  WHERE strpos(b.endpoint, $3) > 0 AND b.updated_at < now() - $1 * interval '1 second'
		    AND `+laneIdle("b.endpoint")+`
		  LIMIT $2)`, retention.Seconds(), purgeBatch, sep)
	return n + m, err
}

// laneIdle is the condition that the lane named by column has no delivery
// queued (due, parked or retrying), in flight or kept as a retry by an
// instance, each by its own index.
func laneIdle(column string) string {
	var conds []string
	owned := "d.status IN ('in_flight', 'failed') AND d.lease_owner IS NOT NULL"
	for _, q := range []string{queuedPending, queuedRetry, queuedParked, owned} {
		conds = append(conds, "NOT EXISTS (SELECT 1 FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = "+column+" AND "+q+")")
	}
	return strings.Join(conds, " AND ")
}

// PurgeEndpointTombstones deletes the tombstones of postbox.endpoint_state
// (deleted endpoints) written more than retention ago. A tombstone is
// read only by an instance that read endpoint_state before the delete and
// has not since (a read takes the rows at or after its last position):
// once every live instance has read past it, which each does every second,
// it matters to none. An instance that starts reads the table whole,
// tombstones left out. The ctid recheck leaves a row the stream wrote
// again meanwhile (the endpoint recreated).
func (s *Store) PurgeEndpointTombstones(ctx context.Context, retention time.Duration) (int64, error) {
	return s.purge(ctx, "endpoint tombstones", `
		DELETE FROM postbox.endpoint_state WHERE ctid = ANY (ARRAY(
		  SELECT ctid FROM postbox.endpoint_state
		  WHERE jsonb_typeof(row) = 'null' AND written_at < now() - $1 * interval '1 second' LIMIT $2))
		AND jsonb_typeof(row) = 'null'`, retention.Seconds(), purgeBatch)
}
