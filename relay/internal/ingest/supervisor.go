package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/internal/watermark"
)

// Supervisor timing and bounds.
const (
	// DetachTriesDefault and DetachWaitDefault bound the wait for a
	// walsender being ended to let go of the slot.
	DetachTriesDefault = 50
	DetachWaitDefault  = 100 * time.Millisecond
	// ReleaseTimeoutDefault bounds handing the leadership over on a clean
	// stop.
	ReleaseTimeoutDefault = 2 * time.Second
	// QueueRowsDefault and QueueBytesDefault bound the queue between the
	// stream and the ingester: how far the stream reads ahead, and the
	// most one ingest takes. In a catch-up the queue is always full, so
	// this is most of the relay's memory then; more delivered no faster
	// (docs/benchmarks.md).
	QueueRowsDefault  = 2500
	QueueBytesDefault = 4 << 20
)

// errStandby: another instance holds the leadership.
var errStandby = errors.New("another instance streams the slot")

// FastPath is the dispatcher as the ingester uses it: reserve a slot
// before writing a delivery in_flight, then submit it.
type FastPath interface {
	Reserve(endpoint string) bool
	Submit(j *dispatch.Job, reserved bool)
	// Assign gives a job submitted before its insert the delivery id.
	Assign(j *dispatch.Job, id int64)
	// AssignUnderWay names the event of a job submitted before its
	// insert, written under way: its delivery is written with the
	// attempt's outcome.
	AssignUnderWay(j *dispatch.Job, eventPK, rangeID int64)
	// ReserveKeep and Keep keep a delivery by id (see
	// dispatch.Dispatcher.ReserveKeep).
	ReserveKeep(lane string) bool
	Keep(lane string, k dispatch.Kept)
	// Capacity is a lane's in-flight cap: a lane with that many first
	// attempts in a lingering ingest ends the linger.
	Capacity(lane string) int
}

// Deps are what the supervisor needs of the other services.
type Deps struct {
	Fast FastPath
	// Blocked reports whether an endpoint takes no new work now (breaker
	// not closed, paused): its events go to the queue, not the fast path.
	Blocked func(endpoint string, now time.Time) bool
	// Queued says deliveries were written to the queue table; Kept that
	// deliveries were kept in flight for the lanes to take (see
	// dispatch.Dispatcher.ReserveKeep).
	Queued func()
	Kept   func()
	// Alone reports whether no other instance is registered: one that is
	// could claim from the queue what this one would keep.
	Alone func() bool
	// Fatal stops the relay for a fault no waiting cures (a slot of
	// another database). The stream loop returns after calling it, so it
	// must not wait for the supervisor's Stop.
	Fatal func(error)
	// Endpoints applies the changes of postbox.endpoints the stream
	// decodes, at once (nil: none are applied in memory).
	Endpoints Endpoints
	// Linger is how long the ingest of a live transaction waits for more
	// (LingerDefault when zero); a test lengthens it to see what else
	// ends it.
	Linger time.Duration
}

// Endpoints is the instance's applied endpoints as the stream sees them:
// each change as decoded, each transaction's commit once decoded (all
// endpoint changes before it applied), and a reload once the leader has
// seeded endpoint_state.
type Endpoints interface {
	Apply(c wal.EndpointChange)
	Decoded(commit pglogrepl.LSN)
	Reload(ctx context.Context) error
}

func (d Deps) linger() time.Duration {
	if d.Linger > 0 {
		return d.Linger
	}
	return LingerDefault
}

// Supervisor streams and ingests. Start it, Stop it.
type Supervisor struct {
	env   *service.Env
	log   zerolog.Logger
	deps  Deps
	loops service.Loops
	hard  context.Context // Start's: ingest writes finish under it after Stop

	durable        *watermark.Watermark[pglogrepl.LSN]
	ingested       atomic.Int64                  // transactions ingested (or, empty, passed), over the process's life
	streamingSince atomic.Int64                  // Unix ns when the session began streaming; 0 while it does not
	walsender      atomic.Pointer[wal.Walsender] // the streaming session's; nil while none streams
	reconciled     atomic.Bool
	guards         guards
	reconMu        sync.Mutex
	lease          *leaseClock // the lead the current session streams under
}

