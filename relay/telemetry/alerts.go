package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
)

// Alert names.
const (
	AlertDeadLetters   = "dead_letters_rising"
	AlertOldestPending = "oldest_pending"
	AlertEndpointP95   = "endpoint_latency"
	AlertSlotLag       = "slot_lag"
	AlertDatabase      = "database_fault"
	// AlertMessagesOff fires for a day after an event written with
	// outbox.Emit was dead-lettered because outbox_messages is off: the
	// application's own events waiting for a replay, or a forgery.
	AlertMessagesOff = "messages_off"
	// AlertEndpointInvalid fires while a row of postbox.endpoints is
	// invalid (a value only postbox can judge): its events wait.
	AlertEndpointInvalid = "endpoint_invalid"
)

// LoadInvalidEndpoints names the endpoints of postbox.endpoints the
// streaming instance applied (postbox.endpoint_state) that are invalid
// under cfg: InvalidEndpoints for a command, which keeps no table.
func LoadInvalidEndpoints(ctx context.Context, q Querier, cfg *config.Config) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT row::text FROM postbox.endpoint_state WHERE jsonb_typeof(row) = 'object'`)
	if err != nil {
		return nil, fmt.Errorf("read endpoint_state: %w", err)
	}
	defer rows.Close()
	var tes []config.TableEndpoint
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return nil, fmt.Errorf("read endpoint_state: %w", err)
		}
		var row endpoints.Row
		if err := json.Unmarshal([]byte(text), &row); err != nil {
			return nil, fmt.Errorf("read endpoint_state: %w", err)
		}
		tes = append(tes, endpoints.Parse(row))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read endpoint_state: %w", err)
	}
	c := *cfg
	c.EndpointTable = config.NewEndpointTable()
	c.EndpointTable.Replace(tes)
	return InvalidEndpoints(&c), nil
}

// InvalidEndpoints names the endpoints of cfg's table (postbox.endpoints
// as the instance applied it) that are invalid, sorted.
func InvalidEndpoints(cfg *config.Config) []string {
	if names, ok := cfg.EndpointTable.Invalid(); ok {
		return names // as the instance keeps them, change by change
	}
	var out []string
	cfg.EndpointTable.Each(func(te config.TableEndpoint) {
		if _, ok := cfg.Endpoints[te.Name]; ok {
			return
		}
		if ep := cfg.ResolveTableEndpoint(te); ep.Invalid != "" {
			out = append(out, te.Name)
		}
	})
	slices.Sort(out)
	return out
}

// Alert is one alert's state. Subject is the endpoint for per-endpoint
// alerts.
type Alert struct {
	Name    string `json:"name"`
	Subject string `json:"subject,omitempty"`
	Firing  bool   `json:"firing"`
	Detail  string `json:"detail"`
}

// minSamples is how many samples an endpoint needs before its p95 counts.
const minSamples = 20

// Evaluate computes the alerts from a summary and the endpoints' stats.
// It returns every alert, firing or not; the per-endpoint latency alert
// only for endpoints with enough samples.
func Evaluate(s Summary, endpoints []EndpointStats, th config.Alerts) []Alert {
	out := []Alert{{Name: AlertDeadLetters, Firing: s.DeadLettersLastHour >= int64(th.DeadLettersPerHour),
		Detail: fmt.Sprintf("%d dead letters in the last hour (threshold %d); postbox dead-letters analyze", s.DeadLettersLastHour, th.DeadLettersPerHour)}}
	old := Alert{Name: AlertOldestPending, Detail: "nothing waiting"}
	if s.OldestPendingAgeSeconds != nil {
		age := time.Duration(*s.OldestPendingAgeSeconds * float64(time.Second))
		old.Firing = age > th.OldestPending
		old.Detail = fmt.Sprintf("oldest undelivered event waits for %s (threshold %s)", age.Round(time.Second), th.OldestPending)
	}
	out = append(out, old)
	lag := Alert{Name: AlertSlotLag}
	switch {
	case !s.Slot.Exists:
		lag.Detail = "no replication slot yet"
	case s.Slot.WALStatus != "" && s.Slot.WALStatus != "reserved":
		lag.Firing = true
		lag.Detail = fmt.Sprintf("slot %s wal_status is %s: it risks (or suffered) losing WAL it needs", s.Slot.Name, s.Slot.WALStatus)
	default:
		lag.Firing = s.Slot.RetainedBytes > th.SlotLag
		lag.Detail = fmt.Sprintf("slot %s retains %s of WAL (threshold %s)", s.Slot.Name, FormatBytes(s.Slot.RetainedBytes), FormatBytes(th.SlotLag))
	}
	out = append(out, lag)
	out = append(out, databaseAlert(s))
	msgs := Alert{Name: AlertMessagesOff, Firing: s.MessagesOffLastDay > 0, Detail: "no event written with outbox.Emit refused in the last 24 h"}
	if msgs.Firing {
		msgs.Detail = fmt.Sprintf("%d events written with outbox.Emit were dead-lettered unattempted in the last 24 h because outbox_messages is off: "+
			"if the application emits them, set outbox_messages: true, restrict pg_logical_emit_message (postbox doctor) and replay them; "+
			"if it does not, a role of the database is forging events", s.MessagesOffLastDay)
	}
	out = append(out, msgs)
	inv := Alert{Name: AlertEndpointInvalid, Firing: len(s.InvalidEndpoints) > 0, Detail: "every endpoint of postbox.endpoints is valid"}
	if inv.Firing {
		names := s.InvalidEndpoints
		more := ""
		if len(names) > 10 {
			names, more = names[:10], fmt.Sprintf(" and %d more", len(s.InvalidEndpoints)-10)
		}
		inv.Detail = fmt.Sprintf("%d endpoints of postbox.endpoints are invalid and their events wait (%s%s): postbox endpoints shows why; correct the rows",
			len(s.InvalidEndpoints), strings.Join(names, ", "), more)
	}
	out = append(out, inv)
	for _, e := range endpoints {
		if e.P95MS == nil || e.SampleCount < minSamples {
			continue
		}
		p95 := time.Duration(*e.P95MS * float64(time.Millisecond))
		out = append(out, Alert{Name: AlertEndpointP95, Subject: e.Endpoint, Firing: p95 > th.EndpointP95,
			Detail: fmt.Sprintf("p95 latency of %s over 24 h is %s (threshold %s, %d samples)", e.Endpoint, p95, th.EndpointP95, e.SampleCount)})
	}
	return out
}

// Firing returns the alerts that fire.
func Firing(alerts []Alert) []Alert {
	out := []Alert{}
	for _, a := range alerts {
		if a.Firing {
			out = append(out, a)
		}
	}
	return out
}

// FormatBytes prints a byte count in binary units, as the commands show WAL.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// Change is an alert whose firing state changed.
type Change struct {
	Alert Alert
	Since time.Time // when it was in its previous state from
}

// RecordAlerts stores the alerts' states and returns those that changed
// since the last call by any instance, so each change is logged once.
// Alerts not evaluated any more (an endpoint gone quiet) are cleared.
func RecordAlerts(ctx context.Context, pool *pgxpool.Pool, alerts []Alert) ([]Change, error) {
	var changes []Change
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT alert, subject, firing, since FROM postbox.alerts FOR UPDATE`)
		if err != nil {
			return err
		}
		type key struct{ name, subject string }
		type prev struct {
			firing bool
			since  time.Time
		}
		known := map[key]prev{}
		for rows.Next() {
			var k key
			var p prev
			if err := rows.Scan(&k.name, &k.subject, &p.firing, &p.since); err != nil {
				rows.Close()
				return err
			}
			known[k] = p
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		seen := map[key]bool{}
		for _, a := range alerts {
			k := key{a.Name, a.Subject}
			seen[k] = true
			p, ok := known[k]
			if ok && p.firing == a.Firing {
				continue
			}
			if ok || a.Firing {
				changes = append(changes, Change{Alert: a, Since: p.since})
			}
			if _, err := tx.Exec(ctx, `
				INSERT INTO postbox.alerts (alert, subject, firing, detail) VALUES ($1, $2, $3, $4)
				ON CONFLICT (alert, subject) DO UPDATE SET firing = excluded.firing, since = now(), detail = excluded.detail`,
				a.Name, a.Subject, a.Firing, a.Detail); err != nil {
				return err
			}
		}
		for k, p := range known {
			if !seen[k] && p.firing {
				a := Alert{Name: k.name, Subject: k.subject, Detail: "no longer evaluated"}
				changes = append(changes, Change{Alert: a, Since: p.since})
				if _, err := tx.Exec(ctx, `UPDATE postbox.alerts SET firing = false, since = now(), detail = $3 WHERE alert = $1 AND subject = $2`,
					k.name, k.subject, a.Detail); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record alerts: %w", err)
	}
	return changes, nil
}

// databaseAlert fires while the server refuses writes, has no connection
// slots to spare, or an instance reports a fault it runs into.
func databaseAlert(s Summary) Alert {
	a := Alert{Name: AlertDatabase, Detail: "the database accepts postbox's work"}
	db := s.Database
	switch {
	case db.ReadOnly:
		a.Firing, a.Detail = true, "the database is read-only (default_transaction_read_only, or a standby): postbox cannot record anything"
	case db.MaxConnections > 0 && db.MaxConnections-db.Connections <= ConnectionHeadroomDefault:
		a.Firing, a.Detail = true, fmt.Sprintf("the database server uses %d of its %d connections", db.Connections, db.MaxConnections)
	default:
		for _, in := range s.Instances {
			if in.Fault != "" {
				a.Firing, a.Detail = true, fmt.Sprintf("instance %s: %s", in.ID, in.Fault)
				break
			}
		}
	}
	return a
}

// ConnectionHeadroomDefault is how few free connection slots (beyond the
// superuser's reserve) raise the database alert.
const ConnectionHeadroomDefault = 3
