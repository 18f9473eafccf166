package state

import "time"

// Event is what an outbox row says of an event, as an attempt sends it:
// the part the row decoded from the WAL, the delivery the ingest writes,
// the job the dispatcher runs and the request Resolve builds all share,
// carried as one value rather than copied field by field.
type Event struct {
	EventID   string
	Endpoint  string
	URL       string // the row's own URL; "" (NULL) for the endpoint's
	EventType string
	Payload   []byte    // JSON text; nil when it was too large to read
	Headers   []byte    // JSON text; nil is NULL
	CreatedAt time.Time // zero when NULL (the ingest time is stored)
	// Message: written with outbox.Emit (a logical decoding message), not
	// a table row. Whether it may be delivered is the configuration's
	// (outbox_messages), checked at each attempt: any role that may run
	// pg_logical_emit_message can write one.
	Message bool
	// CommitLSN is the event's commit in the WAL, on an event read back
	// from postbox.events (a claim): no instance attempts it before it
	// has applied every endpoint change committed before it. 0 when
	// unknown (found by reconciliation), or on a first attempt from this
	// instance's own stream, resolved under every change decoded before.
	CommitLSN uint64
}
