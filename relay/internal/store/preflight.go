package store

import (
	"context"
	"errors"
	"fmt"
)

// MinServerVersion is the oldest PostgreSQL postbox supports (pgoutput
// protocol 2, publish options and gen_random_uuid in core).
const MinServerVersion = 140000

// PreflightError is a server setting that keeps postbox from running. Its
// message says the fix in one sentence.
type PreflightError struct {
	Check string
	Msg   string
}

func (e *PreflightError) Error() string { return e.Msg }

// Preflight checks what postbox cannot run without: PostgreSQL 14 or newer,
// wal_level = logical, and a role allowed to replicate.
func Preflight(ctx context.Context, q Querier) error {
	var version int
	var versionText, walLevel, role string
	var canReplicate bool
	err := q.QueryRow(ctx, `
		SELECT current_setting('server_version_num')::int, current_setting('server_version'),
		       current_setting('wal_level'), current_user,
		       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)`).
		Scan(&version, &versionText, &walLevel, &role, &canReplicate)
	if err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	var errs []error
	if version < MinServerVersion {
		errs = append(errs, &PreflightError{Check: "server_version",
			Msg: fmt.Sprintf("PostgreSQL %s is too old: postbox needs 14 or newer, so upgrade the server.", versionText)})
	}
	if walLevel != "logical" {
		errs = append(errs, &PreflightError{Check: "wal_level",
			Msg: fmt.Sprintf("wal_level is %q, not logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL.", walLevel)})
	}
	if !canReplicate {
		errs = append(errs, &PreflightError{Check: "replication_privilege",
			Msg: fmt.Sprintf("role %q may not use replication: as a superuser, run ALTER ROLE %q WITH REPLICATION.", role, role)})
	}
	return errors.Join(errs...)
}
