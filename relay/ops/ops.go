// Package ops holds what operators do to a running deployment from outside
// the relay: replaying events, pausing and resuming endpoints, writing
// the endpoints of postbox.endpoints and reading their change log. Every action
// works on the database alone, so it answers while no relay runs, and
// every relay sees its effect.
package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Replay enqueues a new delivery for each event f selects (keeping its
// event id, so receivers still deduplicate), spread out at rate events a
// second when rate is positive. With dryRun it only lists them. It returns
// the selection and how many deliveries it enqueued. While cfg has
// outbox_messages off, events written with outbox.Emit are left out
// (postboxtype.ReplayItem.MessagesOff): a relay would dead-letter them again.
func Replay(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, f postboxtype.ReplayFilter, dryRun bool, rate float64) ([]postboxtype.ReplayItem, int, error) {
	s := &store.Store{Pool: pool, Table: cfg.Table, Slot: cfg.Slot}
	f.NoMessages = f.NoMessages || !cfg.Messages
	return s.Replay(ctx, f, dryRun, rate)
}

// Pause holds endpoint's deliveries until until, or until Resume when until
// is zero (its paused_until is then postboxtype.PauseIndefinite), on every
// instance. Nothing is dropped: its events are ingested
// and wait in the queue without spending attempts. It replaces any pause
// the endpoint has; a receiver's Retry-After while it lasts can extend it,
// never shorten it. Instances hear of it at once; an attempt one of them
// had already started finishes.
func Pause(ctx context.Context, pool *pgxpool.Pool, endpoint string, until time.Time) error {
	s := &store.Store{Pool: pool}
	return s.Pause(ctx, endpoint, until)
}

// Resume ends endpoint's pause (an operator's or a receiver's), and the
// instances claim its deliveries at once.
func Resume(ctx context.Context, pool *pgxpool.Pool, endpoint string) error {
	s := &store.Store{Pool: pool}
	return s.Resume(ctx, endpoint)
}
