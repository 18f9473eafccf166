package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// errStandby: another instance holds the leadership.
var errStandby = errors.New("another instance streams the slot")

// streamLoop keeps this instance streaming when it leads, and standing by
// when another does: it sets up publication and slot, reconciles when the
// slot is new or the server changed, streams, and after a failure
// reconnects with backoff.
func (r *Relay) streamLoop(ctx context.Context) {
	failures := 0
	standby := false
	for ctx.Err() == nil {
		err := r.streamOnce(ctx)
		r.streaming.Store(false)
		r.metrics.Streaming(false)
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		switch {
		case errors.Is(err, errStandby), errors.Is(err, wal.ErrSlotBusy):
			if !standby {
				r.log.Info().Err(err).Msg("standing by: delivering from the queue while another instance streams")
				standby = true
			}
			wait = r.cfg.Load().LeaderLease.D() / 6
		case store.IsFenced(err):
			r.log.Warn().Err(err).Msg("another instance took over streaming (this one was paused or cut off); standing by")
			standby = true
			continue
		case errors.Is(err, wal.ErrSlotMissing):
			r.log.Error().Err(err).Msg("REPLICATION SLOT LOST: dropped, or this server is a promoted standby without it; recreating it and reconciling the outbox table")
			continue
		case errors.Is(err, wal.ErrSlotInvalidated):
			r.log.Error().Err(err).Msg("REPLICATION SLOT INVALIDATED (max_slot_wal_keep_size exceeded?): recreating it and reconciling the outbox table")
			if derr := r.dropSlot(ctx); derr != nil {
				r.log.Error().Err(derr).Msg("could not drop the invalidated slot")
			}
			continue
		default:
			standby = false
			failures++
			wait = retryWait(failures)
			r.log.Warn().Err(err).Dur("retry_in", wait).Msg("replication session ended")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// dropSlot drops the slot, first ending the walsender attached to it.
func (r *Relay) dropSlot(ctx context.Context) error {
	if err := r.detachSlot(ctx); err != nil {
		return err
	}
	return wal.DropSlot(ctx, r.pool, r.cfg.Load().Slot)
}

// detachSlot ends the walsender still attached to the slot (a leader that
// died, froze or lost its network) and waits until the slot is free.
func (r *Relay) detachSlot(ctx context.Context) error {
	slot := r.cfg.Load().Slot
	for range 50 {
		st, err := wal.Slot(ctx, r.pool, slot)
		if err != nil {
			return err
		}
		if !st.Exists || !st.Active {
			return nil
		}
		if _, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, st.ActivePID); err != nil {
			return fmt.Errorf("end the walsender (pid %d) of slot %s: %w", st.ActivePID, slot, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%w: its walsender would not end", wal.ErrSlotBusy)
}

// streamOnce runs one replication session, if this instance can lead.
func (r *Relay) streamOnce(ctx context.Context) error {
	cfg := r.cfg.Load()
	lead, ok, leader, err := r.store.AcquireLeadership(ctx, r.owner, cfg.LeaderLease.D())
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w (%s)", errStandby, leader)
	}
	sessCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lost atomic.Bool
	go r.keepLeadership(sessCtx, lead, cancel, &lost)
	defer func() {
		if ctx.Err() != nil && !lost.Load() {
			// A clean stop: hand over at once rather than after the lease.
			rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = r.store.ReleaseLeadership(rctx, r.owner, lead)
			rcancel()
		}
	}()

	if err := wal.EnsurePublication(ctx, r.pool, cfg.Publication, cfg.Table()); err != nil {
		return err
	}
	slot, err := wal.Slot(ctx, r.pool, cfg.Slot)
	if err != nil {
		return err
	}
	if slot.Exists && slot.Database != r.dbName {
		return fmt.Errorf("replication slot %s belongs to database %s, not %s: give this relay a slot name of its own (slot:)", cfg.Slot, slot.Database, r.dbName)
	}
	if slot.Exists && slot.Plugin != "pgoutput" {
		return fmt.Errorf("replication slot %s uses plugin %s, not pgoutput: drop it or choose another slot name", cfg.Slot, slot.Plugin)
	}
	if slot.Exists && slot.WALStatus == "lost" {
		return fmt.Errorf("%w: wal_status is lost", wal.ErrSlotInvalidated)
	}
	if slot.Exists && slot.Active {
		// We hold the lease, so whoever is attached lost it: a leader that
		// died without closing its connection, or froze.
		r.log.Warn().Int("pid", slot.ActivePID).Msg("taking the slot over from a walsender whose leader's lease expired")
		if err := r.detachSlot(ctx); err != nil {
			return err
		}
	}
	cp, err := r.store.Checkpoint(ctx)
	if err != nil {
		return err
	}
	if !slot.Exists {
		created, err := wal.CreateSlot(ctx, cfg.DatabaseURL, cfg.Slot)
		if err != nil {
			return err
		}
		if created {
			if cp.LSN != 0 {
				// postbox streamed from this slot before: it was dropped,
				// or this is a promoted standby, which (before PostgreSQL
				// 17's failover slots) has none.
				r.log.Error().Str("slot", cfg.Slot).Stringer("last_checkpoint", cp.LSN).
					Msg("REPLICATION SLOT LOST: dropped, or this server is a promoted standby without it; recreated it, and reconciling the outbox table for what was written meanwhile")
			} else {
				r.log.Info().Str("slot", cfg.Slot).Msg("created replication slot")
			}
			r.reconciled.Store(false) // rows written while there was no slot
		}
	}

	queue := wal.NewQueue(ingestQueueRows, ingestQueueBytes)
	ing := &ingester{r: r, in: queue, drained: make(chan struct{}), fail: cancel, lead: lead}
	var flushed atomic.Uint64
	var reconcileSnap string
	var reconcilePos pglogrepl.LSN
	stream := wal.NewStream(wal.Options{
		ConnString:     cfg.DatabaseURL,
		Slot:           cfg.Slot,
		Publication:    cfg.Publication,
		Table:          cfg.Table(),
		StatusInterval: cfg.StatusInterval.D(),
		StallTimeout:   cfg.StallTimeout.D(),
		Logger:         r.log.With().Str("component", "wal").Logger(),
		Flushed:        func(lsn pglogrepl.LSN) { flushed.Store(uint64(lsn)) },
	})
	plan := func(s wal.Session) (pglogrepl.LSN, pglogrepl.LSN, error) {
		ing.systemID, ing.timeline = s.SystemID, s.Timeline
		start := cp.LSN
		switch {
		case cp.SystemID != "" && cp.SystemID != s.SystemID:
			// A different server (restored, rebuilt): its LSNs say
			// nothing about the old checkpoint.
			r.log.Error().Str("was", cp.SystemID).Str("now", s.SystemID).
				Msg("the database server changed (system identifier): not trusting the checkpoint; reconciling the outbox table")
			start = 0
			r.reconciled.Store(false)
		case cp.Timeline != 0 && cp.Timeline != s.Timeline:
			// A failover or promotion: the slot is the new primary's.
			r.log.Warn().Int32("was", cp.Timeline).Int32("now", s.Timeline).
				Msg("the database server's timeline changed (failover): not trusting the checkpoint; reconciling the outbox table")
			start = 0
			r.reconciled.Store(false)
		}
		r.durable.Store(uint64(start))
		if !r.reconciled.Load() {
			// Rows committed as of this snapshot either come through the
			// stream before it passes pos, or never will: those are the
			// ones reconciliation takes, once the stream is past pos.
			snap, pos, err := r.store.Snapshot(ctx)
			if err != nil {
				return 0, 0, err
			}
			reconcileSnap, reconcilePos = snap, pos
		}
		return start, start, nil
	}
	go ing.run(r.hardCtx)
	err = stream.Run(sessCtx, plan, queue, ing, func(s wal.Session) {
		r.streaming.Store(true)
		r.metrics.Streaming(true)
		r.log.Info().Str("slot", cfg.Slot).Stringer("from", pglogrepl.LSN(r.durable.Load())).Str("system_id", s.SystemID).
			Int32("timeline", s.Timeline).Int64("fencing_token", lead.Token).Msg("streaming")
		if reconcileSnap != "" {
			go r.reconcileAfter(sessCtx, reconcilePos, reconcileSnap, &flushed)
		}
	})
	<-ing.drained
	if ing.err != nil {
		return ing.err
	}
	if lost.Load() {
		return fmt.Errorf("%w: the leadership lease was lost", store.ErrFenced)
	}
	return err
}

// keepLeadership renews the lease every third of it; when another
// instance has taken over, or renewals fail for a whole lease, it ends the
// session.
func (r *Relay) keepLeadership(ctx context.Context, lead store.Leadership, cancel context.CancelFunc, lost *atomic.Bool) {
	lease := r.cfg.Load().LeaderLease.D()
	tick := time.NewTicker(lease / 3)
	defer tick.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ok, err := r.store.RenewLeadership(ctx, r.owner, lead, lease)
		switch {
		case err == nil && ok:
			lastOK = time.Now()
		case err == nil:
			lost.Store(true)
			cancel()
			return
		case time.Since(lastOK) > lease:
			r.log.Warn().Err(err).Msg("cannot renew the streaming lease; stepping down")
			lost.Store(true)
			cancel()
			return
		}
	}
}

// Bounds of the queue between the stream and the ingester.
const (
	ingestQueueRows  = 5000
	ingestQueueBytes = 8 << 20
)

// ingester writes what the stream sends into postbox.events and
// postbox.deliveries, with the checkpoint, and hands deliveries it could
// reserve room for straight to the dispatcher.
type ingester struct {
	r       *Relay
	in      *wal.Queue
	drained chan struct{}
	fail    context.CancelFunc // ends the session after an error
	err     error

	// The session's leadership and server, for checkpoint writes; the
	// stream's plan sets the server before it queues anything, and the
	// queue orders that before the ingester reads it.
	lead     store.Leadership
	systemID string
	timeline int32

	conn   *store.IngestConn
	tx     *dispatch.Ingest // the open transaction's handle
	rows   int              // outbox rows written in the open transaction
	queued bool             // it wrote deliveries for the queue (not the fast path)
}

func (ing *ingester) Durable() pglogrepl.LSN   { return ing.r.Durable() }
func (ing *ingester) Drained() <-chan struct{} { return ing.drained }

// maxInsertRows bounds one insert statement.
const maxInsertRows = 2000

func (ing *ingester) run(ctx context.Context) {
	defer close(ing.drained)
	r := ing.r
	conn, err := r.store.AcquireIngest(ctx, r.owner)
	if err != nil {
		ing.abort(fmt.Errorf("ingest connection: %w", err))
		return
	}
	ing.conn = conn
	defer conn.Release()
	for {
		batch, ok := ing.in.Take(ctx)
		if !ok {
			break
		}
		// Commit up to the last finished transaction; a transaction still
		// arriving stays open in its own database transaction.
		split := 0
		for i, ch := range batch {
			if ch.Final {
				split = i + 1
			}
		}
		if split > 0 {
			if err := ing.write(ctx, batch[:split], true); err != nil {
				ing.abort(err)
				return
			}
		}
		if split < len(batch) {
			if err := ing.write(ctx, batch[split:], false); err != nil {
				ing.abort(err)
				return
			}
		}
	}
	// The stream stopped. A transaction cut off mid-way is abandoned; the
	// server sends it again next session, since it was never confirmed.
	if ing.tx != nil {
		conn.Rollback(ctx)
		ing.tx.Finish(errors.New("ingest abandoned: the stream stopped mid-transaction"))
		ing.tx = nil
	}
}

func (ing *ingester) abort(err error) {
	ing.err = err
	if ing.tx != nil {
		ing.tx.Finish(err)
		ing.tx = nil
	}
	ing.fail()
	// Keep draining so the stream is never blocked on a dead consumer.
	go func() {
		for {
			if _, ok := ing.in.Take(context.Background()); !ok {
				return
			}
		}
	}()
}

// write inserts the chunks' rows into the open transaction (opening one)
// and, when commit is set, commits it with the checkpoint of the last
// chunk, which then is a transaction's end.
func (ing *ingester) write(ctx context.Context, chunks []wal.Chunk, commit bool) error {
	r := ing.r
	cfg := r.cfg.Load()
	var evs []store.NewEvent
	var reserved []bool
	for _, c := range chunks {
		for _, row := range c.Rows {
			ev, res := r.newEvent(cfg, row, c.CommitLSN, c.CommitTime, true)
			evs, reserved = append(evs, ev), append(reserved, res)
		}
	}
	for len(evs) > 0 {
		n := min(len(evs), maxInsertRows)
		if ing.tx == nil {
			ing.tx = dispatch.NewIngest()
		}
		got, err := ing.conn.Insert(ctx, evs[:n], cfg.OutboxRetention.D() == 0)
		if err != nil {
			for i, ok := range reserved {
				if ok {
					r.disp.Unreserve(evs[i].Endpoint)
				}
			}
			return fmt.Errorf("ingest: %w", err)
		}
		if r.afterInsert(evs[:n], reserved[:n], got, ing.tx) {
			ing.queued = true
		}
		ing.rows += n
		evs, reserved = evs[n:], reserved[n:]
	}
	if !commit {
		return nil
	}
	end := chunks[len(chunks)-1].EndLSN
	if ing.tx == nil {
		r.advanceDurable(end) // empty transactions: nothing to write
		return nil
	}
	ing.conn.SetSession(ing.lead, ing.systemID, ing.timeline)
	err := ing.conn.Commit(ctx, end, ing.queued)
	if store.IsFenced(err) {
		return err
	}
	if ing.rows >= 1000 {
		r.log.Debug().Int("rows", ing.rows).Stringer("lsn", end).Msg("ingested a large transaction")
	}
	tx, queued := ing.tx, ing.queued
	ing.tx, ing.rows, ing.queued = nil, 0, false
	tx.Finish(err)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	r.advanceDurable(end)
	if queued {
		r.backlog.Store(true)
		r.wakeClaimer()
	}
	return nil
}

// newEvent turns an outbox row into the event to ingest and decides its
// delivery's first state. With fast set, a deliverable event whose endpoint
// has room is reserved a slot and written in_flight, owned by this
// instance.
func (r *Relay) newEvent(cfg *config.Config, row wal.Row, commitLSN pglogrepl.LSN, commitTime time.Time, fast bool) (store.NewEvent, bool) {
	ev := store.NewEvent{
		EventID: row.EventID, Endpoint: row.Endpoint, URL: row.URL, EventType: row.EventType,
		Payload: row.Payload, Headers: row.Headers, CreatedAt: row.CreatedAt, OutboxID: row.OutboxID,
		CommitLSN: commitLSN, CommittedAt: commitTime, Status: state.Pending,
	}
	t := resolve(cfg, event{EventID: row.EventID, Endpoint: row.Endpoint, URL: row.URL, EventType: row.EventType,
		Payload: row.Payload, CreatedAt: row.CreatedAt, Invalid: row.Invalid})
	switch {
	case t.reason != "":
		ev.Status, ev.LastError = state.DeadLetter, t.reason
	case fast && !t.ep.Ordered && !r.guard.blocked(row.Endpoint, r.now()) && r.disp.Reserve(row.Endpoint):
		ev.Status = state.InFlight
		return ev, true
	}
	return ev, false
}

// afterInsert hands the fast-path deliveries to the dispatcher (their
// attempts may start before the transaction commits; their results wait
// for it) and gives back reservations for events that were already
// ingested. It reports whether any delivery went to the queue instead.
func (r *Relay) afterInsert(evs []store.NewEvent, reserved []bool, got []store.Ingested, tx *dispatch.Ingest) (queued bool) {
	inserted := make([]int64, len(evs))
	for _, g := range got {
		inserted[g.Index] = g.DeliveryID
	}
	r.metrics.Ingested(len(got))
	for i := range evs {
		ev := &evs[i]
		id := inserted[i]
		switch {
		case reserved[i] && id == 0:
			r.disp.Unreserve(ev.Endpoint)
		case reserved[i]:
			r.disp.Submit(&dispatch.Job{
				DeliveryID: id, Endpoint: ev.Endpoint, Attempt: 1, EventID: ev.EventID, URL: ev.URL,
				EventType: ev.EventType, Payload: ev.Payload, Headers: ev.Headers,
				CreatedAt: ev.CreatedAt, CommittedAt: ev.CommittedAt, Ingest: tx,
			}, true)
		case id != 0 && ev.Status == state.Pending:
			queued = true
		case id != 0 && ev.Status == state.DeadLetter:
			r.log.Warn().Str("event_id", ev.EventID).Str("endpoint", ev.Endpoint).Str("reason", ev.LastError).Msg("dead letter at ingest")
		}
	}
	return queued
}

// reconcileAfter runs reconcile for the rows committed as of snapshot once
// the stream's flushed position has reached pos.
func (r *Relay) reconcileAfter(ctx context.Context, pos pglogrepl.LSN, snapshot string, flushed *atomic.Uint64) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for pglogrepl.LSN(flushed.Load()) < pos && r.Durable() < pos {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := r.reconcile(ctx, snapshot)
		if err == nil || ctx.Err() != nil {
			return
		}
		wait := retryWait(attempt)
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("reconciling the outbox failed")
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// reconcile ingests outbox rows that never came through the stream: rows
// written while no slot existed, or whose WAL a lost slot took with it.
// Rows the stream brings as well are ingested once (the unique key), and
// only the first ingest delivers them.
func (r *Relay) reconcile(ctx context.Context, snapshot string) error {
	if !r.reconMu.TryLock() {
		return nil
	}
	defer r.reconMu.Unlock()
	cfg := r.cfg.Load()
	conn, err := r.store.AcquireIngest(ctx, r.owner)
	if err != nil {
		return err
	}
	defer conn.Release()
	var after, total int64
	for ctx.Err() == nil {
		rows, err := r.store.UningestedOutbox(ctx, after, 1000, snapshot)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			break
		}
		evs := make([]store.NewEvent, len(rows))
		for i, o := range rows {
			evs[i], _ = r.newEvent(cfg, wal.Row{OutboxID: o.ID, EventID: o.EventID, Endpoint: o.Endpoint, URL: o.URL,
				EventType: o.EventType, Payload: o.Payload, Headers: o.Headers, CreatedAt: o.CreatedAt, Invalid: o.Invalid}, 0, time.Time{}, false)
		}
		got, err := conn.Insert(ctx, evs, cfg.OutboxRetention.D() == 0)
		if err == nil {
			err = conn.Commit(ctx, 0, len(got) > 0)
		}
		if err != nil {
			conn.Rollback(ctx)
			return err
		}
		total += int64(len(got))
		r.afterInsert(evs, make([]bool, len(evs)), got, nil) // no fast path: nothing reserved
		after = rows[len(rows)-1].ID
		r.backlog.Store(true)
		r.wakeClaimer()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.reconciled.Store(true)
	if total > 0 {
		r.log.Warn().Int64("events", total).Msg("reconciled outbox rows the stream had not delivered")
	}
	return nil
}
