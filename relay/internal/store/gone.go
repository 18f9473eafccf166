package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/internal/proc"
)

// An instance killed (kill -9, OOM) comes back, usually, as a new process
// on the same host a second later. The heartbeat rule (aliveSQL, then the
// rescuer's own grace) cannot tell its predecessor's ended connection from
// a cut one, and gives it seconds to come back; but the new process can
// look at the predecessor's process itself: registered on this host, under
// this boot and in this pid namespace, and no longer running (proc.Gone),
// it is gone for good, and its claims and its stream need wait for no
// grace. These are the statements of that proof.

// Neighbours returns, by id, the processes of the other instances
// registered from me's host, boot and pid namespace whose registration
// has not expired: those whose processes this one can see (proc.Gone).
func (s *Store) Neighbours(ctx context.Context, me proc.Process, except string) (map[string]proc.Process, error) {
	if !me.Provable() {
		return nil, nil
	}
	rows, err := s.Pool.Query(ctx, `
		SELECT id, hostname, boot_id, pid_ns, pid, pid_start FROM postbox.instances
		WHERE hostname = $1 AND boot_id = $2 AND pid_ns = $3 AND id <> $4 AND expires_at > now()`,
		me.Host, me.BootID, me.PIDNS, except)
	if err != nil {
		return nil, fmt.Errorf("read the instances of this host: %w", err)
	}
	out := map[string]proc.Process{}
	for rows.Next() {
		var id string
		var p proc.Process
		if err := rows.Scan(&id, &p.Host, &p.BootID, &p.PIDNS, &p.PID, &p.Start); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the instances of this host: %w", err)
		}
		out[id] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the instances of this host: %w", err)
	}
	return out, nil
}

// InstanceProcess returns the process instance id registered; ok is false
// when it is not registered, or registered no process that can be proven
// gone (proc.Process.Provable).
func (s *Store) InstanceProcess(ctx context.Context, id string) (p proc.Process, ok bool, err error) {
	var boot, ns *string
	var start *int64
	err = s.Pool.QueryRow(ctx, `SELECT hostname, boot_id, pid_ns, pid, pid_start FROM postbox.instances WHERE id = $1`, id).
		Scan(&p.Host, &boot, &ns, &p.PID, &start)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("read instance %s: %w", id, err)
	}
	if boot != nil && ns != nil && start != nil {
		p.BootID, p.PIDNS, p.Start = *boot, *ns, *start
	}
	return p, p.Provable(), nil
}

// ExpireGone ends the registrations of instances proven gone (proc.Gone):
// each is then dead to every instance's heartbeat rule at once (aliveSQL),
// its deliveries among DeadOwners' and no longer a peer. Only the rows
// still naming the process proven gone are touched. It returns the ids it
// expired.
func (s *Store) ExpireGone(ctx context.Context, gone map[string]proc.Process) ([]string, error) {
	if len(gone) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(gone))
	starts := make([]int64, 0, len(gone))
	for id, p := range gone {
		ids = append(ids, id)
		starts = append(starts, p.Start)
	}
	// A moment in the past, so that a statement of a later transaction,
	// whose now() may read the same microsecond, sees it expired.
	rows, err := s.Pool.Query(ctx, `
		UPDATE postbox.instances i SET expires_at = now() - interval '1 millisecond'
		FROM unnest($1::text[], $2::bigint[]) AS g(id, start)
		WHERE i.id = g.id AND i.pid_start = g.start AND i.expires_at > now() - interval '1 millisecond'
		RETURNING i.id`, ids, starts)
	if err != nil {
		return nil, fmt.Errorf("expire the registrations of gone instances: %w", err)
	}
	expired, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("expire the registrations of gone instances: %w", err)
	}
	return expired, nil
}

// TakeLeadershipFrom is AcquireLeadership that also takes the lead from
// gone, an instance proven gone (proc.Gone), before its lease runs out.
// The fencing token moves on as in any takeover.
func (s *Store) TakeLeadershipFrom(ctx context.Context, owner, gone string, lease time.Duration) (Leadership, bool, string, error) {
	return s.acquireLeadership(ctx, owner, gone, lease)
}

func nullInt(n int64) *int64 {
	if n == 0 {
		return nil
	}
	return &n
}
