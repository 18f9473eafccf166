package telemetry

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is a pool, a connection or a transaction (*pgxpool.Pool, *pgx.Conn,
// pgx.Tx). It is declared here, not borrowed from the store, so that this
// public package's signatures name no internal type.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