// New returns a Supervisor.
func New(env *service.Env, deps Deps) *Supervisor {
	return &Supervisor{env: env, log: env.Logger("ingest"), deps: deps, durable: watermark.New[pglogrepl.LSN](0),
		lease: newLeaseClock()}
}

// Start runs the streaming loop. ctx bounds the ingest's writes, which
// finish what the stream delivered also after Stop.
func (s *Supervisor) Start(ctx context.Context) error {
	s.hard = ctx
	return s.loops.Start(ctx, s.loop)
}

// Stop ends the replication session (the ingester commits what it was
// sent, the stream confirms it) and waits for every goroutine.
func (s *Supervisor) Stop() { s.loops.Stop() }

// Streaming reports whether this instance streams the slot now.
func (s *Supervisor) Streaming() bool { return s.streamingSince.Load() != 0 }

// Durable is the LSN up to which outbox transactions are ingested.
func (s *Supervisor) Durable() *watermark.Watermark[pglogrepl.LSN] { return s.durable }

// WalsenderCPU reads the CPU of the walsender streaming this instance's
// session, and its pid, where it runs on this machine
// (wal.Walsender.CPU); ok is false while no session streams, or its
// walsender is elsewhere.
func (s *Supervisor) WalsenderCPU() (pid int, c proc.CPU, ok bool) {
	w := s.walsender.Load()
	if w == nil {
		return 0, c, false
	}
	c, err := w.CPU()
	return w.PID, c, err == nil
}

func (s *Supervisor) setStreaming(on bool) {
	if on {
		s.streamingSince.Store(time.Now().UnixNano())
	} else {
		s.streamingSince.Store(0)
		s.walsender.Store(nil)
	}
	s.env.Metrics.Streaming(on)
}

