package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Ingester bounds.
const (
	// MaxInsertRowsDefault bounds one insert statement.
	MaxInsertRowsDefault = 2000
	// LargeTransactionRows is the size above which an ingested transaction
	// is logged (at debug).
	LargeTransactionRows = 1000
	// LingerDefault is how long the ingest gathers the transactions that
	// follow one whose deliveries all went out on the fast path, before
	// it commits them together; LingerRowsDefault rows end it sooner.
	// Nothing waits for such a commit but the records of attempts already
	// made, and one commit of several transactions costs PostgreSQL a
	// fraction of one each (a round trip, the checkpoint update, the WAL
	// flush). A delivery that waits for its commit (queued, kept) ends it
	// at once, and so does a lane's max_in_flight of first attempts: a
	// lane makes only so many attempts ahead of an uncommitted ingest
	// before it waits for the commit (dispatch's aheadLimit), and a linger
	// must neither be what it waits for nor gather more of a lane's
	// attempts than it runs at once. A longer linger saves more, but it is
	// also what a crash repeats: the attempts made within it, not yet
	// written (docs/benchmarks.md).
	LingerDefault     = 50 * time.Millisecond
	LingerRowsDefault = 200
	// AheadStallDefault: the stream prepares chunks ahead of the ingest
	// (starting their first attempts) only while the ingest's current
	// write is younger than this. A write stuck longer (a database that
	// stopped answering, a process that was frozen and lost its lease) may
	// be about to fail, and the session then drops what the stream sent
	// since: attempted already, those events would all be delivered again
	// by the next session.
	AheadStallDefault = 100 * time.Millisecond
)

// ingester writes what one session's stream sends into postbox.events and
// postbox.deliveries, with the checkpoint, and hands deliveries it could
// reserve room for straight to the dispatcher. It is the stream's Acker.
type ingester struct {
	s       *Supervisor
	in      *wal.Queue[prepared]
	drained chan struct{}
	fail    context.CancelFunc // ends the session after an error
	err     error
	failed  atomic.Bool  // err is set: the stream prepares no more
	writing atomic.Int64 // when the current write began (Unix ns), 0 between writes

	// The session's leadership and server, for checkpoint writes; the
	// stream's plan sets the server before it queues anything, and the
	// queue orders that before the ingester reads it.
	lead     store.Leadership
	systemID string
	timeline int32

	// gate holds the durable position back behind commits the server
	// has not flushed.
	gate flushGate

	conn    *store.IngestConn
	open    bool           // a database transaction is open
	handles []*transaction // of the chunks written in it (their first attempts)
	rows    int            // outbox rows written in it
	queued  bool           // it wrote deliveries for the queue (not the fast path)
	kept    []keptDelivery // deliveries it wrote in flight to be kept by id
}

// keptDelivery is a delivery written in flight for this instance, to be
// kept by id once its transaction commits (dispatch.Dispatcher.Keep).
type keptDelivery struct {
	lane string
	id   int64 // 0: its event had been ingested before
	rng  int64 // an event under way: id is its event's
}

var _ wal.Acker = (*ingester)(nil)

func newIngester(s *Supervisor, in *wal.Queue[prepared], lead store.Leadership, fail context.CancelFunc) *ingester {
	return &ingester{s: s, in: in, drained: make(chan struct{}), fail: fail, lead: lead,
		gate: flushGate{durable: s.durable}}
}

