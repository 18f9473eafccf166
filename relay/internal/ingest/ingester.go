package ingest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/execute"
	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// Ingester bounds.
const (
	// MaxInsertRowsDefault bounds one insert statement.
	MaxInsertRowsDefault = 2000
	// LargeTransactionRows is the size above which an ingested transaction
	// is logged (at debug).
	LargeTransactionRows = 1000
)

// ingester writes what one session's stream sends into postbox.events and
// postbox.deliveries, with the checkpoint, and hands deliveries it could
// reserve room for straight to the dispatcher. It is the stream's Acker.
type ingester struct {
	s       *Supervisor
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
	kept   []keptDelivery   // deliveries it wrote in flight to be kept by id
}

// keptDelivery is a delivery written in flight for this instance, to be
// kept by id once its transaction commits (dispatch.Dispatcher.Keep).
type keptDelivery struct {
	lane string
	id   int64 // 0: its event had been ingested before
}

var _ wal.Acker = (*ingester)(nil)

func newIngester(s *Supervisor, in *wal.Queue, lead store.Leadership, fail context.CancelFunc) *ingester {
	return &ingester{s: s, in: in, drained: make(chan struct{}), fail: fail, lead: lead}
}

func (ing *ingester) Durable() pglogrepl.LSN   { return ing.s.durable.Get() }
func (ing *ingester) Drained() <-chan struct{} { return ing.drained }

// run ingests until the stream closes the queue. After a failure it keeps
// taking (and dropping) what arrives, so the stream is never blocked on a
// dead consumer; it returns once the queue is closed.
func (ing *ingester) run(ctx context.Context) {
	defer close(ing.drained)
	conn, err := ing.s.env.Store.AcquireIngest(ctx, ing.s.env.Owner)
	if err != nil {
		ing.abort(fmt.Errorf("ingest connection: %w", err))
	} else {
		ing.conn = conn
		defer conn.Release()
	}
	for {
		batch, ok := ing.in.Take(context.WithoutCancel(ctx))
		if !ok {
			break
		}
		if ing.err != nil {
			continue
		}
		if err := ing.ingest(ctx, batch); err != nil {
			ing.abort(err)
		}
	}
	// The stream stopped. A transaction cut off mid-way is abandoned; the
	// server sends it again next session, since it was never confirmed.
	if ing.tx != nil {
		conn.Rollback(ctx)
		ing.tx.Finish(errors.New("ingest abandoned: the stream stopped mid-transaction"))
		ing.tx = nil
	}
	ing.keep(false)
}

// keep hands the deliveries the transaction wrote in flight to be kept
// over to the dispatcher once it has committed, or gives their
// reservations back. (When a failed commit committed after all, their
// rows wait for the sweep's rescue: no one holds them.)
func (ing *ingester) keep(committed bool) {
	for _, k := range ing.kept {
		id := k.id
		if !committed {
			id = 0
		}
		ing.s.deps.Fast.Keep(k.lane, id)
	}
	ing.kept = ing.kept[:0]
}

// ingest commits up to the last finished transaction of a batch; a
// transaction still arriving stays open in its own database transaction.
func (ing *ingester) ingest(ctx context.Context, batch []wal.Chunk) error {
	split := 0
	for i, ch := range batch {
		if ch.Final {
			split = i + 1
		}
	}
	if split > 0 {
		if err := ing.write(ctx, batch[:split], true); err != nil {
			return err
		}
	}
	if split < len(batch) {
		return ing.write(ctx, batch[split:], false)
	}
	return nil
}

func (ing *ingester) abort(err error) {
	ing.err = err
	if ing.tx != nil {
		ing.tx.Finish(err) // Release closes the connection of a transaction left open
		ing.tx = nil
	}
	ing.keep(false)
	ing.fail()
}

