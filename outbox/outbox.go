package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultTable is the outbox table postbox reads unless configured otherwise.
const DefaultTable = "postbox.outbox"

//go:embed schema.sql
var schemaSQL string

// Event is one row of the outbox: a webhook or postback to deliver.
type Event struct {
	// ID is the event's stable identity, sent as webhook-id on every attempt
	// and replay. Insert generates one when it is empty.
	ID string
	// Endpoint names the receiving party. Its configured settings apply; an
	// endpoint that is not configured needs URL. Empty (NULL) routes the
	// event by its Type to every endpoint subscribed to it (event_types in
	// postbox.endpoints).
	Endpoint string
	// URL overrides the endpoint's configured URL (optional).
	URL string
	// Type is the event type, available to templates as {event_type}.
	Type string
	// Payload is the JSON body. A nil payload is stored as {}.
	Payload json.RawMessage
	// Headers are extra request headers for this event (optional).
	Headers map[string]string
}

// Table is a validated outbox table name, such as "postbox.outbox".
type Table struct {
	schema, name string
}

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ParseTable validates a table name of the form "table" or "schema.table".
// Names are lower-case SQL identifiers; an unqualified name is in schema public.
func ParseTable(s string) (Table, error) {
	schema, name, ok := strings.Cut(s, ".")
	if !ok {
		schema, name = "public", s
	}
	if !identRe.MatchString(schema) || !identRe.MatchString(name) {
		return Table{}, fmt.Errorf("outbox table %q: want schema.table with lower-case letters, digits and underscores", s)
	}
	return Table{schema: schema, name: name}, nil
}

// Schema is the table's schema name.
func (t Table) Schema() string { return t.schema }

// Name is the table's name without the schema.
func (t Table) Name() string { return t.name }

// String is the qualified name, "schema.table".
func (t Table) String() string { return t.schema + "." + t.name }

// Ident is the qualified, quoted name for use in SQL.
func (t Table) Ident() string { return `"` + t.schema + `"."` + t.name + `"` }

// SchemaSQL returns the DDL that creates the outbox table (idempotently).
func SchemaSQL(t Table) string {
	if t.String() == DefaultTable {
		return schemaSQL
	}
	ddl := strings.Replace(schemaSQL, "CREATE SCHEMA IF NOT EXISTS postbox;",
		`CREATE SCHEMA IF NOT EXISTS "`+t.schema+`";`, 1)
	return strings.Replace(ddl, "postbox.outbox", t.Ident(), 1)
}

// PgxExecer is satisfied by pgx.Tx, *pgx.Conn and *pgxpool.Pool.
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is satisfied by *sql.Tx, *sql.DB and *sql.Conn.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ErrNotExecer is returned when Insert is given something it cannot write with.
var ErrNotExecer = errors.New("outbox: tx must be a pgx.Tx (or other PgxExecer) or a *sql.Tx (or other SQLExecer)")

// Insert writes e into the default outbox table, postbox.outbox, using tx,
// which should be the caller's own transaction: the event is then delivered
// if and only if that transaction commits. tx is a pgx.Tx or a *sql.Tx. It
// returns the event id. For a relay configured with another outbox_table,
// write through that table: ParseTable, then Table.Insert.
func Insert(ctx context.Context, tx any, e Event) (string, error) {
	return Table{schema: "postbox", name: "outbox"}.Insert(ctx, tx, e)
}

// Insert writes e into table t; see the package-level Insert.
func (t Table) Insert(ctx context.Context, tx any, e Event) (string, error) {
	var endpoint any // NULL: routed by Type
	switch {
	case e.Endpoint != "":
		endpoint = e.Endpoint
	case e.Type == "":
		return "", errors.New("outbox: event needs an endpoint, or a type to route it by")
	}
	if e.ID == "" {
		e.ID = NewEventID()
	}
	payload := []byte(e.Payload)
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	if !json.Valid(payload) {
		return "", errors.New("outbox: payload is not valid JSON")
	}
	var headers any // NULL unless set
	if len(e.Headers) > 0 {
		b, err := json.Marshal(e.Headers)
		if err != nil {
			return "", fmt.Errorf("outbox: encode headers: %w", err)
		}
		headers = string(b)
	}
	var url any
	if e.URL != "" {
		url = e.URL
	}
	query := "INSERT INTO " + t.Ident() +
		" (event_id, endpoint, url, event_type, payload, headers) VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)"
	args := []any{e.ID, endpoint, url, e.Type, string(payload), headers}
	var err error
	switch x := tx.(type) {
	case PgxExecer:
		_, err = x.Exec(ctx, query, args...)
	case SQLExecer:
		_, err = x.ExecContext(ctx, query, args...)
	default:
		return "", ErrNotExecer
	}
	if err != nil {
		return "", fmt.Errorf("outbox: insert event for endpoint %q: %w", e.Endpoint, err)
	}
	return e.ID, nil
}

// NewEventID returns a random (version 4) UUID in canonical form.
func NewEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
