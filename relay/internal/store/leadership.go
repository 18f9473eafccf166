// Streaming leadership: the fencing token that lets one instance write the
// checkpoint (AcquireLeadership, RenewLeadership, ErrFenced).

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFenced means another instance took over streaming: this one's
// leadership token is stale and its checkpoint write was refused.
var ErrFenced = errors.New("fenced off: another instance took over streaming")

// codeFenced is the SQLSTATE postbox.checkpoint_fenced (and the previous
// version's save_checkpoint) raises when fenced.
const codeFenced = "PBF01"

// IsFenced reports whether err is a fenced checkpoint write.
func IsFenced(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, ErrFenced) || (errors.As(err, &pgErr) && pgErr.Code == codeFenced)
}

// Leadership is a held lease on streaming a slot.
type Leadership struct {
	Token int64
}

// AcquireLeadership makes owner the slot's streamer if nobody holds a
// current lease (or owner already does), with a new fencing token. It
// reports false, with the current leader, when another instance leads.
func (s *Store) AcquireLeadership(ctx context.Context, owner string, lease time.Duration) (Leadership, bool, string, error) {
	return s.acquireLeadership(ctx, owner, "", lease)
}

// acquireLeadership is AcquireLeadership, taking it also from gone (see
// TakeLeadershipFrom) unless that is "".
func (s *Store) acquireLeadership(ctx context.Context, owner, gone string, lease time.Duration) (Leadership, bool, string, error) {
	var token int64
	err := s.Pool.QueryRow(ctx, `
		INSERT INTO postbox.checkpoints AS c (slot, leader, fencing, lease_expires_at)
		VALUES ($1, $2, 1, now() + $3 * interval '1 second')
		ON CONFLICT (slot) DO UPDATE SET leader = $2, fencing = c.fencing + 1,
		                                 lease_expires_at = now() + $3 * interval '1 second'
		WHERE c.leader IS NULL OR c.leader = $2 OR c.lease_expires_at < now() OR (c.leader = $4 AND $4 <> '')
		RETURNING fencing`, s.Slot, owner, lease.Seconds(), gone).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		var leader string
		_ = s.Pool.QueryRow(ctx, `SELECT coalesce(leader, '') FROM postbox.checkpoints WHERE slot = $1`, s.Slot).Scan(&leader)
		return Leadership{}, false, leader, nil
	}
	if err != nil {
		return Leadership{}, false, "", fmt.Errorf("acquire leadership: %w", err)
	}
	return Leadership{Token: token}, true, owner, nil
}

// RenewLeadership extends owner's lease; it reports false once another
// instance has taken over.
func (s *Store) RenewLeadership(ctx context.Context, owner string, l Leadership, lease time.Duration) (bool, error) {
	tag, err := s.Pool.Exec(ctx, `
		UPDATE postbox.checkpoints SET lease_expires_at = now() + $4 * interval '1 second'
		WHERE slot = $1 AND leader = $2 AND fencing = $3`, s.Slot, owner, l.Token, lease.Seconds())
	if err != nil {
		return false, fmt.Errorf("renew leadership: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseLeadership gives the lease up, so a standby takes over at once.
func (s *Store) ReleaseLeadership(ctx context.Context, owner string, l Leadership) error {
	_, err := s.Pool.Exec(ctx, `
		UPDATE postbox.checkpoints SET leader = NULL, lease_expires_at = NULL
		WHERE slot = $1 AND leader = $2 AND fencing = $3`, s.Slot, owner, l.Token)
	return err
}
