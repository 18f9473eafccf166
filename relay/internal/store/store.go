// Package store is postbox's own schema: embedded migrations, the ingest of
// outbox events with the replication checkpoint, the delivery queue (claims
// with FOR UPDATE SKIP LOCKED and a lease, results, lease expiry), and the
// reconciliation of outbox rows that the stream did not bring.
//
// Each file holds one concern and its SQL. The ingest: events.go (its
// writes), ingest_copy.go (the COPY path), checkpoint.go (commit and
// checkpoint), leadership.go (fencing), outbox.go (reconciliation reads,
// purge). The queue: queue.go (claims), record.go (results), health.go,
// histogram.go, park.go, underway.go (events under way), release.go
// (returned claims), replay.go. Instances: instances.go (registry,
// liveness). Upkeep: retention.go, migrate.go. The server: preflight.go,
// privileges.go, emitgrants.go, transient.go (error classes).
package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
)

// WakeChannel is the NOTIFY channel that tells instances the queue has
// new work (pending rows written without the fast path, replays).
const WakeChannel = "postbox_queue"

// WakeHealth is the payload of a wake that also says an endpoint's pause
// changed: instances read the endpoints held back again at once.
const WakeHealth = "health"

// wakeRetryPrefix starts the payload of a wake that says a retry was
// scheduled (or a claim released) by one instance: "retry <ms> <owner>",
// the milliseconds until the earliest of them falls due. The others time
// a claim for then (see WakeRetry) instead of claiming at once.
const wakeRetryPrefix = "retry "

// WakeRetryPayload is the payload that tells the other instances that
// owner scheduled a retry falling due in d.
func WakeRetryPayload(owner string, d time.Duration) string {
	return wakeRetryPrefix + strconv.FormatInt(max(d, 0).Milliseconds(), 10) + " " + owner
}

// WakeRetry parses a wake's payload made by WakeRetryPayload: when the
// retry falls due from now, and who scheduled it. ok is false for any
// other payload.
func WakeRetry(payload string) (in time.Duration, owner string, ok bool) {
	rest, found := strings.CutPrefix(payload, wakeRetryPrefix)
	if !found {
		return 0, "", false
	}
	ms, owner, found := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !found || err != nil {
		return 0, "", false
	}
	return time.Duration(n) * time.Millisecond, owner, true
}

// Store is postbox's schema on one database.
type Store struct {
	Pool  *pgxpool.Pool
	Table outbox.Table
	Slot  string
	// Role is the connected role, for the GRANT a refused statement's
	// error names (empty: a placeholder).
	Role string
}

// Open connects a pool for dbURL with the session settings postbox relies
// on (see Configure).
func Open(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	Configure(cfg)
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.HealthCheckPeriod = 15 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// Configure sets the session settings postbox relies on (UTC, ISO dates,
// so timestamps read as text are unambiguous; custom plans; no JIT) on a
// pool's configuration.
func Configure(cfg *pgxpool.Config) {
	SessionParams(cfg.ConnConfig.RuntimeParams)
	cfg.ConnConfig.RuntimeParams["application_name"] = "postbox"
	// postbox's tables grow from empty to millions of rows within minutes
	// of a catch-up, faster than autovacuum re-analyses them: a generic
	// plan cached while a table was tiny (a sequential scan inside a
	// nested loop) would turn a 1 ms statement into seconds. Plan each
	// execution for the table as it is. (A statement without parameters
	// keeps one plan all the same; those that run every second are made so
	// on purpose, see aliveSQL.)
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	// The same stale statistics can put a claim's estimate past
	// jit_above_cost, and compiling it then costs 40 ms of a 5 ms query, on
	// every claim. postbox's statements are short; JIT never pays for them.
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	// A session of postbox's left in an open transaction (its process
	// frozen, a paused VM) holds back vacuum on the whole cluster, and
	// holds the locks it took: an endpoint's health row, locked by a
	// recording, stalls every instance's recording for that endpoint.
	// postbox never waits on itself inside a transaction for more than
	// moments, so unless the server, database or role already bounds that,
	// its sessions are ended after IdleInTransactionTimeout: the
	// transaction rolls back, and postbox, when it runs again, takes a new
	// connection and goes on (nothing it acknowledged was in it).
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, c); err != nil {
				return err
			}
		}
		_, err := c.Exec(ctx, boundIdleInTransactionSQL)
		return err
	}
}

// IdleInTransactionTimeout is the idle_in_transaction_session_timeout
// postbox's sessions get where none is set: far longer than postbox
// leaves a transaction open between statements (a large transaction's
// next rows from the stream, at most), as wal_sender_timeout is for the
// replication connection.
const IdleInTransactionTimeout = time.Minute

var boundIdleInTransactionSQL = fmt.Sprintf(`SELECT set_config('idle_in_transaction_session_timeout', '%dms', false)
WHERE current_setting('idle_in_transaction_session_timeout') = '0'`, IdleInTransactionTimeout.Milliseconds())

// SessionParams sets the run-time parameters postbox needs on every
// connection, the replication connection included.
func SessionParams(p map[string]string) {
	p["TimeZone"] = "UTC"
	p["DateStyle"] = "ISO, MDY"
	p["IntervalStyle"] = "postgres"
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
