package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
)

//go:embed migrations/*.up.sql
var migrationFS embed.FS

// Migration is one numbered step of postbox's schema.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var migrationName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.up\.sql$`)

// Migrations returns the embedded steps in order. It panics on a gap or a
// duplicate number: that is a build mistake, not a runtime condition.
func Migrations() []Migration {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			panic("store: migration file with a bad name: " + e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			panic(fmt.Sprintf("store: migrations must be numbered 001, 002, … without gaps; found %03d at position %d", m.Version, i+1))
		}
	}
	return out
}

// migrateLock is the advisory lock key that serialises migrations, so
// instances starting together apply each step once.
const migrateLock = 0x706f7374626f78 // "postbox"

// Migrate brings postbox's schema up to date and creates the outbox table
// if it is missing. Each step runs in its own transaction under an advisory
// lock, and is recorded in postbox.schema_migrations; running it again, or
// from several instances at once, is safe.
func Migrate(ctx context.Context, pool *pgxpool.Pool, table outbox.Table) error {
	for _, m := range Migrations() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `
				CREATE SCHEMA IF NOT EXISTS postbox;
				CREATE TABLE IF NOT EXISTS postbox.schema_migrations (
				  version    integer     PRIMARY KEY,
				  name       text        NOT NULL,
				  applied_at timestamptz NOT NULL DEFAULT now()
				)`); err != nil {
				return err
			}
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM postbox.schema_migrations WHERE version = $1)`, m.Version).Scan(&done); err != nil {
				return err
			}
			if done {
				return nil
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO postbox.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, outbox.SchemaSQL(table))
		return err
	})
	if err != nil {
		return fmt.Errorf("create outbox table %s: %w", table, err)
	}
	return nil
}

// SchemaVersion returns the latest applied migration (0 when none).
func SchemaVersion(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var v int
	err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM postbox.schema_migrations`).Scan(&v)
	return v, err
}

// SchemaError is a schema that run, with migrate off, cannot run on.
type SchemaError struct{ Msg string }

func (e *SchemaError) Error() string { return e.Msg }

// CheckSchema changes nothing: it checks that postbox's schema is at the
// version of this binary's migrations and that the outbox table exists,
// for a relay that runs without DDL rights (migrate: false). It reads the
// catalogs first, so a role that may not look into the schema hears which
// GRANT it lacks rather than "permission denied".
func CheckSchema(ctx context.Context, q Querier, table outbox.Table) error {
	const off = "and migrate is off (migrate: false, or run --no-migrate)"
	var role string
	var usage, readable, outboxExists *bool
	err := q.QueryRow(ctx, `
		SELECT current_user,
		       (SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = 'postbox'),
		       (SELECT has_table_privilege(c.oid, 'SELECT') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		        WHERE n.nspname = 'postbox' AND c.relname = 'schema_migrations'),
		       (SELECT true FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2)`,
		table.Schema(), table.Name()).Scan(&role, &usage, &readable, &outboxExists)
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	want := len(Migrations())
	switch {
	case usage == nil || readable == nil:
		return &SchemaError{fmt.Sprintf("schema postbox does not exist (or has no schema_migrations), %s: run postbox migrate as the schema's owner role first", off)}
	case !*usage:
		return &SchemaError{fmt.Sprintf("role %s may not use schema postbox: as its owner, GRANT USAGE ON SCHEMA postbox TO %s", role, Ident(role))}
	case !*readable:
		return &SchemaError{fmt.Sprintf("role %s may not read postbox.schema_migrations: as the schema's owner, GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA postbox TO %s", role, Ident(role))}
	}
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM postbox.schema_migrations`).Scan(&v); err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	switch {
	case v < want:
		return &SchemaError{fmt.Sprintf("schema postbox is at version %d, this postbox needs %d, %s: run postbox migrate as the schema's owner role, then start again", v, want, off)}
	case v > want:
		return &SchemaError{fmt.Sprintf("schema postbox is at version %d, newer than this postbox knows (%d): run the newer postbox", v, want)}
	case outboxExists == nil:
		return &SchemaError{fmt.Sprintf("outbox table %s does not exist, %s: run postbox migrate, or apply outbox/schema.sql in the application's migrations", table, off)}
	}
	return nil
}
