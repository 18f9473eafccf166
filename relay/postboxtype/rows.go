package postboxtype

import "time"

// The rows below are events, deliveries and attempts as postbox's CLI and
// console show them, and as their JSON prints them: the field names are
// the JSON's, and changing one changes what operators' scripts read.

// EventSummary is one event a search finds (telemetry.SearchEvents,
// postbox events).
type EventSummary struct {
	EventID   string `json:"event_id"`
	Endpoint  string `json:"endpoint"`
	EventType string `json:"event_type"`
	// Status is its latest delivery's state.
	Status string `json:"status"`
	// Attempts counts the attempts of all its deliveries (a replay's too).
	Attempts    int        `json:"attempts"`
	CommittedAt *time.Time `json:"committed_at"`
}

// EventStory is everything postbox knows of one event for one endpoint:
// its commit, its ingest, and every delivery (a replay adds one) with every
// attempt (postbox event EVENT_ID --json).
type EventStory struct {
	EventID   string `json:"event_id"`
	Endpoint  string `json:"endpoint"`
	EventType string `json:"event_type"`
	// Matched is why a row that named no endpoint was routed to this one
	// (the subscription's pattern, "+ filter" when its filter held; "" for
	// a row no endpoint was subscribed to: endpoint "", no_subscriber);
	// nil for a row that named its endpoint.
	Matched     *string         `json:"matched,omitempty"`
	CommitLSN   string          `json:"commit_lsn"` // "" when found by reconciliation
	CommittedAt *time.Time      `json:"committed_at"`
	CreatedAt   time.Time       `json:"created_at"`
	IngestedAt  time.Time       `json:"ingested_at"`
	Deliveries  []DeliveryStory `json:"deliveries"`
	// UnderWayAt is the instance whose memory holds the event in flight
	// while its delivery is not written yet (an event under way: its
	// first attempt's outcome writes it).
	UnderWayAt string `json:"under_way_at,omitempty"`
}

// RetargetEndpointURL is DeliveryStory.Retarget for a delivery a replay
// sent to its endpoint's url, leaving its row's out.
const RetargetEndpointURL = "endpoint_url"

// DeliveryStory is one delivery of an event and its attempts.
type DeliveryStory struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
	// ReplayOf is the delivery this one replays.
	ReplayOf *int64 `json:"replay_of,omitempty"`
	// Retarget is where a replay sent this delivery instead of its row's
	// url: RetargetEndpointURL, or the url given as scheme://host/path
	// (its query left out, as in logs); "" when it goes where its event
	// says.
	Retarget    string          `json:"retarget,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	DeliveredAt *time.Time      `json:"delivered_at"`
	LastError   string          `json:"last_error"`
	Attempts    []AttemptRecord `json:"attempts"`
}

// AttemptRecord is one HTTP attempt, as postbox.attempts keeps it.
type AttemptRecord struct {
	// Attempt is the delivery's attempt number, from 1 (0: unknown, for
	// samples carried over from before attempts were kept).
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	StatusCode *int      `json:"status_code"` // nil when no response came
	DurationMS float64   `json:"duration_ms"`
	Error      string    `json:"error"`
	ErrorClass string    `json:"error_class"`
	// Response is the start of the response body, redacted.
	Response string `json:"response"`
	// ResponseHidden: the CLI left Response out because log_payloads is
	// off (a partner's body may echo the payload).
	ResponseHidden bool `json:"response_hidden,omitempty"`
	// Target is where it went: scheme://host/path, never the query.
	Target   string `json:"target"`
	Instance string `json:"instance"`
	// Sent is the request's target exactly as sent: the query included,
	// redact_path not applied (Target when they are the same). The
	// partner's data, like the payload: the CLI and the console show it
	// only with log_payloads, redact_path applied
	// (telemetry.SentForOperator), and leave it empty otherwise.
	Sent string `json:"sent,omitempty"`
}

// AttemptRow is an attempt with the delivery and event it was made for.
type AttemptRow struct {
	AttemptRecord
	// EventID is "" for samples carried over from before attempts were
	// kept, and for attempts whose delivery has been purged.
	EventID    string `json:"event_id"`
	Endpoint   string `json:"endpoint"`
	DeliveryID int64  `json:"delivery_id"` // 0 when unknown
}

// DeadLetter is one dead-lettered delivery.
type DeadLetter struct {
	DeliveryID     int64     `json:"delivery_id"`
	EventID        string    `json:"event_id"`
	Endpoint       string    `json:"endpoint"`
	EventType      string    `json:"event_type"`
	AttemptCount   int       `json:"attempt_count"`
	LastError      string    `json:"last_error"`
	LastStatusCode *int      `json:"last_status_code"`
	CreatedAt      time.Time `json:"created_at"`
	DeadAt         time.Time `json:"dead_at"`
	CommitLSN      string    `json:"commit_lsn,omitempty"`
}
