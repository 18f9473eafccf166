// Claims returned to the queue: a dead owner's, stale ones whose answer was
// lost, and an instance's own at shutdown.

package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ReleaseAbandonedOf returns to the queue, due at once (a kept retry at
// its time, see RecordResults), up to limit deliveries in flight or kept
// of owners that are still gone (see DeadOwners; the
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
				    lease_owner = NULL, next_attempt_at = greatest(next_attempt_at, now()), updated_at = now()
				WHERE id IN (SELECT id FROM postbox.deliveries
				             WHERE status IN ('in_flight', 'failed') AND lease_owner = ANY($1)
				             LIMIT $2 FOR UPDATE SKIP LOCKED)`, dead, limit)
			if err != nil {
				return 0, fmt.Errorf("release abandoned deliveries: %w", err)
			}
			n = tag.RowsAffected()
			// Their events under way get pending deliveries.
			err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
				queued, err := sweepOwnersUnderWay(ctx, tx, dead, lane)
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
// unchanged, for longer than age, or kept as retries due longer ago than
// age: candidates for Rescue once the owner has checked that it does not
// hold them in memory.
func (s *Store) StaleOwned(ctx context.Context, owner string, age time.Duration, limit int) ([]int64, error) {
	rows, err := s.Pool.Query(ctx, `
		SELECT id FROM postbox.deliveries
		WHERE lease_owner = $1
		  AND ((status = 'in_flight' AND updated_at < now() - $2::interval)
		       OR (status = 'failed' AND next_attempt_at < now() - $2::interval))
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
// A retry owner kept (RecordResults) and gives up is queued at its time.
func (s *Store) Rescue(ctx context.Context, owner string, ids []int64) (int64, error) {
	var n int64
	b := &pgx.Batch{}
	b.Queue(noTableScan) // by id, as RecordResults (see recordResultsSQL)
	b.Queue(`
		UPDATE postbox.deliveries
		SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
		    lease_owner = NULL, next_attempt_at = greatest(next_attempt_at, now()), updated_at = now()
		WHERE id = ANY($2) AND (status IS NOT DISTINCT FROM 'in_flight' OR status IS NOT DISTINCT FROM 'failed')
		  AND lease_owner IS NOT DISTINCT FROM $1`, owner, ids).Exec(func(tag pgconn.CommandTag) error {
		n = tag.RowsAffected()
		return nil
	})
	if err := s.Pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("rescue stale claims: %w", err)
	}
	return n, nil
}

// ReturnKept returns to the queue, at their own times, the retries owner
// kept of ids (see RecordResults' Keep), as Rescue does, and with tell
// says when the earliest falls due to the other instances
// (WakeRetryPayload): they learn of a kept retry only so, and one that is
// free claims it when due, not at its sweep. It returns how many it
// returned and when the earliest falls due, from the server's now.
func (s *Store) ReturnKept(ctx context.Context, owner string, ids []int64, tell bool) (int64, time.Duration, error) {
	var n int64
	var due time.Duration
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, noTableScan); err != nil {
			return err
		}
		var in *float64
		err := tx.QueryRow(ctx, `
			WITH r AS (
			  UPDATE postbox.deliveries
			  SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
			      lease_owner = NULL, next_attempt_at = greatest(next_attempt_at, now()), updated_at = now()
			  WHERE id = ANY($2) AND (status IS NOT DISTINCT FROM 'in_flight' OR status IS NOT DISTINCT FROM 'failed')
			    AND lease_owner IS NOT DISTINCT FROM $1
			  RETURNING next_attempt_at)
			SELECT count(*), extract(epoch FROM min(next_attempt_at) - now()) * 1000 FROM r`, owner, ids).Scan(&n, &in)
		if err != nil || in == nil {
			return err
		}
		due = time.Duration(*in * float64(time.Millisecond))
		if !tell {
			return nil
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, WakeChannel, WakeRetryPayload(owner, due))
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("return kept retries: %w", err)
	}
	return n, due, nil
}

// ReleaseOwned returns every delivery owner still holds to the queue, due
// at once (kept retries at their time): for a clean shutdown after the in-flight attempts are recorded.
// Its events under way get pending deliveries in the lanes lane gives.
func (s *Store) ReleaseOwned(ctx context.Context, owner string, lane LaneFunc) (int64, error) {
	tag, err := s.Pool.Exec(ctx, `
		UPDATE postbox.deliveries
		SET status = CASE WHEN attempt_count = 0 THEN 'pending' ELSE 'failed' END,
		    lease_owner = NULL, next_attempt_at = greatest(next_attempt_at, now()), updated_at = now()
		WHERE status IN ('in_flight', 'failed') AND lease_owner = $1`, owner)
	if err != nil {
		return 0, fmt.Errorf("release deliveries: %w", err)
	}
	n := tag.RowsAffected()
	// Its events under way, not attempted or not recorded, are queued as
	// a dead owner's would be.
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		queued, err := sweepOwnersUnderWay(ctx, tx, []string{owner}, lane)
		n += queued
		return err
	})
	if err != nil {
		return n, fmt.Errorf("release events under way: %w", err)
	}
	return n, nil
}
