// The instance registry: heartbeats, who is alive (aliveSQL), peers, and
// the owners that are gone.

package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/internal/proc"
)

// Instance describes a running postbox for the registry.
type Instance struct {
	ID        string
	Hostname  string
	PID       int
	Version   string
	Streaming bool
	// Fault is the database fault the instance runs into ("" when none),
	// since FaultSince.
	Fault      string
	FaultSince time.Time
	// Process is the instance's process (proc.Self): its boot id, pid
	// namespace and start time are registered with it, so that another
	// instance on its host can prove it gone (see Store.Neighbours).
	Process proc.Process
}

// LifeGraceDefault is how long an instance registered with a connection
// for life (see Heartbeat) still counts as alive after that connection
// ended, unless it heartbeats again meanwhile: long enough for an instance
// whose connection was cut (a backend ended by an operator, a network
// blip) to connect again, short enough that a crashed one's deliveries
// return within seconds.
const LifeGraceDefault = 3 * time.Second

// lifeLockSQL takes the session's advisory lock on the instance's id ($1),
// unless it holds it already: the lock stands for the instance's life
// while its session lasts. Taking it writes nothing, so an instance whose
// connection was cut holds it again on its new one even while the database
// refuses writes (read-only), when its heartbeat cannot register the new
// backend.
const lifeLockSQL = `
	SELECT pg_try_advisory_lock(x.k) FROM (SELECT hashtextextended($1, 0) AS k) AS x
	WHERE NOT EXISTS (SELECT 1 FROM pg_locks l
	                  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.objsubid = 1
	                    AND ((l.classid::int8 << 32) | l.objid::int8) = x.k)`

// aliveSQL is the condition that the instance i is alive: registered and
// unexpired, and, if it registered a connection for life, that connection
// still open, or one of its successors holding its advisory lock, or a
// heartbeat within the grace (LifeGraceDefault). A connection registered
// before the server (re)started counts as open: the instances connect
// again, and their leases decide.
//
// The grace is written into it, not passed, and the statements that run
// each heartbeat (DeadOwners, Peers) take no parameter: a statement
// without parameters keeps one plan per connection, where one with them is
// planned at every run (the sessions' plan_cache_mode, see Configure), and
// the views of locks and backends make those two dear to plan
// (docs/benchmarks.md).
var aliveSQL = `i.expires_at > now()
	AND (i.backend_pid IS NULL
	     OR i.backend_start < pg_postmaster_start_time()
	     OR i.heartbeat_at > now() - interval '` + strconv.FormatInt(LifeGraceDefault.Microseconds(), 10) + ` microseconds'
	     OR EXISTS (SELECT 1 FROM pg_locks l
	                WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
	                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	                  AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(i.id, 0))
	     OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = i.backend_pid AND a.backend_start = i.backend_start))`

// Heartbeat registers the instance (or renews its registration) for
// lease: its deliveries in flight stay its own until then. With live set,
// q is the connection the instance holds for its whole life: the instance
// takes its advisory lock there (lifeLockSQL) and registers its backend,
// and counts as dead once neither is there any more, a grace after its
// last heartbeat (see aliveSQL).
func (s *Store) Heartbeat(ctx context.Context, q Querier, in Instance, lease time.Duration, live bool) error {
	if live {
		if _, err := q.Exec(ctx, lifeLockSQL, in.ID); err != nil {
			return fmt.Errorf("heartbeat: hold the instance's lock: %w", err)
		}
	}
	_, err := q.Exec(ctx, `
		INSERT INTO postbox.instances AS i (id, hostname, pid, version, expires_at, streaming, backend_pid, backend_start, fault, fault_since,
		                                    boot_id, pid_ns, pid_start)
		SELECT $1, $2, $3, $4, now() + $5 * interval '1 second', $6, a.pid, a.backend_start, $8, $9, $10, $11, $12
		FROM (SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid() AND $7
		      UNION ALL SELECT NULL, NULL WHERE NOT $7) AS a
		ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at, streaming = excluded.streaming,
		  backend_pid = CASE WHEN $7 THEN excluded.backend_pid ELSE i.backend_pid END,
		  backend_start = CASE WHEN $7 THEN excluded.backend_start ELSE i.backend_start END,
		  fault = excluded.fault, fault_since = excluded.fault_since`,
		in.ID, in.Hostname, in.PID, in.Version, lease.Seconds(), in.Streaming, live, nullString(in.Fault), nullTime(in.FaultSince),
		nullString(in.Process.BootID), nullString(in.Process.PIDNS), nullInt(in.Process.Start))
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Peers returns how many other instances are alive (aliveSQL), as
// DeadOwners judges them. The statement lists all of them, id included,
// so that it takes no parameter (see aliveSQL).
func (s *Store) Peers(ctx context.Context, id string) (int, error) {
	rows, err := s.Pool.Query(ctx, aliveInstancesSQL)
	if err != nil {
		return 0, fmt.Errorf("count instances: %w", err)
	}
	alive, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("count instances: %w", err)
	}
	n := 0
	for _, other := range alive {
		if other != id {
			n++
		}
	}
	return n, nil
}

// aliveInstancesSQL lists the instances alive, for Peers. It takes no
// parameter (see aliveSQL).
var aliveInstancesSQL = `SELECT i.id FROM postbox.instances i WHERE ` + aliveSQL

// Deregister removes the instance from the registry (a clean shutdown).
func (s *Store) Deregister(ctx context.Context, id string) error {
	_, err := s.Pool.Exec(ctx, `DELETE FROM postbox.instances WHERE id = $1`, id)
	return err
}

// DeadOwners returns the owners of deliveries in flight that are gone
// (aliveSQL): their connection for life has ended on this server and they
// did not come back within the grace (crashed or killed), or their
// registration has expired (frozen, or cut off from the database past
// their lease). The owners are read from deliveries_lease_owner, one
// lookup each.
func (s *Store) DeadOwners(ctx context.Context) ([]string, error) {
	rows, err := s.Pool.Query(ctx, deadOwnersSQL)
	if err != nil {
		return nil, fmt.Errorf("find stopped instances: %w", err)
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find stopped instances: %w", err)
	}
	return owners, nil
}

// deadOwnersSQL is DeadOwners' statement. It takes no parameter (see
// aliveSQL).
var deadOwnersSQL = `
	WITH RECURSIVE owners AS (
	  (SELECT lease_owner FROM postbox.deliveries
	   WHERE status IN ('in_flight', 'failed') AND lease_owner IS NOT NULL ORDER BY lease_owner LIMIT 1)
	  UNION ALL
	  SELECT (SELECT d.lease_owner FROM postbox.deliveries d
	          WHERE d.status IN ('in_flight', 'failed') AND d.lease_owner > owners.lease_owner
	          ORDER BY d.lease_owner LIMIT 1)
	  FROM owners WHERE owners.lease_owner IS NOT NULL
	)
	SELECT lease_owner FROM owners
	WHERE lease_owner IS NOT NULL
	  AND NOT EXISTS (SELECT 1 FROM postbox.instances i
	                  WHERE i.id = owners.lease_owner AND ` + aliveSQL + `)
	UNION
	SELECT u.owner FROM postbox.under_way u
	WHERE NOT EXISTS (SELECT 1 FROM postbox.instances i WHERE i.id = u.owner AND ` + aliveSQL + `)`
