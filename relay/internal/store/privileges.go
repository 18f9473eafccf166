package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/outbox"
)

// Missing is a privilege postbox's role lacks, and the statement that
// grants it (docs/operations.md, "Roles and grants").
type Missing struct {
	// What names the privilege ("DELETE on postbox.outbox"), Why what
	// needs it, Grant the statement, to run as the object's owner.
	What, Why, Grant string
}

// dmlPrivileges are what the relay does to postbox's own tables.
var dmlPrivileges = []string{"SELECT", "INSERT", "UPDATE", "DELETE"}

// MissingPrivileges lists what the connected role lacks of the privileges
// postbox run uses: USAGE on schema postbox, DML on its tables, USAGE on
// its sequences, and SELECT (reconciliation) and DELETE (the purge, and
// the ingest with outbox_retention 0) on the outbox table. It reads the
// catalogs by OID, so it answers where the role may not even look into
// the schema. Nothing is listed for a schema or table that does not exist
// yet: postbox migrate makes them.
func MissingPrivileges(ctx context.Context, q Querier, table outbox.Table) ([]Missing, error) {
	var role string
	var schemaUsage *bool
	err := q.QueryRow(ctx, `
		SELECT current_user, (SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = 'postbox')`).
		Scan(&role, &schemaUsage)
	if err != nil {
		return nil, fmt.Errorf("read privileges: %w", err)
	}
	if schemaUsage == nil {
		return nil, nil
	}
	to := " TO " + Ident(role)
	var out []Missing
	if !*schemaUsage {
		out = append(out, Missing{What: "USAGE on schema postbox", Why: "every statement of postbox's",
			Grant: "GRANT USAGE ON SCHEMA postbox" + to})
	}
	// Every table and sequence of the schema, the outbox (and what it
	// owns) apart: those are the application's, with needs of their own.
	rows, err := q.Query(ctx, `
		SELECT c.relkind::text, c.relname,
		       ARRAY(SELECT p FROM unnest($1::text[]) p WHERE c.relkind <> 'S' AND NOT has_table_privilege(c.oid, p)),
		       c.relkind = 'S' AND NOT has_sequence_privilege(c.oid, 'USAGE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'postbox' AND c.relkind IN ('r', 'p', 'S')
		  AND NOT (n.nspname = $2 AND c.relname = $3)
		  AND NOT EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace tn ON tn.oid = t.relnamespace
		                  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')
		                    AND tn.nspname = $2 AND t.relname = $3)
		ORDER BY c.relname`, dmlPrivileges, table.Schema(), table.Name())
	if err != nil {
		return nil, fmt.Errorf("read privileges: %w", err)
	}
	type lack struct {
		name  string
		privs []string
	}
	var tables, seqs []lack
	var tableCount, seqCount int
	for rows.Next() {
		var kind, name string
		var privs []string
		var noUsage bool
		if err := rows.Scan(&kind, &name, &privs, &noUsage); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read privileges: %w", err)
		}
		if kind == "S" {
			seqCount++
			if noUsage {
				seqs = append(seqs, lack{name: name})
			}
			continue
		}
		tableCount++
		if len(privs) > 0 {
			tables = append(tables, lack{name, privs})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read privileges: %w", err)
	}
	// None granted on any table (a relay role set up with nothing): one
	// statement, not one per table.
	none := len(tables) == tableCount && tableCount > 1
	for _, t := range tables {
		none = none && len(t.privs) == len(dmlPrivileges)
	}
	if none {
		out = append(out, Missing{What: "SELECT, INSERT, UPDATE, DELETE on postbox's tables", Why: "postbox's own records",
			Grant: "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA postbox" + to})
	} else {
		for _, t := range tables {
			privs := strings.Join(t.privs, ", ")
			out = append(out, Missing{What: privs + " on postbox." + t.name, Why: "postbox's own records",
				Grant: "GRANT " + privs + " ON postbox." + Ident(t.name) + to})
		}
	}
	if len(seqs) == seqCount && seqCount > 1 {
		out = append(out, Missing{What: "USAGE on postbox's sequences", Why: "the ids of events and deliveries",
			Grant: "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA postbox" + to})
	} else {
		for _, s := range seqs {
			out = append(out, Missing{What: "USAGE on sequence postbox." + s.name, Why: "the ids of events and deliveries",
				Grant: "GRANT USAGE, SELECT ON SEQUENCE postbox." + Ident(s.name) + to})
		}
	}

	var outboxUsage, outboxSelect, outboxDelete *bool
	var owner *string
	err = q.QueryRow(ctx, `
		SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'DELETE'),
		       pg_get_userbyid(c.relowner)::text
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, table.Schema(), table.Name()).
		Scan(&outboxUsage, &outboxSelect, &outboxDelete, &owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read privileges: %w", err)
	}
	asOwner := fmt.Sprintf("as %s (its owner): ", Ident(*owner))
	if !*outboxUsage && table.Schema() != "postbox" {
		out = append(out, Missing{What: "USAGE on schema " + table.Schema(), Why: "the outbox table",
			Grant: "GRANT USAGE ON SCHEMA " + Ident(table.Schema()) + to})
	}
	var privs, why []string
	if !*outboxSelect {
		privs, why = append(privs, "SELECT"), append(why, "reconciliation (after a lost slot, and at the first start)")
	}
	if !*outboxDelete {
		privs, why = append(privs, "DELETE"), append(why, "the outbox purge (and the ingest, with outbox_retention 0)")
	}
	if len(privs) > 0 {
		out = append(out, Missing{What: strings.Join(privs, ", ") + " on " + table.String(), Why: strings.Join(why, "; "),
			Grant: asOwner + "GRANT " + strings.Join(privs, ", ") + " ON " + table.String() + to})
	}
	return out, nil
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Ident is name as SQL reads it: bare where it can be, quoted otherwise,
// so the statements postbox prints read as a person would write them.
func Ident(name string) string {
	if plainIdent.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

// PrivilegeError is a statement refused for a privilege the role lacks:
// Missing names it and the statement that grants it.
type PrivilegeError struct {
	Missing
	Err error
}

func (e *PrivilegeError) Error() string {
	return fmt.Sprintf("%s: role lacks %s, which %s needs (%s)", e.Err, e.What, e.Why, e.Grant)
}

func (e *PrivilegeError) Unwrap() error { return e.Err }

// needs wraps err, when it is a refusal for want of a privilege, with the
// privilege and its grant; other errors come back as they are.
func needs(err error, m Missing) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege {
		return &PrivilegeError{Missing: m, Err: err}
	}
	return err
}

// Refused reports whether err is the server's refusal for want of a
// privilege (SQLSTATE 42501).
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege
}

// NeedsPrivilege is needs, for the other packages' statements.
func NeedsPrivilege(err error, m Missing) error { return needs(err, m) }

// codeInsufficientPrivilege is SQLSTATE 42501: permission denied, or
// must be owner.
const codeInsufficientPrivilege = "42501"

// grantTo is " TO role" for the store's role, or a placeholder where it
// is not known.
func (s *Store) grantTo() string {
	if s.Role == "" {
		return " TO <postbox's role>"
	}
	return " TO " + Ident(s.Role)
}

// outboxNeeds is the privilege privs on the outbox table that why needs.
func (s *Store) outboxNeeds(privs, why string) Missing {
	return Missing{What: privs + " on " + s.Table.String(), Why: why,
		Grant: "as the table's owner: GRANT " + privs + " ON " + s.Table.String() + s.grantTo()}
}