// Durable returns the position up to which every transaction is ingested
// by a commit the server has flushed, given that its WAL is flushed at
// least to flushed.
func (ing *ingester) Durable(flushed pglogrepl.LSN) pglogrepl.LSN { return ing.gate.flushedTo(flushed) }
func (ing *ingester) Drained() <-chan struct{}                    { return ing.drained }

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
			ing.drop(batch, ing.err)
			continue
		}
		if err := ing.ingest(ctx, ing.linger(batch)); err != nil {
			ing.abort(err)
		}
	}
	// The stream stopped. A transaction cut off mid-way is abandoned; the
	// server sends it again next session, since it was never confirmed.
	if ing.open {
		if err := conn.Rollback(ctx); err != nil {
			// The session's own end (a lost lease, the stream's error)
			// is what the supervisor hears; what became of the open
			// transaction is a fault of its own when the server ended it.
			ing.s.env.Faults.Observe("ingest", err)
		}
		ing.finish(errors.New("ingest abandoned: the stream stopped mid-transaction"))
	}
	ing.keep(false)
	if ing.gate.pending() && !ing.s.guards.was(ing.timeline) {
		// So the stream's final status confirms all that was ingested.
		// Should this fail, the next session starts from the checkpoint
		// all the same, and confirms it then. Not on a guarded server
		// (synchronized_standby_slots): the local flush says nothing of
		// what its standbys have, and the slot they copy must not be
		// confirmed past an ingest they lack (slotCameAlong).
		if flushed, err := ing.s.env.Store.FlushWAL(ctx); err != nil {
			ing.s.log.Debug().Err(err).Msg("could not flush the last ingest at the session's end")
		} else {
			ing.gate.flushedTo(flushed)
		}
	}
}

// linger adds to a batch of one transaction (the ingest keeps pace) what
// the stream queues within the linger (Deps.Linger), while none of it waits for the
// commit, no lane has its in-flight cap of first attempts in it, and it
// holds fewer than LingerRowsDefault rows. A stream that closes ends it.
// A batch of several transactions is the ingest behind: it commits at
// once.
func (ing *ingester) linger(batch []wal.Chunk[prepared]) []wal.Chunk[prepared] {
	if len(batch) != 1 {
		return batch
	}
	deadline := time.Now().Add(ing.s.deps.linger())
	rows := 0
	var perLane map[string]int
	for seen := 0; ; {
		for i := seen; i < len(batch); i++ {
			p := ing.s.prepared(&batch[i])
			if p.waits || len(batch[i].EndpointChanges) > 0 {
				// An endpoint change waits for this commit on every other
				// instance (endpoint_state, NOTIFY): it ends the linger.
				return batch
			}
			for _, j := range p.jobs {
				if j == nil {
					continue
				}
				if perLane == nil {
					perLane = map[string]int{}
				}
				k := j.Key()
				perLane[k]++
				if perLane[k] >= ing.s.deps.Fast.Capacity(k) {
					return batch
				}
			}
			rows += max(batch[i].Events, len(batch[i].Rows)) // a routed row as its events
		}
		seen = len(batch)
		if rows >= LingerRowsDefault {
			return batch
		}
		more, ok := ing.in.TakeBefore(deadline)
		if !ok {
			return batch
		}
		batch = append(batch, more...)
	}
}

// finish ends the open transaction's handles: its chunks' first attempts
// are recorded (nil) or their outcomes dropped.
func (ing *ingester) finish(err error) {
	for _, h := range ing.handles {
		h.finish(err)
	}
	ing.handles = ing.handles[:0]
	ing.open, ing.rows, ing.queued = false, 0, false
}

// drop gives up chunks that will not be written: the first attempts of
// those prepared have their outcomes dropped, and their kept reservations
// are given back (the stream brings the events again). Chunks not yet
// prepared stay so: no attempt starts for an event that is not written.
func (ing *ingester) drop(chunks []wal.Chunk[prepared], err error) {
	for i := range chunks {
		p := chunks[i].Prepared
		if p == nil {
			continue
		}
		if p.tx != nil {
			p.tx.finish(err)
		}
		ing.s.releaseKeepReservations(p.evs, p.jobs)
	}
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
		ing.s.deps.Fast.Keep(k.lane, dispatch.Kept{ID: id, Range: k.rng})
	}
	ing.kept = ing.kept[:0]
}