// streamedFor is how long the current session has streamed (0 when it
// does not).
func (s *Supervisor) streamedFor() time.Duration {
	since := s.streamingSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// loop keeps this instance streaming when it leads, and standing by when
// another does; after a failure it starts again with backoff.
//
// failures counts the failures of one incident only: a session that worked
// before it failed, or a database that answered that another instance
// streams, starts the count again, so that a relay that rode out earlier
// faults resumes the next one as soon as the first. (A count kept for the
// process's life reached the cap after a handful of database faults,
// however far apart, and each later fault then held every instance's
// stream back for as long.)
func (s *Supervisor) loop(ctx context.Context) {
	failures := 0
	standby := false
	for ctx.Err() == nil {
		ingested := s.ingested.Load()
		err := s.session(ctx)
		streamed := s.streamedFor()
		s.setStreaming(false)
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		if errors.Is(err, errStandby) || errors.Is(err, wal.ErrSlotBusy) {
			s.env.Faults.Observe("ingest", nil) // the database answered
		} else {
			s.env.Faults.Observe("ingest", err)
		}
		switch {
		case errors.Is(err, errStandby), errors.Is(err, wal.ErrSlotBusy):
			if !standby {
				s.log.Info().Err(err).Msg("standing by: delivering from the queue while another instance streams")
				standby = true
			}
			failures = 0 // the database answered: a later failure is a new one
			wait = s.env.Config().LeaderLease / 6
		case store.IsFenced(err):
			s.log.Warn().Err(err).Msg("another instance took over streaming (this one was paused or cut off); standing by")
			standby = true
			continue
		case errors.Is(err, wal.ErrSlotMissing):
			s.log.Error().Err(err).Msg("REPLICATION SLOT LOST: dropped, or this server is a promoted standby without it; recreating it and reconciling the outbox table")
			continue
		case errors.Is(err, wal.ErrSlotElsewhere):
			// Retrying would only repeat it: the relay stops, and run
			// exits with it.
			s.log.Error().Err(err).Msg("stopping: no waiting cures this")
			if s.deps.Fatal != nil {
				s.deps.Fatal(err)
			}
			return
		case errors.Is(err, wal.ErrSlotInvalidated):
			s.log.Error().Err(err).Msg("REPLICATION SLOT INVALIDATED (max_slot_wal_keep_size exceeded?): recreating it and reconciling the outbox table")
			if derr := s.dropSlot(ctx); derr != nil {
				s.log.Error().Err(derr).Msg("could not drop the invalidated slot")
			}
			continue
		default:
			standby = false
			if s.ingested.Load() != ingested || streamed >= service.RetryCapDefault {
				// The session worked (it ingested, or streamed for a
				// while) until this failure: a new incident, retried as
				// soon as the first of one. (Ingested as committed, not
				// as durable: the durable position waits for the server
				// to report the commit flushed, and a fault can end the
				// session between the two.)
				failures = 0
			}
			failures++
			wait = service.RetryWait(failures)
			s.log.Warn().Err(err).Dur("retry_in", wait).Msg("replication session ended")
		}
		if !service.Sleep(ctx, wait) {
			return
		}
	}
}

// dropSlot drops the slot, first ending the walsender attached to it.
func (s *Supervisor) dropSlot(ctx context.Context) error {
	if err := s.detachSlot(ctx); err != nil {
		return err
	}
	return wal.DropSlot(ctx, s.env.Pool(), s.env.Config().Slot)
}

// detachSlot ends the walsender still attached to the slot (a leader that
// died, froze or lost its network) and waits until the slot is free.
func (s *Supervisor) detachSlot(ctx context.Context) error {
	slot := s.env.Config().Slot
	for range DetachTriesDefault {
		st, err := wal.Slot(ctx, s.env.Pool(), slot)
		if err != nil {
			return err
		}
		if !st.Exists || !st.Active {
			return nil
		}
		if _, err := s.env.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, st.ActivePID); err != nil {
			return fmt.Errorf("end the walsender (pid %d) of slot %s: %w", st.ActivePID, slot, err)
		}
		if !service.Sleep(ctx, DetachWaitDefault) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("%w: its walsender would not end", wal.ErrSlotBusy)
}

// session runs one replication session, if this instance can lead. Its
// goroutines are joined before it returns.
func (s *Supervisor) session(ctx context.Context) error {
	cfg := s.env.Config()
	// Every instance, leading or not, notes whether the primary is
	// guarded: after a failover, the one that leads on the promoted
	// standby needs to know it of the old primary (slotCameAlong).
	if tl, slots, err := wal.SynchronizedStandbySlots(ctx, s.env.Pool()); err == nil {
		s.guards.note(tl, slots != "")
	}
	sent := time.Now()
	lead, ok, leader, err := s.env.Store.AcquireLeadership(ctx, s.env.Owner, cfg.LeaderLease)
	if err == nil && !ok && leader != "" && s.leaderGone(ctx, leader) {
		// The leader's process is gone from this host: its lease can
		// only run out, and the stream need not wait for that.
		gone := leader
		sent = time.Now()
		lead, ok, leader, err = s.env.Store.TakeLeadershipFrom(ctx, s.env.Owner, gone, cfg.LeaderLease)
		if ok {
			s.log.Info().Str("instance", gone).Msg("taking the stream over at once from a leader of this host whose process is gone (same boot, its pid no longer runs it)")
		}
	}
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w (%s)", errStandby, leader)
	}
	s.lease.renewed(sent, cfg.LeaderLease)
	defer s.lease.clear()
	sessCtx, cancel := context.WithCancel(ctx)
	var helpers sync.WaitGroup
	defer helpers.Wait()
	defer cancel()
	var lost atomic.Bool
	helpers.Go(func() { s.keepLeadership(sessCtx, lead, cancel, &lost) })
	defer func() {
		if ctx.Err() != nil && !lost.Load() {
			// A clean stop: hand over at once rather than after the lease.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeoutDefault)
			_ = s.env.Store.ReleaseLeadership(rctx, s.env.Owner, lead)
			rcancel()
		}
	}()

	cp, slot, err := s.prepareSlot(ctx)
	if err != nil {
		return err
	}
	queue := wal.NewQueue[prepared](QueueRowsDefault, QueueBytesDefault)
	ing := newIngester(s, queue, lead, cancel)
	flushed := watermark.New[pglogrepl.LSN](0)
	var reconcileSnap string
	var reconcilePos pglogrepl.LSN
	opts := wal.Options[prepared]{
		ConnString:           cfg.DatabaseURL,
		Slot:                 cfg.Slot,
		Publication:          cfg.Publication,
		Table:                cfg.Table,
		StatusInterval:       cfg.StatusInterval,
		StallTimeout:         cfg.StallTimeout,
		WalsenderNice:        cfg.WalsenderNice,
		MaxBody:              func() int { return int(s.env.Config().MaxBody) },
		Logger:               s.env.Logger("wal"),
		Flushed:              func(lsn pglogrepl.LSN) { flushed.Reset(lsn) },
		Prepare:              ing.prepareAhead,
		Route:                s.route,
		EndpointsPublication: wal.EndpointsPublication(cfg.Publication),
	}
	if e := s.deps.Endpoints; e != nil {
		opts.EndpointChange, opts.Decoded = e.Apply, e.Decoded
	}
	stream := wal.NewStream(opts)
	plan := func(ss wal.Session) (pglogrepl.LSN, pglogrepl.LSN, error) {
		ing.systemID, ing.timeline = ss.SystemID, ss.Timeline
		start := cp.LSN
		switch {
		case cp.SystemID != "" && cp.SystemID != ss.SystemID:
			// A different server (restored, rebuilt): its LSNs say
			// nothing about the old checkpoint.
			s.log.Error().Str("was", cp.SystemID).Str("now", ss.SystemID).
				Msg("the database server changed (system identifier): not trusting the checkpoint; reconciling the outbox table")
			start = 0
			if err := s.markReconcilePending(ctx); err != nil {
				return 0, 0, err
			}
		case cp.Timeline != 0 && cp.Timeline != ss.Timeline && slotCameAlong(slot, cp, s.guards.was(cp.Timeline)):
			// A failover slot synchronised to the promoted standby
			// (PostgreSQL 17+), that skipped no change this server's
			// checkpoint lacks: from the checkpoint it brings every
			// change committed after it.
			s.log.Warn().Int32("was", cp.Timeline).Int32("now", ss.Timeline).
				Stringer("slot_confirmed", slot.ConfirmedFlush).Stringer("checkpoint", cp.LSN).
				Msg("the database server's timeline changed (failover) and the replication slot came along (a synchronised failover slot): streaming on from the checkpoint")
		case cp.Timeline != 0 && cp.Timeline != ss.Timeline:
			// A failover or promotion: the slot is the new primary's, or
			// confirms what this server's checkpoint lacks (an ingest
			// committed on the old primary only).
			s.log.Warn().Int32("was", cp.Timeline).Int32("now", ss.Timeline).
				Bool("slot_found", slot.Exists).Stringer("slot_confirmed", slot.ConfirmedFlush).Stringer("checkpoint", cp.LSN).
				Msg("the database server's timeline changed (failover): not trusting the checkpoint; reconciling the outbox table")
			start = 0
			if err := s.markReconcilePending(ctx); err != nil {
				return 0, 0, err
			}
		}
		s.durable.Reset(start)
		if err := s.seedEndpoints(ctx, cp.LSN); err != nil {
			return 0, 0, err
		}
		if !s.reconciled.Load() {
			// Rows committed as of this snapshot either come through the
			// stream before it passes pos, or never will: those are the
			// ones reconciliation takes, once the stream is past pos.
			snap, pos, err := s.env.Store.Snapshot(ctx)
			if err != nil {
				return 0, 0, err
			}
			reconcileSnap, reconcilePos = snap, pos
		}
		return start, start, nil
	}
	helpers.Go(func() { ing.run(s.hard) })
	err = stream.Run(sessCtx, plan, queue, ing, func(ss wal.Session) {
		s.walsender.Store(&ss.Walsender)
		s.setStreaming(true)
		s.env.Faults.Observe("ingest", nil)
		s.log.Info().Str("slot", cfg.Slot).Stringer("from", s.durable.Get()).Str("system_id", ss.SystemID).
			Int32("timeline", ss.Timeline).Int64("fencing_token", lead.Token).Msg("streaming")
		if reconcileSnap != "" {
			helpers.Go(func() { s.reconcileAfter(sessCtx, reconcilePos, reconcileSnap, flushed) })
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

// leaderGone reports whether the leader named is proven gone: an instance
// of this host whose process no longer runs (proc.Gone). Its lease alone
// says nothing of that, nor does a slot let go of (a connection cut while
// its process lives looks the same).
func (s *Supervisor) leaderGone(ctx context.Context, leader string) bool {
	if leader == s.env.Owner {
		return false
	}
	p, ok, err := s.env.Store.InstanceProcess(ctx, leader)
	return err == nil && ok && proc.Gone(p)
}

// slotCameAlong reports whether a slot found on a server of a new
// timeline can be trusted from the checkpoint on. It must have existed
// before this session (not recreated), and either confirm no position
// past the checkpoint, which is this server's own, replicated with its
// data; or come from a primary that was guarded (synchronized_standby_slots):
// there the walsender reports only positions its standbys have, so the
// slot was confirmed past an ingested transaction only once the standby
// had the ingest's commit, and past the checkpoint only over WAL that
// held nothing of the outbox (the stream idle, confirming the server's
// position).
func slotCameAlong(slot wal.SlotState, cp store.Checkpoint, guarded bool) bool {
	return slot.Exists && slot.ConfirmedFlush != 0 && (slot.ConfirmedFlush <= cp.LSN || guarded)
}

// guards records, by timeline, whether the primary was seen guarded:
// its synchronized_standby_slots set, so the walsender of a failover slot
// reports only positions its standbys have.
type guards struct {
	mu sync.Mutex
	by map[int32]bool
}

func (g *guards) note(timeline int32, guarded bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.by == nil {
		g.by = map[int32]bool{}
	}
	g.by[timeline] = guarded
}

// was reports whether the primary of timeline was seen guarded, the last
// time this process looked (false when it never did).
func (g *guards) was(timeline int32) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.by[timeline]
}

// prepareSlot makes sure the publication and a usable slot exist (taking
// the slot over from a walsender whose leader lost the lease) and returns
// the checkpoint to stream from, and the slot as found (Exists false when
// it was made now).
func (s *Supervisor) prepareSlot(ctx context.Context) (store.Checkpoint, wal.SlotState, error) {
	cfg := s.env.Config()
	if err := wal.EnsurePublication(ctx, s.env.Pool(), cfg.Publication, cfg.Table); err != nil {
		return store.Checkpoint{}, wal.SlotState{}, err
	}
	if err := wal.EnsureEndpointsPublication(ctx, s.env.Pool(), cfg.Publication); err != nil {
		return store.Checkpoint{}, wal.SlotState{}, err
	}
	slot, err := wal.Slot(ctx, s.env.Pool(), cfg.Slot)
	if err != nil {
		return store.Checkpoint{}, wal.SlotState{}, err
	}
	switch {
	case slot.Exists && slot.Database != s.env.DBName:
		return store.Checkpoint{}, slot, &wal.SlotElsewhereError{Slot: cfg.Slot, SlotDatabase: slot.Database, Database: s.env.DBName}
	case slot.Exists && slot.Plugin != "pgoutput":
		return store.Checkpoint{}, slot, fmt.Errorf("replication slot %s uses plugin %s, not pgoutput: drop it or choose another slot name", cfg.Slot, slot.Plugin)
	case slot.Exists && slot.WALStatus == "lost":
		return store.Checkpoint{}, slot, fmt.Errorf("%w: wal_status is lost", wal.ErrSlotInvalidated)
	case slot.Exists && slot.Active:
		// We hold the lease, so whoever is attached lost it: a leader that
		// died without closing its connection, or froze.
		s.log.Warn().Int("pid", slot.ActivePID).Msg("taking the slot over from a walsender whose leader's lease expired")
		if err := s.detachSlot(ctx); err != nil {
			return store.Checkpoint{}, wal.SlotState{}, err
		}
	}
	cp, err := s.env.Store.Checkpoint(ctx)
	if err != nil {
		return cp, slot, err
	}
	// The checkpoint may be an ingest's that the server has not flushed
	// (the last session could not flush it at its end): a crash would
	// undo it, and the session must not confirm it to the slot before.
	if _, err := s.env.Store.FlushWAL(ctx); err != nil {
		return cp, slot, err
	}
	if cp.ReconcilePending {
		// Owed by a leader that did not finish it (it died, or lost the
		// lease): this one does.
		s.reconciled.Store(false)
	}
	if slot.Exists {
		return cp, slot, nil
	}
	// Rows written while there was no slot reach postbox only by
	// reconciling the table. The debt is recorded before the slot is made:
	// recorded after, a stop or a failed write between the two would leave
	// a slot and no debt, and those rows in the table for good. A debt
	// recorded for a slot then not made is paid all the same, harmlessly.
	if err := s.markReconcilePending(ctx); err != nil {
		return cp, slot, fmt.Errorf("before creating the slot: %w", err)
	}
	created, err := wal.CreateSlot(ctx, cfg.DatabaseURL, cfg.Slot)
	if err != nil {
		return cp, slot, err
	}
	if created {
		if cp.LSN != 0 {
			// postbox streamed from this slot before: it was dropped, or
			// this is a promoted standby, which (before PostgreSQL 17's
			// failover slots) has none.
			s.log.Error().Str("slot", cfg.Slot).Stringer("last_checkpoint", cp.LSN).
				Msg("REPLICATION SLOT LOST: dropped, or this server is a promoted standby without it; recreated it, and reconciling the outbox table for what was written meanwhile")
		} else {
			s.log.Info().Str("slot", cfg.Slot).Msg("created replication slot")
		}
	}
	return cp, slot, nil
}

// seedEndpoints copies postbox.endpoints whole into endpoint_state, at
// the position the stream resumes from, when it was never copied for the
// slot or not since a reconciliation was owed (the slot's stream may have
// missed changes, as it missed rows); then the instance's table is read
// again if the seed changed it. A seed pays the reconciliation's debt for
// the endpoints alone: the outbox's may still be owed, and is no reason
// to seed again.
// It runs before the stream starts, so no ingest writes beside it.
func (s *Supervisor) seedEndpoints(ctx context.Context, at pglogrepl.LSN) error {
	seeded, err := s.env.Store.EndpointsSeeded(ctx)
	if err != nil || seeded {
		return err
	}
	n, err := s.env.Store.SeedEndpoints(ctx, at)
	if err != nil {
		return err
	}
	s.log.Info().Int("endpoints", n).Msg("seeded the applied endpoints from postbox.endpoints")
	// The instance read endpoint_state whole as it started, and nothing
	// wrote it since but the seed: a seed that changed nothing leaves it
	// current (100,000 rows parsed again took seconds).
	if s.deps.Endpoints != nil && n > 0 {
		return s.deps.Endpoints.Reload(ctx)
	}
	return nil
}

// markReconcilePending records that the outbox table must be reconciled,
// in the database, so that the next leader does it if this one cannot,
// and in this process.
func (s *Supervisor) markReconcilePending(ctx context.Context) error {
	if err := s.env.Store.SetReconcilePending(ctx, true); err != nil {
		return err
	}
	s.reconciled.Store(false)
	return nil
}

// leads reports whether this instance surely still holds the lead it
// streams under, for a sixth of the lease at least: the first attempts
// of what it ingests start before the ingest commits only while it does
// (see newTransaction).
func (s *Supervisor) leads() bool {
	return s.lease.holds(s.env.Config().LeaderLease / 6)
}

// keepLeadership renews the lease every third of it; when another
// instance has taken over, or renewals failed until the lease may have run
// out (by the lease clock), it ends the session.
func (s *Supervisor) keepLeadership(ctx context.Context, lead store.Leadership, cancel context.CancelFunc, lost *atomic.Bool) {
	lease := s.env.Config().LeaderLease
	tick := time.NewTicker(lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		ok, err := s.env.Store.RenewLeadership(ctx, s.env.Owner, lead, lease)
		switch {
		case err == nil && ok:
			s.lease.renewed(sent, lease)
		case err == nil:
			lost.Store(true)
			cancel()
			return
		case !s.lease.holds(0):
			// The lease may have run out: another instance can have
			// taken over.
			s.log.Warn().Err(err).Msg("cannot renew the streaming lease; stepping down")
			lost.Store(true)
			cancel()
			return
		}
	}
}
