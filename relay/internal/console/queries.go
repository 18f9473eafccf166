package console

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pauser holds an endpoint's deliveries back until a time, and lifts that
// pause: a manual pause shared by all instances, nothing dropped.
type Pauser interface {
	Pause(ctx context.Context, pool *pgxpool.Pool, endpoint string, until time.Time) error
	Resume(ctx context.Context, pool *pgxpool.Pool, endpoint string) error
}
