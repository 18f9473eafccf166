package dispatch

import (
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Job is one delivery attempt to make.
type Job struct {
	// Event is what the attempt sends. Message events are delivered only
	// while outbox_messages is on (execute.Resolve).
	state.Event
	// DeliveryID is the delivery's id; 0 for a job submitted before its
	// ingest inserted the delivery, which learns it from Assign (see ID).
	DeliveryID int64
	// Lane is the job's lane when it is not its endpoint's own: the
	// endpoint and its row URL's host (config.Config.Lane). Lanes, not
	// endpoints, hold in-flight caps, breakers, pauses and rate limits.
	Lane        string
	Attempt     int       // the number of this attempt, from 1
	CommittedAt time.Time // zero when unknown
	// Received is when the stream had the row, for a first attempt started
	// from the stream (zero for the others).
	Received time.Time
	// Ingest, when not nil, is the transaction that writes this delivery;
	// its result can be recorded only once that has committed.
	Ingest Ingest
	// Resolved, on a first attempt from the ingest, is the request the
	// ingest resolved for it, so the attempt does not resolve it again.
	Resolved Resolved
	// Probe marks the one attempt that tests a half-open circuit breaker.
	Probe bool
	// EventPK and Range name an event under way (DeliveryID 0), whose
	// delivery the recorder writes once (the store's recordUnderWay).
	EventPK, Range int64

	assigned atomic.Int64 // the id Assign gave a job submitted before its insert
	// The event and range AssignUnderWay gave a job submitted before its
	// insert, whose event was written under way.
	assignedEvent, assignedRange atomic.Int64
	// result is the attempt's outcome once it has finished (set before
	// Recorder.Record, for a job with an Ingest); written, that its ingest wrote
	// it with the delivery (TakeDelivered).
	result  atomic.Pointer[state.Result]
	written atomic.Bool
}

// Resolved is a first attempt's request as the ingest resolved it (an
// *execute.Resolved): dispatch only carries it to the executor, which
// sits above it and sends it while its configuration is still in force.
type Resolved interface{ ResolvedRequest() }

// TakeDelivered returns the outcome of a first attempt that has already
// delivered, for the ingest that has not yet inserted its delivery to
// write it delivered at once, with its attempt, rather than in flight for
// the recorder to update: one row version and its index entries instead
// of two. The job is marked written (Written); its outcome still goes to
// the recorder for the endpoint's health and statistics. It reports false
// for a job not finished, not delivered, or taken already.
func (j *Job) TakeDelivered() (state.Result, bool) {
	r := j.result.Load()
	if r == nil || r.Status != postboxtype.DeliveryDelivered || !r.Attempted || !r.Sampled || j.Ingest == nil || j.Ingest.Finished() {
		return state.Result{}, false
	}
	if !j.written.CompareAndSwap(false, true) {
		return state.Result{}, false
	}
	return *r, true
}

// Written reports whether the job's ingest wrote its outcome with the
// delivery (TakeDelivered). Once the job's Ingest has finished it is
// final.
func (j *Job) Written() bool { return j.written.Load() }

// ID is the job's delivery id: DeliveryID, or for a job submitted before
// its ingest inserted it, the id Assign gave it (0 until then, and for
// good when its event had been ingested already). Once its Ingest has
// finished the id is final.
func (j *Job) ID() int64 {
	if j.DeliveryID != 0 {
		return j.DeliveryID
	}
	return j.assigned.Load()
}

// UnderWay is the event and range of a job whose event is under way
// (its delivery not written yet): EventPK and Range, or for a job
// submitted before its ingest, those AssignUnderWay gave it. Range is 0
// for any other job. Once its Ingest has finished they are final.
func (j *Job) UnderWay() (eventPK, rangeID int64) {
	if j.Range != 0 {
		return j.EventPK, j.Range
	}
	return j.assignedEvent.Load(), j.assignedRange.Load()
}

// Key is the job's lane key: its Lane, or its endpoint's.
func (j *Job) Key() string {
	return state.LaneKey(j.Endpoint, j.Lane)
}

// Outcome is a finished (or released) job and its result.
type Outcome struct {
	Job    *Job
	Result state.Result
}

// Released is the result that returns a job's delivery to the queue
// without counting an attempt.
func Released(j *Job) state.Result {
	return state.Result{DeliveryID: j.DeliveryID, Endpoint: j.Endpoint, Lane: j.Lane, Status: state.Released,
		At: time.Now(), CommitToDeliveryMS: -1}
}
