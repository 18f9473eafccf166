// The end of an ingest transaction (Commit with the checkpoint, Rollback,
// Release) and the checkpoint's reads.

package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// saveCheckpointSQL stores the end LSN of an ingested transaction, and the
// server it came from, if the caller still holds leadership token $3;
// otherwise it raises PBF01 (postbox.checkpoint_fenced) and the caller's
// whole ingest transaction rolls back. A plain statement, not a PL/pgSQL
// call: the function call cost more than the update.
const saveCheckpointSQL = `
WITH saved AS (
  UPDATE postbox.checkpoints
  SET lsn = greatest(lsn, $2::pg_lsn), system_id = $4, timeline = $5, updated_at = now(),
      endpoints_lsn = greatest(endpoints_lsn, $6::pg_lsn)
  WHERE slot = $1 AND fencing = $3
  RETURNING 1
)
SELECT postbox.checkpoint_fenced($1, $3) WHERE NOT EXISTS (SELECT FROM saved)`

// Commit stores the checkpoint (when lsn is not zero) and commits; with notify, it wakes every instance's
// claimer as it commits (rows were queued). Without an open transaction it
// stores only the checkpoint.
func (ic *IngestConn) Commit(ctx context.Context, lsn pglogrepl.LSN, notify bool) error {
	_, err := ic.commit(ctx, lsn, notify, false)
	return err
}

// CommitUnflushed commits as Commit does, but without waiting for the
// server to flush the commit to its WAL (synchronous_commit = off), which
// a crash of the server (not of postbox) would then undo. It returns a WAL
// position at or past the commit's record: once the server has flushed
// that far, the commit is durable. (That holds as well for the checkpoint
// alone, written without an open transaction, which follows the server's
// synchronous_commit.) It returns 0 when there was nothing to write.
func (ic *IngestConn) CommitUnflushed(ctx context.Context, lsn pglogrepl.LSN, notify bool) (pglogrepl.LSN, error) {
	return ic.commit(ctx, lsn, notify, true)
}

func (ic *IngestConn) commit(ctx context.Context, lsn pglogrepl.LSN, notify, unflushed bool) (pglogrepl.LSN, error) {
	b := &pgx.Batch{}
	if !ic.inTx && lsn == 0 {
		return 0, nil
	}
	if unflushed && ic.inTx {
		b.Queue("SET LOCAL synchronous_commit = off")
	}
	if notify {
		b.Queue(`SELECT pg_notify($1, '')`, WakeChannel)
	}
	if ic.endpointsLSN != 0 && ic.inTx {
		// Endpoint changes applied (WriteEndpoints): every instance reads
		// them once this commits.
		b.Queue(`SELECT pg_notify($1, '')`, EndpointsChannel)
	}
	if lsn != 0 {
		b.Queue(saveCheckpointSQL, ic.s.Slot, lsn.String(), ic.lead.Token, ic.systemID, ic.timeline, ic.endpointsLSN.String())
	}
	ic.endpointsLSN = 0
	if ic.inTx {
		b.Queue("COMMIT")
	}
	if unflushed {
		// The insert position once the commit has returned lies past its
		// commit record.
		b.Queue("SELECT pg_current_wal_insert_lsn()::text")
	}
	var flushBy pglogrepl.LSN
	br := ic.conn.SendBatch(ctx, b)
	var err error
	if unflushed {
		flushBy, err = lastLSN(br, b.Len())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && ic.inTx {
		// A failed statement left the transaction aborted: end it.
		_, _ = ic.conn.Exec(context.Background(), "ROLLBACK")
	}
	ic.inTx = false
	if IsFenced(err) {
		return 0, fmt.Errorf("commit ingest: %w", ErrFenced)
	}
	if err != nil {
		return 0, fmt.Errorf("commit ingest: %w", err)
	}
	return flushBy, nil
}

// FlushWAL makes everything committed before it durable, also what was
// committed without waiting for its flush (IngestConn.CommitUnflushed):
// it commits a transaction of its own that waits for its WAL flush
// whatever the server's synchronous_commit, and returns how far the
// server's WAL is then flushed. The transaction writes the slot's
// checkpoint row unchanged: a commit waits for its flush only when the
// transaction wrote to the WAL before it.
func (s *Store) FlushWAL(ctx context.Context) (pglogrepl.LSN, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = local")
	b.Queue("UPDATE postbox.checkpoints SET lsn = lsn WHERE slot = $1", s.Slot)
	b.Queue("COMMIT")
	b.Queue("SELECT pg_current_wal_flush_lsn()::text")
	br := s.Pool.SendBatch(ctx, b)
	flushed, err := lastLSN(br, b.Len())
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("flush the WAL: %w", err)
	}
	return flushed, nil
}

