package relay

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/logsafe"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// Connect opens a pool of at most maxConns connections (the pool's default
// when 0) with the session settings postbox's queries rely on: UTC, ISO
// dates, custom plans, no JIT. Operator commands use it.
func Connect(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	return store.Open(ctx, dbURL, maxConns)
}

// Migrate creates or upgrades postbox's schema, the outbox table of cfg
// and its publication, and returns the schema version. The publication is
// made here, by the role that migrates: it takes the table's owner, which
// a relay role of least privilege is not.
func Migrate(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) (int, error) {
	if err := store.Migrate(ctx, pool, cfg.Table); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if err := wal.EnsurePublication(ctx, pool, cfg.Publication, cfg.Table); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if err := wal.EnsureEndpointsPublication(ctx, pool, cfg.Publication); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	return store.SchemaVersion(ctx, pool)
}

// LogWriter wraps w with postbox's log field policy: payloads, query
// strings, header values and secrets are redacted unless logPayloads is
// set (and secrets even then). Give the relay's zerolog logger this writer.
func LogWriter(w io.Writer, logPayloads bool) io.Writer {
	return logsafe.NewWriter(w, logPayloads)
}
