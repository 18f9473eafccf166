// Package telemetry answers the operator's questions from postbox's own
// tables: the health summary (the seed's query, plus slot lag and
// commit-to-delivery latency), per-endpoint latency percentiles over the
// rolling 24 hours, dead letters and their analysis, the alerts, event
// search and each event's story, and the console's series. It also holds
// the Prometheus metrics.
//
// Every query reads through partial or time indexes, never a scan of the
// delivered rows, so the answers stay fast with millions of them.
package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Slot is the replication slot as the summary reports it.
type Slot struct {
	Name          string `json:"name"`
	Exists        bool   `json:"exists"`
	Active        bool   `json:"active"`
	WALStatus     string `json:"wal_status"`
	RetainedBytes int64  `json:"lag_bytes"` // WAL the slot retains
	Confirmed     string `json:"confirmed_flush_lsn"`
}

// Breaker is an endpoint held back by its breaker or a pause.
type Breaker struct {
	Endpoint            string                   `json:"endpoint"`
	State               postboxtype.BreakerState `json:"state"`
	ConsecutiveFailures int                      `json:"consecutive_failures"`
	OpenedAt            *time.Time               `json:"opened_at,omitempty"`
	ReopensAt           *time.Time               `json:"reopens_at,omitempty"`
	PausedUntil         *time.Time               `json:"paused_until,omitempty"`
	LastError           string                   `json:"last_error,omitempty"`
}

// Instance is a registered postbox.
type Instance struct {
	ID          string    `json:"id"`
	Hostname    string    `json:"hostname"`
	PID         int       `json:"pid"`
	Version     string    `json:"version"`
	Streaming   bool      `json:"streaming"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// Fault is the database fault the instance runs into, if any.
	Fault      string     `json:"fault,omitempty"`
	FaultSince *time.Time `json:"fault_since,omitempty"`
}

// Database is the server's state as far as postbox's work goes.
type Database struct {
	// ReadOnly: new transactions are read-only (the setting, or a standby).
	ReadOnly bool `json:"read_only"`
	// Connections in use and the most the server takes from ordinary
	// roles (max_connections less the superusers' reserve).
	Connections    int `json:"connections"`
	MaxConnections int `json:"max_connections"`
}

// Summary is the health of the whole pipeline. Field names follow the
// seed's columns.
type Summary struct {
	Pending             int64 `json:"pending"`
	AwaitingRetry       int64 `json:"awaiting_retry"`
	InFlight            int64 `json:"in_flight"`
	DeadLetter          int64 `json:"dead_letter"`
	DeliveredLastHour   int64 `json:"delivered_last_hour"`
	FailedLastHour      int64 `json:"failed_last_hour"`
	DeadLettersLastHour int64 `json:"dead_letters_last_hour"`
	MessagesOffLastDay  int64 `json:"messages_off_last_day"` // Emit's events refused by outbox_messages: off, not replayed
	// InvalidEndpoints are the rows of postbox.endpoints the instance
	// applied as invalid (InvalidEndpoints): their events wait.
	InvalidEndpoints        []string   `json:"invalid_endpoints,omitempty"`
	OldestPending           *time.Time `json:"oldest_pending"`
	OldestPendingAgeSeconds *float64   `json:"oldest_pending_age_seconds"`
	AvgDeliveryMSLastHour   *float64   `json:"avg_delivery_ms_last_hour"`
	CommitToDeliveryP50MS   *float64   `json:"commit_to_delivery_p50_ms"`
	CommitToDeliveryP99MS   *float64   `json:"commit_to_delivery_p99_ms"`
	Slot                    Slot       `json:"slot"`
	Breakers                []Breaker  `json:"breakers"`
	Instances               []Instance `json:"instances"`
	Database                Database   `json:"database"`
	Alerts                  []Alert    `json:"alerts"`
	At                      time.Time  `json:"at"`
}

// summarySQL is the seed's monitoring query but for the last hour's
// deliveries (deliveryHourSQL), each figure from its own index: pending,
// retries and in-flight rows from their partial indexes, the last hour's
// failures and dead letters by time. The oldest pending delivery is the
// oldest undelivered one, in flight included.
const summarySQL = `
WITH under_way AS ( -- read once: its events by primary key, range by range
  SELECT count(*) AS n, min(ingested_at) AS oldest FROM postbox.events_under_way
)
SELECT
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'pending'),
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'failed'),
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'in_flight' AND lease_owner IS NOT NULL) + (SELECT n FROM under_way),
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter'),
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'failed' AND updated_at >= now() - interval '1 hour'),
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter' AND updated_at >= now() - interval '1 hour'),
  -- Deliveries in flight are undelivered too: an instance alone keeps a
  -- backlog in flight (see dispatch.Dispatcher.ReserveKeep). They are read
  -- apart, from their own partial index: few but during such a catch-up.
  -- So are events under way (their deliveries not written yet).
  least((SELECT min(created_at) FROM postbox.deliveries WHERE status IN ('pending', 'failed')),
        (SELECT min(created_at) FROM postbox.deliveries WHERE status = 'in_flight' AND lease_owner IS NOT NULL),
        (SELECT oldest FROM under_way)),
  (SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter' AND updated_at >= now() - interval '1 day'
     AND last_error LIKE 'messages_off%'),
  now()`

// deliveryHourSQL is the last hour's deliveries: how many, their average
// response time and commit-to-delivery percentiles, from delivered_at's
// partial index. It reads every row delivered in the hour (720,000 at 200 a second, some hundreds of
// milliseconds), so the relays' own 15-second gauges and alerts, which do
// not need it, leave it out; `postbox status` and /status include it.
const deliveryHourSQL = `
SELECT count(*),
       avg(last_response_ms)::float8,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY commit_to_delivery_ms),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY commit_to_delivery_ms)