// write inserts the chunks' rows into the open transaction (opening one)
// and, when commit is set, commits it with the checkpoint of the last
// chunk, which then is a transaction's end.
func (ing *ingester) write(ctx context.Context, chunks []wal.Chunk, commit bool) error {
	s := ing.s
	cfg := s.env.Config()
	var evs []store.NewEvent
	var jobs []*dispatch.Job
	submitted := false
	alone := s.deps.Alone()
	for _, c := range chunks {
		for _, row := range c.Rows {
			ev, r := s.newEvent(cfg, row, c.CommitLSN, c.CommitTime, true, alone)
			evs = append(evs, ev)
			if r != routeFast {
				jobs = append(jobs, nil)
				continue
			}
			// The first attempt starts now, while the event is written:
			// everything it sends is in the row. Its outcome is recorded
			// once the ingest has committed, under the id the insert
			// returns (dispatch.Dispatcher.Assign).
			if ing.tx == nil {
				ing.tx = dispatch.NewIngest()
			}
			j := &dispatch.Job{
				Endpoint: ev.Endpoint, Lane: ev.Lane, Attempt: 1, EventID: ev.EventID, URL: ev.URL,
				EventType: ev.EventType, Payload: ev.Payload, Headers: ev.Headers,
				CreatedAt: ev.CreatedAt, CommittedAt: ev.CommittedAt, Ingest: ing.tx,
			}
			s.deps.Fast.Submit(j, true)
			jobs, submitted = append(jobs, j), true
		}
	}
	if submitted {
		// Let the attempts just submitted start before this goroutine
		// goes on to the insert: a new goroutine waits in this P's queue
		// until the current one blocks (other Ps do not steal it at
		// once), and building and sending the insert took ~130 µs.
		runtime.Gosched()
	}
	for len(evs) > 0 {
		n := min(len(evs), MaxInsertRowsDefault)
		if ing.tx == nil {
			ing.tx = dispatch.NewIngest()
		}
		ing.conn.SetSearchKeys(cfg.SearchKeys)
		got, err := ing.conn.Insert(ctx, evs[:n], cfg.OutboxRetention == 0)
		if err != nil {
			// The jobs submitted keep no id: their outcomes are dropped
			// once the ingest is finished (failed), and the stream brings
			// the events again.
			return fmt.Errorf("ingest: %w", err)
		}
		queued, kept := s.afterInsert(evs[:n], jobs[:n], got)
		ing.queued = ing.queued || queued
		ing.kept = append(ing.kept, kept...)
		ing.rows += n
		evs, jobs = evs[n:], jobs[n:]
	}
	if !commit {
		return nil
	}
	end := chunks[len(chunks)-1].EndLSN
	if ing.tx == nil {
		s.durable.Advance(end) // empty transactions: nothing to write
		return nil
	}
	ing.conn.SetSession(ing.lead, ing.systemID, ing.timeline)
	err := ing.conn.Commit(ctx, end, ing.queued)
	tx, queued, rows, kept := ing.tx, ing.queued, ing.rows, len(ing.kept) > 0
	ing.tx, ing.rows, ing.queued = nil, 0, false
	tx.Finish(err)
	ing.keep(err == nil)
	if err != nil {
		if store.IsFenced(err) {
			return err
		}
		return fmt.Errorf("ingest: %w", err)
	}
	if rows >= LargeTransactionRows {
		s.log.Debug().Int("rows", rows).Stringer("lsn", end).Msg("ingested a large transaction")
	}
	s.durable.Advance(end)
	if queued || kept {
		s.deps.Queued()
	}
	return nil
}

// route is where newEvent sends an event's delivery.
type route int

const (
	routeQueue route = iota // pending in the queue table (or a dead letter)
	routeFast               // in flight, its job submitted at once
	routeKeep               // in flight, kept by id until its lane has room
)

