package console

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/internal/store"
)

// Queries are the console's reads of events, attempts and time series,
// and the pause and resume actions. The health summary, endpoint stats,
// dead letters and replay come straight from relay/telemetry and
// relay/ops; these go through this interface so the pages that need them
// can be built and tested before, and independently of, their queries.
type Queries interface {
	// DeliveriesPerMinute counts deliveries and failed attempts per minute
	// over the last since.
	DeliveriesPerMinute(ctx context.Context, q store.Querier, since time.Duration) ([]MinuteCount, error)
	// LatencySeries is an endpoint's p50/p95/p99 per five-minute bin over
	// the rolling 24 hours, from the histograms.
	LatencySeries(ctx context.Context, q store.Querier, endpoint string) ([]LatencyPoint, error)
	// RecentAttempts are an endpoint's last attempts, newest first.
	RecentAttempts(ctx context.Context, q store.Querier, endpoint string, limit int) ([]AttemptRow, error)
	// SearchEvents finds events, newest first.
	SearchEvents(ctx context.Context, q store.Querier, f EventFilter) ([]EventSummary, error)
	// CheckSearchKeys refuses payload keys that are not search_keys.
	CheckSearchKeys(cfgKeys []string, payload map[string]string) error
	// LoadEvent is an event's story, one per endpoint; ErrEventNotFound
	// when there is none.
	LoadEvent(ctx context.Context, q store.Querier, eventID string) ([]EventStory, error)
	// Pause holds an endpoint's deliveries back until until; Resume lifts it.
	Pause(ctx context.Context, pool *pgxpool.Pool, endpoint string, until time.Time) error
	Resume(ctx context.Context, pool *pgxpool.Pool, endpoint string) error
}

// ErrEventNotFound is LoadEvent's answer for an unknown event id.
var ErrEventNotFound = errors.New("event not found")

// MinuteCount is one minute's deliveries and failed attempts.
type MinuteCount struct {
	Minute    time.Time
	Delivered int
	Failed    int
}

// LatencyPoint is one five-minute bin's percentiles.
type LatencyPoint struct {
	Bin                 time.Time
	P50MS, P95MS, P99MS float64
	Count               int64
}

// AttemptRecord is one HTTP attempt.
type AttemptRecord struct {
	Attempt    int
	StartedAt  time.Time
	StatusCode *int
	DurationMS float64
	Error      string
	ErrorClass string
	Response   string
	Target     string
	Instance   string
}

// AttemptRow is an attempt with its event and delivery.
type AttemptRow struct {
	AttemptRecord
	EventID    string
	Endpoint   string
	DeliveryID int64
}

// EventFilter selects events to list. Zero fields do not filter.
type EventFilter struct {
	Endpoint, Status string
	Since, Until     time.Time
	Payload          map[string]string
	Limit            int
}

// EventSummary is one event in a search's results.
type EventSummary struct {
	EventID, Endpoint, EventType, Status string
	Attempts                             int
	CommittedAt                          *time.Time
}

// EventStory is an event's history at one endpoint.
type EventStory struct {
	EventID, Endpoint, EventType, CommitLSN string
	CommittedAt                             *time.Time
	CreatedAt, IngestedAt                   time.Time
	Deliveries                              []DeliveryStory
}

// DeliveryStory is one delivery of an event and its attempts.
type DeliveryStory struct {
	ID                   int64
	Status               string
	ReplayOf             *int64
	CreatedAt, UpdatedAt time.Time
	DeliveredAt          *time.Time
	LastError            string
	Attempts             []AttemptRecord
}