// ingest commits up to the last finished transaction of a batch; a
// transaction still arriving stays open in its own database transaction.
func (ing *ingester) ingest(ctx context.Context, batch []wal.Chunk[prepared]) error {
	split := 0
	for i, ch := range batch {
		if ch.Final {
			split = i + 1
		}
	}
	if split > 0 {
		if err := ing.write(ctx, batch[:split], true); err != nil {
			ing.drop(batch[split:], err)
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
	ing.failed.Store(true)
	ing.finish(err) // Release closes the connection of a transaction left open
	ing.keep(false)
	ing.fail()
}

// statementRows is how many of n rows one insert statement takes: as
// few statements as MaxInsertRowsDefault allows, of equal size (2,500
// rows are two statements of 1,250, not 2,000 and 500), so no statement
// of a large ingest is a small one paying a statement's fixed cost.
func statementRows(n int) int {
	if n <= MaxInsertRowsDefault {
		return max(n, 1)
	}
	parts := (n + MaxInsertRowsDefault - 1) / MaxInsertRowsDefault
	return (n + parts - 1) / parts
}

// write inserts the chunks' rows into the open transaction (opening one)
// and, when commit is set, commits it with the checkpoint of the last
// chunk, which then is a transaction's end. When it fails, the chunks not
// yet inserted are dropped.
func (ing *ingester) write(ctx context.Context, chunks []wal.Chunk[prepared], commit bool) error {
	ing.writing.Store(time.Now().UnixNano())
	defer ing.writing.Store(0)
	s := ing.s
	cfg := s.env.Config()
	rows := 0
	for i := range chunks {
		rows += len(chunks[i].Rows)
	}
	evs, jobs := make([]store.NewEvent, 0, rows), make([]*dispatch.Job, 0, rows)
	submitted := false
	for i := range chunks {
		if c := &chunks[i]; c.Final && c.TxRows > 0 && !c.CommitTime.IsZero() {
			var sent time.Duration
			if !c.Sent.IsZero() {
				sent = c.Sent.Sub(c.CommitTime)
			}
			s.env.Metrics.Streamed(sent, c.Received.Sub(c.CommitTime))
		}
		p := s.prepared(&chunks[i])
		if p.tx != nil {
			ing.handles = append(ing.handles, p.tx)
		}
		evs, jobs = append(evs, p.evs...), append(jobs, p.jobs...)
		submitted = submitted || p.tx != nil && !p.ahead
	}
	if submitted {
		// Let the attempts submitted here start before the insert.
		runtime.Gosched()
	}
	if err := ing.writeEndpoints(ctx, chunks); err != nil {
		s.releaseKeepReservations(evs, jobs)
		return fmt.Errorf("ingest: %w", err)
	}
	size := statementRows(len(evs))
	for len(evs) > 0 {
		n := min(len(evs), size)
		writeDelivered(evs[:n], jobs[:n])
		ing.open = true
		ing.conn.SetSearchKeys(cfg.SearchKeys)
		got, err := ing.conn.Insert(ctx, evs[:n], cfg.OutboxRetention == 0)
		if err != nil {
			// The jobs submitted keep no id: their outcomes are dropped
			// once the ingest is finished (failed), and the stream brings
			// the events again.
			s.releaseKeepReservations(evs, jobs)
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
	if !ing.open {
		ing.ended(end, 0) // empty transactions: nothing to write
		return nil
	}
	ing.conn.SetSession(ing.lead, ing.systemID, ing.timeline)
	flushBy, err := ing.conn.CommitUnflushed(ctx, end, ing.queued)
	queued, rows, kept := ing.queued, ing.rows, len(ing.kept) > 0
	ing.finish(err)
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
	ing.ended(end, flushBy)
	if queued {
		s.deps.Queued()
	} else if kept {
		s.deps.Kept()
	}
	return nil
}

// writeEndpoints applies the chunks' changes of postbox.endpoints to
// endpoint_state in the open transaction, which then commits them with
// the events after them: another instance that reads the checkpoint has
// read every change committed before it.
func (ing *ingester) writeEndpoints(ctx context.Context, chunks []wal.Chunk[prepared]) error {
	var ws []store.EndpointWrite
	var whole []bool
	for i := range chunks {
		for _, c := range chunks[i].EndpointChanges {
			w := store.EndpointWrite{Name: c.Name, From: c.OldName, Revision: c.Revision, LSN: c.Commit}
			if !c.Deleted {
				row, err := json.Marshal(c.Row)
				if err != nil {
					return fmt.Errorf("endpoint %s: %w", c.Name, err)
				}
				w.Row = row
			}
			ws, whole = append(ws, w), append(whole, c.Deleted || c.Inserted)
			if c.OldName != "" {
				// Renamed: the old name goes, as by a delete, once the
				// new one has taken its columns.
				ws, whole = append(ws, store.EndpointWrite{Name: c.OldName, Revision: c.Revision, LSN: c.Commit}), append(whole, true)
			}
		}
	}
	if len(ws) == 0 {
		return nil
	}
	ing.open = true
	return ing.conn.WriteEndpoints(ctx, ws, whole)
}

// ended records that the transactions up to end are ingested, durable
// once the server's WAL is flushed to flushBy (see flushGate).
func (ing *ingester) ended(end, flushBy pglogrepl.LSN) {
	ing.s.ingested.Add(1)
	ing.gate.committed(end, flushBy)
}

// writeDelivered writes the deliveries whose first attempts have
// delivered already (live events, whose attempts finish within the
// ingest's linger) as delivered, with their attempts, so that each is one
// row version where an in-flight row and the recorder's update of it were
// two, each with its index entries. The recorder still has their outcomes,
// for the endpoints' health and latency, but writes them no more.
func writeDelivered(evs []store.NewEvent, jobs []*dispatch.Job) {
	for i, j := range jobs {
		if j == nil {
			continue
		}
		if r, ok := j.TakeDelivered(); ok {
			evs[i].Status, evs[i].LastError, evs[i].Delivered = postboxtype.DeliveryDelivered, r.LastError, &r
		}
	}
}

// afterInsert gives the fast-path jobs, submitted before the insert, the
// ids of their deliveries (none for events that were already ingested:
// those jobs' outcomes are dropped). It reports whether any delivery went
// to the queue instead, and returns those written in flight to be kept by
// id (in flight without a job), with their ids (0: ingested before).
func (s *Supervisor) afterInsert(evs []store.NewEvent, jobs []*dispatch.Job, got []store.Ingested) (queued bool, kept []keptDelivery) {
	inserted, ranges := make([]int64, len(evs)), make([]int64, len(evs))
	for _, g := range got {
		inserted[g.Index] = g.DeliveryID
		if g.Range != 0 {
			inserted[g.Index], ranges[g.Index] = g.EventPK, g.Range
		}
	}
	s.env.Metrics.Ingested(len(got))
	for i := range evs {
		ev := &evs[i]
		id := inserted[i]
		switch {
		case jobs[i] != nil && ranges[i] != 0:
			s.deps.Fast.AssignUnderWay(jobs[i], id, ranges[i])
		case jobs[i] != nil:
			s.deps.Fast.Assign(jobs[i], id)
			if id == 0 {
				s.log.Info().Str("event_id", ev.EventID).Str("endpoint", ev.Endpoint).
					Msg("event ingested before (its event_id repeated): not delivered again, and the attempt made meanwhile is not recorded")
			}
		case ev.Status == postboxtype.DeliveryInFlight:
			kept = append(kept, keptDelivery{lane: ev.Key(), id: id, rng: ranges[i]})
		case id != 0 && ev.Status == postboxtype.DeliveryPending:
			queued = true
		case id != 0 && ev.Status == postboxtype.DeliveryDeadLetter:
			if strings.HasPrefix(ev.LastError, policy.ReasonMessagesOff) {
				s.env.Metrics.MessagesRefused(1)
			}
			s.log.Warn().Str("event_id", ev.EventID).Str("endpoint", ev.Endpoint).Str("reason", ev.LastError).Msg("dead letter at ingest")
		}
	}
	return queued, kept
}
