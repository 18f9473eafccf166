// Package ops holds what operators do to a running deployment from outside
// the relay: replaying events. Every action works on the database alone, so
// it answers while no relay runs, and every relay sees its effect.
package ops

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// ReplayFilter selects the events a replay enqueues again.
type ReplayFilter = store.ReplayFilter

// ReplayItem is one selected event.
type ReplayItem = store.ReplayItem

// Replay enqueues a new delivery for each event f selects (keeping its
// event id, so receivers still deduplicate), spread out at rate events a
// second when rate is positive. With dryRun it only lists them. It returns
// the selection and how many deliveries it enqueued.
func Replay(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, f ReplayFilter, dryRun bool, rate float64) ([]ReplayItem, int, error) {
	s := &store.Store{Pool: pool, Table: cfg.Table, Slot: cfg.Slot}
	return s.Replay(ctx, f, dryRun, rate)
}
