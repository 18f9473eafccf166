package ingest

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/watermark"
)

// ReconcileBatchDefault is how many outbox rows reconciliation reads and
// ingests at a time.
const ReconcileBatchDefault = 1000

// reconcileAfter reconciles the rows committed as of snapshot once the
// stream has passed pos: reported it flushed, or ingested past it.
func (s *Supervisor) reconcileAfter(ctx context.Context, pos pglogrepl.LSN, snapshot string, flushed *watermark.Watermark[pglogrepl.LSN]) {
	select {
	case <-ctx.Done():
		return
	case <-flushed.WaitFor(pos):
	case <-s.durable.WaitFor(pos):
	}
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := s.reconcile(ctx, snapshot)
		if err == nil || ctx.Err() != nil {
			return
		}
		wait := service.RetryWait(attempt)
		s.log.Warn().Err(err).Dur("retry_in", wait).Msg("reconciling the outbox failed")
		service.Sleep(ctx, wait)
	}
}

// reconcile ingests outbox rows that never came through the stream: rows
// written while no slot existed, or whose WAL a lost slot took with it.
// Rows the stream brings as well are ingested once (the unique key), and
// only the first ingest delivers them.
func (s *Supervisor) reconcile(ctx context.Context, snapshot string) error {
	if !s.reconMu.TryLock() {
		return nil
	}
	defer s.reconMu.Unlock()
	cfg := s.env.Config()
	conn, err := s.env.Store.AcquireIngest(ctx, s.env.Owner)
	if err != nil {
		return err
	}
	defer conn.Release()
	conn.SetConcurrent() // the stream ingests beside it
	var after, total int64
	for ctx.Err() == nil {
		rows, err := s.env.Store.UningestedOutbox(ctx, after, ReconcileBatchDefault, snapshot, cfg.MaxBody)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			break
		}
		fanned := fanOut(cfg, rows)
		evs := make([]store.NewEvent, len(fanned))
		for i, row := range fanned {
			evs[i], _, _ = s.newEvent(cfg, row, 0, time.Time{}, false, false)
		}
		conn.SetSearchKeys(cfg.SearchKeys)
		got, err := conn.Insert(ctx, evs, cfg.OutboxRetention == 0)
		if err == nil {
			err = conn.Commit(ctx, 0, len(got) > 0)
		}
		if err != nil {
			_ = conn.Rollback(ctx) // err says why; the rollback's is the same or less
			return err
		}
		total += int64(len(got))
		s.afterInsert(evs, make([]*dispatch.Job, len(evs)), got) // no fast path: no jobs, nothing kept
		after = rows[len(rows)-1].OutboxID
		s.deps.Queued()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.reconciled.Store(true)
	if err := s.env.Store.SetReconcilePending(ctx, false); err != nil {
		s.log.Warn().Err(err).Msg("reconciled, but could not record it; the next leader reconciles again (harmlessly)")
	}
	if total > 0 {
		s.log.Warn().Int64("events", total).Msg("reconciled outbox rows the stream had not delivered")
	}
	return nil
}