// lastLSN reads the results of a batch of n statements whose last returns
// a WAL position as text, and returns that position.
func lastLSN(br pgx.BatchResults, n int) (pglogrepl.LSN, error) {
	for range n - 1 {
		if _, err := br.Exec(); err != nil {
			return 0, err
		}
	}
	var text string
	if err := br.QueryRow().Scan(&text); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(text)
}

// Rollback abandons the open transaction, if any. Its error is the
// server's word on the transaction when it ended the session first (an
// idle_in_transaction_session_timeout, a terminated backend).
func (ic *IngestConn) Rollback(ctx context.Context) error {
	ic.endpointsLSN = 0
	if !ic.inTx {
		return nil
	}
	ic.inTx = false
	if _, err := ic.conn.Exec(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("roll back the ingest: %w", err)
	}
	return nil
}

// Release returns the connection to the pool (closing it when a
// transaction was left open, so no half-written batch survives).
func (ic *IngestConn) Release() {
	if ic.inTx {
		_ = ic.conn.Conn().Close(context.Background())
	} else {
		_, _ = ic.conn.Exec(context.Background(), "RESET plan_cache_mode; RESET enable_nestloop; RESET enable_seqscan")
	}
	ic.conn.Release()
}

// Checkpoint is where ingestion stands for a slot, and on which server.
type Checkpoint struct {
	LSN      pglogrepl.LSN // end of the last ingested transaction (0: none)
	SystemID string        // the server's system identifier then ("": unknown)
	Timeline int32
	// ReconcilePending: a leader found the outbox owed a reconciliation
	// and has not finished it.
	ReconcilePending bool
}

// Checkpoint returns the slot's checkpoint (zero when none).
func (s *Store) Checkpoint(ctx context.Context) (Checkpoint, error) {
	var text string
	var c Checkpoint
	var sys *string
	var tli *int32
	err := s.Pool.QueryRow(ctx, `SELECT lsn::text, system_id, timeline, reconcile_pending FROM postbox.checkpoints WHERE slot = $1`, s.Slot).
		Scan(&text, &sys, &tli, &c.ReconcilePending)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read checkpoint: %w", err)
	}
	if sys != nil {
		c.SystemID = *sys
	}
	if tli != nil {
		c.Timeline = *tli
	}
	c.LSN, err = pglogrepl.ParseLSN(text)
	return c, err
}

// SetReconcilePending records (or clears) that the outbox table must be
// reconciled: rows were written that the slot will never bring. Recorded,
// it marks endpoint_state's seed owed too, as the slot missed endpoint
// changes as it missed rows; the seed then pays that part alone
// (SeedEndpoints), so a start after it does not seed again while the
// outbox's part is still owed (a first start stopped before its
// reconciliation finished seeded again at every start until it did).
func (s *Store) SetReconcilePending(ctx context.Context, pending bool) error {
	if _, err := s.Pool.Exec(ctx, `UPDATE postbox.checkpoints SET reconcile_pending = $2, endpoints_seeded = endpoints_seeded AND NOT $2
		WHERE slot = $1`, s.Slot, pending); err != nil {
		return fmt.Errorf("record reconciliation owed: %w", err)
	}
	return nil
}
