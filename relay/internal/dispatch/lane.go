package dispatch

import (
	"time"
)

type lane struct {
	name     string
	cap      int
	inFlight int
	reserved int
	queue    []*Job
	// awaiting are attempts made whose ingest has not finished (see
	// canStart).
	awaiting int
	starved  bool      // in Dispatcher.starved
	lastOK   time.Time // when an attempt of the lane last delivered
	// kept are deliveries written in flight for this instance, or events
	// under way (Kept.Range), held by id alone (see ReserveKeep), oldest
	// first; keepReserved are promised to events being ingested.
	kept         []Kept
	keepReserved int
}

// canStart reports whether the lane's next job may start now: a free
// slot, and, for a job whose ingest has not finished, fewer than
// aheadLimit attempts already made that wait for an ingest. Those cannot
// be recorded until it commits, and a crash before then repeats them all:
// the fast path may start attempts before the commit, for the latency of
// live events, but a lane that answers quickly must not run through its
// whole buffer ahead of a slow ingest. At most aheadLimit(cap) + cap - 1
// attempts a lane are then outstanding at a crash beyond what the queue
// table shows in flight.
func (l *lane) canStart() bool {
	if l.inFlight >= l.cap || len(l.queue) == 0 {
		return false
	}
	j := l.queue[0]
	return j.Ingest == nil || l.awaiting < aheadLimit(l.cap) || j.Ingest.Finished()
}

// aheadLimit is how many finished attempts a lane with in-flight cap c may
// have waiting for their ingest's commit before its next attempt waits
// for it too. Under load a lane gets more than c events within one
// commit, and waiting for each commit showed in the p99; the cost is what
// a crash repeats (docs/benchmarks.md). A lane at a live rate rarely has
// c attempts ahead, so the limit seldom binds there.
func aheadLimit(c int) int { return 3 * c }

// low reports whether the lane has drained to half its limit (to half its
// kept limit while it keeps deliveries): room for the claimer to fill.
func (l *lane) low() bool {
	return l.held() <= l.limit()/2 || len(l.kept) > 0 && l.held() <= l.keptLimit()/2
}

// held is how many jobs the lane holds or has promised room for, in
// memory, with the attempts still waiting for their ingest; kept
// deliveries wait outside it.
func (l *lane) held() int { return l.inFlight + l.reserved + len(l.queue) + l.awaiting }

// keptLimit is how many jobs the lane may hold once its kept deliveries
// are read back (keptLaneLimit).
func (l *lane) keptLimit() int { return keptLaneLimit(l.cap) }

// keptLaneLimit is how many jobs a lane with in-flight cap c may hold once
// its kept deliveries are read back: twice LaneLimit, so that each read
// brings many (they were kept because the lane drains) and the claimer
// wakes for them half as often; more saved nothing (docs/benchmarks.md).
func keptLaneLimit(c int) int { return 2 * LaneLimit(c) }

// idle reports whether the lane holds nothing at all.
func (l *lane) idle() bool { return l.held() == 0 && len(l.kept) == 0 && l.keepReserved == 0 }

// limit is how many jobs a lane may hold: its in-flight cap plus a buffer
// of four times as many, so a slot that frees is refilled without a
// database round trip and claims come in batches.
func (l *lane) limit() int { return LaneLimit(l.cap) }

// LaneLimit is how many jobs a lane with in-flight cap c may hold.
func LaneLimit(c int) int { return 5 * c }

// drainingLaneLimit is how many jobs the fast path may give a lane with
// in-flight cap c that is draining: it delivered within DrainWindow.
// During a catch-up the ingest outruns the attempts; every event the fast
// path takes is written in flight once, where one left to the queue is
// written pending and claimed (a second write of its row and its
// indexes). A lane that hangs or fails delivers nothing, so it never holds
// more than LaneLimit; nor does any lane once the dispatcher holds half
// its budget, which stays for claims and the other lanes.
func drainingLaneLimit(c int) int { return 50 * c }

// DrainWindow is how recent a lane's last delivery must be for it to
// count as draining.
const DrainWindow = time.Second