// newEvent turns an outbox row into the event to ingest and decides its
// delivery's first state. With fast set, a deliverable event whose endpoint
// has room is reserved a slot and written in_flight, owned by this
// instance; when its lane has no room but drains, and this instance is
// alone (no other could claim it from the queue), it is written in_flight
// all the same and kept by id (dispatch.Dispatcher.ReserveKeep).
func (s *Supervisor) newEvent(cfg *config.Config, row wal.Row, commitLSN pglogrepl.LSN, commitTime time.Time, fast, alone bool) (store.NewEvent, route) {
	ev := store.NewEvent{
		EventID: row.EventID, Endpoint: row.Endpoint, URL: row.URL, EventType: row.EventType,
		Payload: row.Payload, Headers: row.Headers, CreatedAt: row.CreatedAt, OutboxID: row.OutboxID,
		CommitLSN: commitLSN, CommittedAt: commitTime, Status: state.Pending,
	}
	if lane := cfg.Lane(row.Endpoint, row.URL); lane != row.Endpoint {
		ev.Lane = lane
	}
	if row.PayloadTooLarge > 0 {
		// Too large to have been read: refused whatever else the row says.
		ev.Status = state.DeadLetter
		ev.LastError = fmt.Sprintf("%s: %d bytes is above max_body (%d)", policy.ReasonPayloadTooLarge, row.PayloadTooLarge, cfg.MaxBody)
		ev.Payload, ev.PayloadDropped = []byte("null"), row.PayloadTooLarge
		return ev, routeQueue
	}
	t := execute.Resolve(cfg, execute.Event{EventID: row.EventID, Endpoint: row.Endpoint, URL: row.URL, EventType: row.EventType,
		Payload: row.Payload, CreatedAt: row.CreatedAt, Invalid: row.Invalid})
	switch {
	case strings.HasPrefix(t.Reason, policy.ReasonPayloadTooLarge):
		// Refused before it is stored: the payload is not copied.
		ev.Status, ev.LastError = state.DeadLetter, t.Reason
		ev.Payload, ev.PayloadDropped = []byte("null"), len(row.Payload)
	case t.Reason != "":
		ev.Status, ev.LastError = state.DeadLetter, t.Reason
	case fast && !t.Endpoint.Ordered && !s.deps.Blocked(ev.Key(), s.env.Now()):
		switch {
		case s.deps.Fast.Reserve(ev.Key()):
			ev.Status = state.InFlight
			return ev, routeFast
		case alone && s.deps.Fast.ReserveKeep(ev.Key()):
			ev.Status = state.InFlight
			return ev, routeKeep
		}
	}
	return ev, routeQueue
}

// afterInsert gives the fast-path jobs, submitted before the insert, the
// ids of their deliveries (none for events that were already ingested:
// those jobs' outcomes are dropped). It reports whether any delivery went
// to the queue instead, and returns those written in flight to be kept by
// id (in flight without a job), with their ids (0: ingested before).
func (s *Supervisor) afterInsert(evs []store.NewEvent, jobs []*dispatch.Job, got []store.Ingested) (queued bool, kept []keptDelivery) {
	inserted := make([]int64, len(evs))
	for _, g := range got {
		inserted[g.Index] = g.DeliveryID
	}
	s.env.Metrics.Ingested(len(got))
	for i := range evs {
		ev := &evs[i]
		id := inserted[i]
		switch {
		case jobs[i] != nil:
			s.deps.Fast.Assign(jobs[i], id)
			if id == 0 {
				s.log.Info().Str("event_id", ev.EventID).Str("endpoint", ev.Endpoint).
					Msg("event ingested before (its event_id repeated): not delivered again, and the attempt made meanwhile is not recorded")
			}
		case ev.Status == state.InFlight:
			kept = append(kept, keptDelivery{lane: ev.Key(), id: id})
		case id != 0 && ev.Status == state.Pending:
			queued = true
		case id != 0 && ev.Status == state.DeadLetter:
			s.log.Warn().Str("event_id", ev.EventID).Str("endpoint", ev.Endpoint).Str("reason", ev.LastError).Msg("dead letter at ingest")
		}
	}
	return queued, kept
}
