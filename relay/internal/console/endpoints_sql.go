package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/relay/internal/endpoints"
)

// The SQL of postbox.endpoints and postbox.endpoint_changes as the
// console reads and writes them. Rows are read as PostgreSQL's text output
// of each column, as the relay reads them (the stream, the applied copy),
// so that the console judges a row as the relay will.

// endpointRowsSQL reads up to $2 rows from name $1 on, by name.
const endpointRowsSQL = `SELECT * FROM postbox.endpoints WHERE name >= $1 ORDER BY name LIMIT $2`

// endpointRowSQL reads one row.
const endpointRowSQL = `SELECT * FROM postbox.endpoints WHERE name = $1`

// endpointActorSQL names who changes the rows of this transaction in the
// change log (SET LOCAL postbox.actor, which the endpoint_log trigger
// reads).
const endpointActorSQL = `SELECT set_config('postbox.actor', $1, true)`

// endpointEnableSQL sets enabled; a row already so is left alone (and
// logs no change).
const endpointEnableSQL = `UPDATE postbox.endpoints SET enabled = $2 WHERE name = $1 AND enabled <> $2`

const endpointExistsSQL = `SELECT EXISTS (SELECT FROM postbox.endpoints WHERE name = $1)`

const endpointDeleteSQL = `DELETE FROM postbox.endpoints WHERE name = $1`

// endpointChangesSQL is the newest $2 changes of an endpoint.
const endpointChangesSQL = `
SELECT changed_at, actor, op, revision, coalesce(old, '{}'), coalesce(new, '{}')
FROM postbox.endpoint_changes WHERE name = $1 ORDER BY id DESC LIMIT $2`

// endpointInsertSQL and endpointUpdateSQL write the form's columns
// (formFields), each parameter a text value (or text[] for lists) cast to
// the column's type; the update only over the revision the form was read
// at.
var endpointInsertSQL, endpointUpdateSQL = func() (string, string) {
	cols, vals, sets := []string{"name", "enabled"}, []string{"$1", "$2::boolean"}, []string{}
	for i, f := range formFields {
		p := "$" + strconv.Itoa(i+3) + f.cast()
		if f.Col == "secret_version" {
			p = "coalesce(" + p + ", 1)"
		}
		cols, vals = append(cols, f.Col), append(vals, p)
		sets = append(sets, f.Col+" = "+p)
	}
	insert := "INSERT INTO postbox.endpoints (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(vals, ", ") + ") RETURNING revision"
	update := "UPDATE postbox.endpoints SET " + strings.Join(sets, ", ") + " WHERE name = $1 AND revision = $2::bigint RETURNING revision"
	return insert, update
}()

// readEndpointRows reads rows of postbox.endpoints as text.
func readEndpointRows(ctx context.Context, q querier, sql string, args ...any) ([]endpoints.Row, error) {
	rows, err := q.Query(ctx, sql, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("read postbox.endpoints: %w", err)
	}
	return endpoints.CollectRows(rows)
}

// readEndpointRow reads name's row; nil when there is none.
func readEndpointRow(ctx context.Context, q querier, name string) (endpoints.Row, error) {
	rows, err := readEndpointRows(ctx, q, endpointRowSQL, name)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[0], nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// change is one line of an endpoint's change log.
type change struct {
	At       time.Time
	Actor    string
	Op       string
	Revision int64
	// Keys are the columns the change set (an insert: those not NULL) or
	// changed (an update); values are never shown (headers may hold
	// credentials).
	Keys []string
}

// bookkeeping are the columns every change touches.
var bookkeeping = map[string]bool{"name": true, "revision": true, "created_at": true, "updated_at": true}

func readChanges(ctx context.Context, q querier, name string, limit int) ([]change, error) {
	rows, err := q.Query(ctx, endpointChangesSQL, name, limit)
	if err != nil {
		return nil, fmt.Errorf("read postbox.endpoint_changes: %w", err)
	}
	defer rows.Close()
	var out []change
	for rows.Next() {
		var ch change
		var old, cur map[string]any
		if err := rows.Scan(&ch.At, &ch.Actor, &ch.Op, &ch.Revision, &old, &cur); err != nil {
			return nil, fmt.Errorf("read postbox.endpoint_changes: %w", err)
		}
		ch.Keys = changedKeys(ch.Op, old, cur)
		out = append(out, ch)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read postbox.endpoint_changes: %w", err)
	}
	return out, nil
}

// changedKeys are the columns an insert set or an update changed, in the
// form's order (then any other, by name).
func changedKeys(op string, old, cur map[string]any) []string {
	var keys []string
	seen := map[string]bool{}
	add := func(k string) {
		if seen[k] || bookkeeping[k] {
			return
		}
		seen[k] = true
		switch op {
		case "insert": // what it set beyond the column defaults
			if cur[k] != nil && !(k == "enabled" && cur[k] == true) && !(k == "secret_version" && fmt.Sprint(cur[k]) == "1") {
				keys = append(keys, k)
			}
		case "update":
			if fmt.Sprint(old[k]) != fmt.Sprint(cur[k]) {
				keys = append(keys, k)
			}
		}
	}
	add("enabled")
	for _, f := range formFields {
		add(f.Col)
	}
	var rest []string
	for k := range cur {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		add(k)
	}
	return keys
}

// errStale: the row changed (or went) since the form was read.
var errStale = errors.New("the endpoint changed since the form was read")

// constraintColumn is the column of a CHECK constraint that refused a
// row (PostgreSQL names them endpoints_<column>_check).
func constraintColumn(err error) (col string, pe *pgconn.PgError) {
	if !errors.As(err, &pe) {
		return "", nil
	}
	switch pe.Code {
	case "23514": // check_violation
		c := strings.TrimSuffix(strings.TrimPrefix(pe.ConstraintName, "endpoints_"), "_check")
		return c, pe
	case "23505": // unique_violation: the name
		return "name", pe
	case "23502": // not_null_violation
		return pe.ColumnName, pe
	}
	return "", nil
}
