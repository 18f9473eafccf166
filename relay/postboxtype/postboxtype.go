// Package postboxtype holds the words postbox's packages and operators'
// code share: a delivery's state, a circuit breaker's state, a replay's
// filter and what it selects. Like River's rivertype, it imports nothing
// of postbox, so the store, the dispatcher, the public packages and an
// application's own tooling can all use these words without importing one
// another. The values and JSON names are those the database stores and the
// CLI prints.
package postboxtype

import "time"

// DeliveryState is a delivery's state, as postbox.deliveries.status stores
// it and the CLI prints it.
type DeliveryState string

// Delivery states.
const (
	DeliveryPending    DeliveryState = "pending"
	DeliveryInFlight   DeliveryState = "in_flight"
	DeliveryDelivered  DeliveryState = "delivered"
	DeliveryFailed     DeliveryState = "failed"
	DeliveryDeadLetter DeliveryState = "dead_letter"
	// DeliveryReplayed is a dead letter a replay has superseded with a new
	// delivery (whose replay_of points at it).
	DeliveryReplayed DeliveryState = "replayed"
)

func (d DeliveryState) String() string { return string(d) }

// Queued reports whether a delivery in state d is still to be attempted
// (waiting, in flight, or waiting to retry).
func (d DeliveryState) Queued() bool {
	return d == DeliveryPending || d == DeliveryInFlight || d == DeliveryFailed
}

// BreakerState is an endpoint's circuit breaker state, as
// postbox.endpoint_health.state stores it and the CLI prints it.
type BreakerState string

// Breaker states.
const (
	BreakerClosed   BreakerState = "closed"
	BreakerOpen     BreakerState = "open"
	BreakerHalfOpen BreakerState = "half_open"
)

func (b BreakerState) String() string { return string(b) }

// PauseIndefinite is the paused_until of a pause without an end (a pause
// with a zero until): it lasts until it is resumed. A date rather than
// 'infinity', which time.Time cannot hold.
var PauseIndefinite = time.Date(9999, time.January, 1, 0, 0, 0, 0, time.UTC)

// ReplayFilter selects the events a replay enqueues again, and where
// their deliveries go. Zero fields do not filter.
type ReplayFilter struct {
	// DeadLetters selects only events whose latest delivery is a dead letter.
	DeadLetters bool
	Endpoint    string
	// Since and Until bound the events' commit time (their ingest time
	// when the commit time is unknown).
	Since, Until time.Time
	// FromLSN selects events committed at or after this WAL position (a
	// pglogrepl.LSN; a plain integer keeps this package a leaf).
	FromLSN  uint64
	EventIDs []string
	// Limit caps how many events one replay enqueues (0: no cap).
	Limit int
	// NoMessages leaves out events written with outbox.Emit (outbox_messages
	// is off): selected, marked MessagesOff, not enqueued.
	NoMessages bool

	// URL and EndpointURL say where the replayed deliveries go, when not
	// where each event's row said (they select nothing). URL, a url or a
	// template with the macros of endpoint urls, replaces the rows' urls:
	// each attempt checks it as it checks a row's url (allow_row_url,
	// row_url_hosts, the SSRF guard). EndpointURL leaves the rows' urls
	// out: the endpoint's url, as it is at each attempt, is used. The
	// events keep their rows' urls; each delivery keeps its retarget.
	URL         string
	EndpointURL bool
}

// ReplayItem is an event a replay selects.
type ReplayItem struct {
	EventID    string        `json:"event_id"`
	Endpoint   string        `json:"endpoint"`
	EventType  string        `json:"event_type"`
	CommitLSN  string        `json:"commit_lsn,omitempty"`
	Committed  time.Time     `json:"committed_at"`
	LastStatus DeliveryState `json:"last_status"` // of its latest delivery; "" when it has none
	Queued     bool          `json:"already_queued"`
	// MessagesOff: written with outbox.Emit and left out (NoMessages).
	MessagesOff bool `json:"messages_off,omitempty"`
}
