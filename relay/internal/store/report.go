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
	return s.purge(ctx, "report rollups", `
		DELETE FROM postbox.report_buckets WHERE ctid IN (
		  SELECT ctid FROM postbox.report_buckets WHERE bucket < now() - $1 * interval '1 second' LIMIT $2)`,
		retention.Seconds(), purgeBatch)
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
