package store

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// PurgeReport deletes the report rollups of quarter hours older than
// retention (report_retention).
func (s *Store) PurgeReport(ctx context.Context, retention time.Duration) (int64, error) {
	n, err := s.purge(ctx, "report rollups", `
		DELETE FROM postbox.report_buckets WHERE ctid IN (
		  SELECT ctid FROM postbox.report_buckets WHERE bucket < now() - $1 * interval '1 second' LIMIT $2)`,
		retention.Seconds(), purgeBatch)
	if err != nil {
		return n, err
	}
	// Deltas of an event that old, a replay's say, are not folded into a
	// bucket the purge would delete again.
	tag, err := s.Pool.Exec(ctx, `DELETE FROM postbox.report_deltas WHERE bucket < now() - $1 * interval '1 second'`, retention.Seconds())
	if err != nil {
		return n, fmt.Errorf("purge report rollups: %w", err)
	}
	return n + tag.RowsAffected(), nil
}

// CompactReport folds the deltas the report triggers appended
// (postbox.report_deltas) into postbox.report_buckets, a batch per
// statement, and returns how many it folded. Each statement deletes the
// deltas it adds, so a delta is counted once whoever folds it (a deposed
// leader's statement waits on the rows, then finds them gone).
func (s *Store) CompactReport(ctx context.Context) (int64, error) {
	var total int64
	for ctx.Err() == nil && total < 100*purgeBatch {
		var n int64
		err := s.Pool.QueryRow(ctx, `
			WITH moved AS (
			  DELETE FROM postbox.report_deltas WHERE ctid = ANY(ARRAY(SELECT ctid FROM postbox.report_deltas LIMIT $1))
			  RETURNING *
			),
			folded AS (
			  INSERT INTO postbox.report_buckets AS r (endpoint, bucket, event_type, committed, delivered, dead_lettered, sums)
			  SELECT endpoint, bucket, event_type, sum(committed), sum(delivered), sum(dead_lettered),
			         (SELECT jsonb_object_agg(k, v) FROM (SELECT f.key AS k, sum(f.value::numeric) AS v
			                                            FROM unnest(array_agg(sums)) AS u(j), jsonb_each_text(u.j) AS f GROUP BY f.key) x)
			  FROM moved
			  GROUP BY 1, 2, 3
			  ORDER BY 1, 2, 3
			  ON CONFLICT (endpoint, bucket, event_type) DO UPDATE
			    SET committed = r.committed + excluded.committed, delivered = r.delivered + excluded.delivered,
			        dead_lettered = r.dead_lettered + excluded.dead_lettered, sums = postbox.report_add(r.sums, excluded.sums)
			)
			SELECT count(*) FROM moved`, purgeBatch*4).Scan(&n)
		if err != nil {
			return total, fmt.Errorf("fold report deltas: %w", err)
		}
		total += n
		if n < purgeBatch*4 {
			break
		}
	}
	return total, nil
}

// SyncReportFields makes postbox.report_fields the payload fields of
// report_sum, which the ingest's trigger sums from then on. It writes
// only when they differ, so every instance may call it.
func (s *Store) SyncReportFields(ctx context.Context, fields []string) error {
	var have []string
	if err := s.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(field ORDER BY field), '{}') FROM postbox.report_fields`).Scan(&have); err != nil {
		return fmt.Errorf("read report_sum fields: %w", err)
	}
	want := slices.Clone(fields)
	slices.Sort(want)
	if slices.Equal(have, want) {
		return nil
	}
	_, err := s.Pool.Exec(ctx, `
		WITH gone AS (DELETE FROM postbox.report_fields WHERE NOT field = ANY($1))
		INSERT INTO postbox.report_fields SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, want)
	if err != nil {
		return fmt.Errorf("write report_sum fields: %w", err)
	}
	return nil
}

// PurgePortalReplays deletes the notes of partners' resends
// (postbox.portal_replays) whose delivery the retention already deleted:
// they label a timeline that no longer exists. The table holds a few rows
// a minute at most (resends are rate-limited), so it is read whole.
func (s *Store) PurgePortalReplays(ctx context.Context) (int64, error) {
	tag, err := s.Pool.Exec(ctx, `
		DELETE FROM postbox.portal_replays r
		WHERE NOT EXISTS (SELECT FROM postbox.deliveries d WHERE d.id = r.delivery_id)`)
	if err != nil {
		return 0, fmt.Errorf("purge portal replays: %w", err)
	}
	return tag.RowsAffected(), nil
}