FROM postbox.deliveries WHERE status = 'delivered' AND delivered_at >= now() - interval '1 hour'`

// LoadSummary reads the health summary (without alerts; see Evaluate).
func LoadSummary(ctx context.Context, q Querier, slotName string) (Summary, error) {
	return loadSummary(ctx, q, slotName, true)
}

// LoadQueueSummary is LoadSummary without the last hour's delivery
// statistics (DeliveredLastHour, AvgDeliveryMSLastHour and the
// commit-to-delivery percentiles stay empty): everything the gauges and
// alerts need, at the cost of a few index lookups.
func LoadQueueSummary(ctx context.Context, q Querier, slotName string) (Summary, error) {
	return loadSummary(ctx, q, slotName, false)
}

func loadSummary(ctx context.Context, q Querier, slotName string, deliveryHour bool) (Summary, error) {
	s := Summary{Breakers: []Breaker{}, Alerts: []Alert{}}
	var failedRetry, failedDead int64
	err := q.QueryRow(ctx, summarySQL).Scan(&s.Pending, &s.AwaitingRetry, &s.InFlight, &s.DeadLetter,
		&failedRetry, &failedDead, &s.OldestPending, &s.MessagesOffLastDay, &s.At)
	if err != nil {
		return s, fmt.Errorf("health summary: %w", err)
	}
	if deliveryHour {
		err := q.QueryRow(ctx, deliveryHourSQL).Scan(&s.DeliveredLastHour,
			&s.AvgDeliveryMSLastHour, &s.CommitToDeliveryP50MS, &s.CommitToDeliveryP99MS)
		if err != nil {
			return s, fmt.Errorf("health summary: %w", err)
		}
	}
	s.FailedLastHour, s.DeadLettersLastHour = failedRetry+failedDead, failedDead
	roundMS(s.AvgDeliveryMSLastHour, s.CommitToDeliveryP50MS, s.CommitToDeliveryP99MS)
	if s.OldestPending != nil {
		age := s.At.Sub(*s.OldestPending).Seconds()
		s.OldestPendingAgeSeconds = &age
	}
	st, err := wal.Slot(ctx, q, slotName)
	if err != nil {
		return s, err
	}
	s.Slot = Slot{Name: slotName, Exists: st.Exists, Active: st.Active, WALStatus: st.WALStatus,
		RetainedBytes: st.RetainedBytes}
	if st.Exists {
		s.Slot.Confirmed = st.ConfirmedFlush.String()
	}
	rows, err := q.Query(ctx, `
		SELECT endpoint, state, consecutive_failures, opened_at,
		       opened_at + cooldown_seconds * interval '1 second', paused_until, coalesce(last_error, '')
		FROM postbox.endpoint_health
		WHERE state <> 'closed' OR paused_until > now() ORDER BY endpoint`)
	if err != nil {
		return s, fmt.Errorf("breakers: %w", err)
	}
	for rows.Next() {
		var b Breaker
		var paused *time.Time
		if err := rows.Scan(&b.Endpoint, &b.State, &b.ConsecutiveFailures, &b.OpenedAt, &b.ReopensAt, &paused, &b.LastError); err != nil {
			rows.Close()
			return s, fmt.Errorf("breakers: %w", err)
		}
		if paused != nil && paused.After(s.At) {
			b.PausedUntil = paused
		}
		if b.State == postboxtype.BreakerClosed {
			b.OpenedAt, b.ReopensAt = nil, nil
		}
		s.Breakers = append(s.Breakers, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("breakers: %w", err)
	}
	err = q.QueryRow(ctx, `
		SELECT current_setting('default_transaction_read_only')::bool OR pg_is_in_recovery(),
		       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
		       current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int`).
		Scan(&s.Database.ReadOnly, &s.Database.Connections, &s.Database.MaxConnections)
	if err != nil {
		return s, fmt.Errorf("database state: %w", err)
	}
	rows, err = q.Query(ctx, `
		SELECT id, hostname, pid, version, streaming, started_at, heartbeat_at, coalesce(fault, ''), fault_since
		FROM postbox.instances WHERE expires_at > now() ORDER BY started_at`)
	if err != nil {
		return s, fmt.Errorf("instances: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var in Instance
		if err := rows.Scan(&in.ID, &in.Hostname, &in.PID, &in.Version, &in.Streaming, &in.StartedAt, &in.HeartbeatAt, &in.Fault, &in.FaultSince); err != nil {
			return s, fmt.Errorf("instances: %w", err)
		}
		s.Instances = append(s.Instances, in)
	}
	return s, rows.Err()
}
