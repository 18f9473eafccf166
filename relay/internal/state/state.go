// Package state holds the words the dispatcher, the store and the services
// share but nobody outside the relay sees: what an attempt says about its
// endpoint's health, and the result of an attempt. The delivery and breaker
// states themselves are public words, in postboxtype; state imports nothing
// else of postbox, so any package can use it without importing another.
package state

import (
	"strconv"
	"time"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Released is not stored: a result with it returns a claimed delivery to
// the queue without counting an attempt. Only the dispatcher and the
// recorder see it, so it stays out of the public words.
const Released postboxtype.DeliveryState = "released"

// Signal is what an attempt says about its endpoint's health.
type Signal int

const (
	// SignalNone: nothing (no request, or an answer that is about the
	// event, such as 400, not about the endpoint).
	SignalNone Signal = iota
	// SignalSuccess: the endpoint answered as it should.
	SignalSuccess
	// SignalFailure: the endpoint is failing (5xx, timeout, connection
	// error, a body that fails the success rule).
	SignalFailure
)

func (s Signal) String() string {
	switch s {
	case SignalNone:
		return "none"
	case SignalSuccess:
		return "success"
	case SignalFailure:
		return "failure"
	}
	return "signal(" + strconv.Itoa(int(s)) + ")"
}

// Result is the outcome of one claimed delivery.
type Result struct {
	DeliveryID int64
	// EventPK and Range name an event under way (DeliveryID 0): its
	// delivery is written with this outcome (the store's recordUnderWay). The
	// recorder sets them from the job (dispatch.Job.UnderWay).
	EventPK, Range int64
	Endpoint       string
	// Lane is the delivery's lane when it is not its endpoint's own (see
	// dispatch.Job): its breaker and pause are the lane's.
	Lane string
	// Status is delivered, failed (retry after Delay), dead_letter, or
	// Released (back to the queue after Delay, no attempt counted).
	Status postboxtype.DeliveryState
	Delay  time.Duration
	// Keep says this instance keeps a failed delivery's retry: the row
	// stays failed and owned by it, out of the claim's sight, and it
	// attempts the retry when due without claiming it (see the store's
	// RecordResults and dispatch.Dispatcher.ReserveRetry).
	Keep bool
	// WrittenAs is the delivery an event under way's outcome was written
	// as (set by the store's RecordResults; 0 when it was not).
	WrittenAs int64
	// Attempted counts toward max_attempts and sets last_error and the
	// other last_* columns.
	Attempted bool
	// Sampled is true when a request was sent: it records an attempt, the
	// source of the latency percentiles.
	Sampled bool
	// Attempt is the delivery's attempt number, from 1.
	Attempt int
	// Target is where the request went, as scheme://host/path.
	Target string
	// Sent is the URL as requested, query included and redact_path not
	// applied, when it is not Target: the partner's data, stored, never
	// logged.
	Sent string
	// EndpointRevision is the revision of the endpoint's row of
	// postbox.endpoints the attempt was made under (0: an endpoint of the
	// file or the defaults).
	EndpointRevision int64
	// ErrorClass groups a failed attempt: http_4xx, http_5xx, body_rule,
	// timeout, connection, blocked_target ("" on success).
	ErrorClass string
	// Signal feeds the endpoint's circuit breaker.
	Signal Signal
	// Pause asks that the endpoint get no attempts for this long (a 429).
	Pause              time.Duration
	LastError          string
	StatusCode         int // 0 when there was no response
	ResponseMS         float64
	Response           string // the start of the response body, redacted
	At                 time.Time
	CommitToDeliveryMS float64 // -1 when unknown
	// Written says the ingest wrote this outcome with the delivery (a
	// first attempt that delivered before its insert): the recorder
	// counts it for health and statistics but writes neither the delivery
	// nor the attempt again.
	Written bool
	// StreamToAttempt is postbox's own share of a first attempt started
	// from the stream: from the stream's receipt of the row to the
	// request's hand-over to the HTTP client (0 for other attempts).
	StreamToAttempt time.Duration
}

// LaneKey is the key a delivery is queued and protected under: its lane
// (an endpoint and a row URL's host, config.Config.Lane) when it has one,
// else its endpoint.
func LaneKey(endpoint, lane string) string {
	if lane != "" {
		return lane
	}
	return endpoint
}

// Key is the lane whose health r feeds: its Lane, or its endpoint's.
func (r *Result) Key() string {
	return LaneKey(r.Endpoint, r.Lane)
}
