package ingest

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/execute"
	"github.com/postbox-relay/postbox/relay/internal/policy"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// prepared is a chunk's rows as the ingest writes them, decided when the
// chunk arrived (Supervisor.prepare), with the first attempts it started.
type prepared struct {
	evs  []store.NewEvent
	jobs []*dispatch.Job // per row: its first attempt, submitted at once, or nil
	tx   *transaction    // the jobs' ingest, finished with the transaction that writes the chunk; nil without jobs
	// waits says a delivery of the chunk waits for its commit: written
	// pending for the queue, or in flight to be kept by id.
	waits bool
	ahead bool // prepared by the stream (prepareAhead)
}

// prepare decides, as a chunk arrives, what becomes of its rows, and
// submits the first attempts of those the fast path takes: everything an
// attempt sends is in the row, so it starts now, in the stream's
// goroutine, rather than behind the ingest of what arrived before. Its
// outcome is recorded once the ingest has committed, under the id the
// insert returns (dispatch.Dispatcher.Assign).
func (s *Supervisor) prepare(c *wal.Chunk[prepared]) {
	cfg := s.env.Config()
	alone := s.deps.Alone()
	rows := fanOut(cfg, c.Rows)
	p := &prepared{evs: make([]store.NewEvent, 0, len(rows)), jobs: make([]*dispatch.Job, 0, len(rows))}
	for _, row := range rows {
		ev, r, t := s.newEvent(cfg, row, c.CommitLSN, c.CommitTime, true, alone)
		p.evs = append(p.evs, ev)
		p.waits = p.waits || r == routeKeep || ev.Status == postboxtype.DeliveryPending
		if r != routeFast {
			p.jobs = append(p.jobs, nil)
			continue
		}
		if p.tx == nil {
			p.tx = newTransaction(s.leads)
		}
		j := &dispatch.Job{Event: ev.Event, Lane: ev.Lane, Attempt: 1, CommittedAt: ev.CommittedAt, Received: c.Received,
			Ingest: p.tx, Resolved: &execute.Resolved{Config: cfg, Target: t}}
		s.deps.Fast.Submit(j, true)
		p.jobs = append(p.jobs, j)
	}
	c.Prepared = p
}

// prepareAhead is the stream's Prepare: it prepares a chunk, then lets
// the attempts just submitted start before the stream reads on (a new
// goroutine waits in this P's queue until the current one blocks; other
// Ps do not steal it at once). Once the ingest has failed, or while its
// write is stuck (AheadStallDefault), it prepares nothing: what the
// session still streams may be dropped, and no attempt should start for it.
func (ing *ingester) prepareAhead(c *wal.Chunk[prepared]) {
	if ing.failed.Load() {
		return
	}
	if w := ing.writing.Load(); w != 0 && time.Since(time.Unix(0, w)) > AheadStallDefault {
		return
	}
	s := ing.s
	s.prepare(c)
	p := c.Prepared
	p.ahead = true
	if p.tx != nil {
		runtime.Gosched()
	}
}

// prepared returns what prepare decided for a chunk, preparing it now if
// the stream did not.
func (s *Supervisor) prepared(c *wal.Chunk[prepared]) *prepared {
	if c.Prepared == nil {
		s.prepare(c)
	}
	return c.Prepared
}

// releaseKeepReservations gives back the kept reservations of deliveries
// that will not be written (those in flight without a job).
func (s *Supervisor) releaseKeepReservations(evs []store.NewEvent, jobs []*dispatch.Job) {
	for i := range evs {
		if jobs[i] == nil && evs[i].Status == postboxtype.DeliveryInFlight {
			s.deps.Fast.Keep(evs[i].Key(), dispatch.Kept{})
		}
	}
}

// route is where newEvent sends an event's delivery.
type route int

const (
	routeQueue route = iota // pending in the queue table (or a dead letter)
	routeFast               // in flight, its job submitted at once
	routeKeep               // in flight, kept by id until its lane has room
)

// newEvent turns an outbox row into the event to ingest and decides its
// delivery's first state, with the request it resolved to (for the first
// attempt of a delivery on the fast path). With fast set, a deliverable
// event whose endpoint has room is reserved a slot and written in_flight,
// owned by this instance; when its lane has no room but drains, and this
// instance is alone (no other could claim it from the queue), it is
// written in_flight all the same and kept by id
// (dispatch.Dispatcher.ReserveKeep).
func (s *Supervisor) newEvent(cfg *config.Config, row store.OutboxRow, commitLSN pglogrepl.LSN, commitTime time.Time, fast, alone bool) (store.NewEvent, route, execute.Target) {
	// Rows from the stream, messages and the reconciliation alike: a name
	// too long to keep is stored cut, and Resolve refuses it.
	row.Endpoint = store.StoredEndpoint(row.Endpoint)
	ev := store.NewEvent{OutboxRow: row, CommitLSN: commitLSN, CommittedAt: commitTime, Status: postboxtype.DeliveryPending}
	if lane := cfg.Lane(row.Endpoint, row.URL); lane != row.Endpoint {
		ev.Lane = lane
	}
	if row.Fanout && row.Endpoint == "" && row.Invalid == "" {
		// Routed, and no endpoint matched: recorded, never attempted.
		ev.Status, ev.LastError = postboxtype.DeliveryDeadLetter, policy.ReasonNoSubscriber+": no enabled endpoint subscribes to its event type (or its filter did not hold)"
		return ev, routeQueue, execute.Target{}
	}
	if row.PayloadTooLarge > 0 {
		// Too large to have been read: refused whatever else the row says.
		ev.Status = postboxtype.DeliveryDeadLetter
		ev.LastError = fmt.Sprintf("%s: %d bytes is above max_body (%d)", policy.ReasonPayloadTooLarge, row.PayloadTooLarge, cfg.MaxBody)
		ev.Payload, ev.PayloadDropped = []byte("null"), row.PayloadTooLarge
		return ev, routeQueue, execute.Target{}
	}
	t := execute.Resolve(cfg, execute.Event{Event: row.Event, Invalid: row.Invalid})
	switch {
	case strings.HasPrefix(t.Reason, policy.ReasonPayloadTooLarge):
		// Refused before it is stored: the payload is not copied.
		ev.Status, ev.LastError = postboxtype.DeliveryDeadLetter, t.Reason
		ev.Payload, ev.PayloadDropped = []byte("null"), len(row.Payload)
	case t.Held != "":
		// Its endpoint's row is disabled or invalid: pending, and the
		// claim skips it until the row changes.
	case t.Reason != "":
		ev.Status, ev.LastError = postboxtype.DeliveryDeadLetter, t.Reason
	case fast && !t.Endpoint.Ordered && !s.deps.Blocked(ev.Key(), s.env.Now()):
		switch {
		case s.deps.Fast.Reserve(ev.Key()):
			// Under way when copied: its delivery is written once, with
			// its first attempt's outcome (or delivered at the insert, when
			// the attempt delivered first: writeDelivered).
			ev.Status, ev.UnderWay = postboxtype.DeliveryInFlight, true
			return ev, routeFast, t
		case alone && s.deps.Fast.ReserveKeep(ev.Key()):
			ev.Status, ev.UnderWay = postboxtype.DeliveryInFlight, true
			return ev, routeKeep, t
		}
	}
	return ev, routeQueue, t
}
