package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
)

// The SQL of postbox.endpoints and its change log, as operators write and
// read them (the relay reads the rows from the stream and endpoint_state).

// EndpointColumns are the columns of postbox.endpoints an operator sets,
// named as the configuration's keys, with their SQL types. name,
// revision, created_at and updated_at are the table's own.
var EndpointColumns = []struct{ Name, Type string }{
	{"url", "text"}, {"method", "text"}, {"body", "text"}, {"headers", "jsonb"},
	{"timeout", "interval"}, {"max_attempts", "integer"}, {"backoff_base", "interval"}, {"backoff_cap", "interval"},
	{"failure_threshold", "integer"}, {"cooldown", "interval"}, {"max_cooldown", "interval"},
	{"rate_limit", "text"}, {"max_in_flight", "integer"}, {"success", "jsonb"}, {"retry_on", "integer[]"},
	{"ordered", "boolean"}, {"redact_path", "jsonb"}, {"allow_row_url", "boolean"}, {"row_url_hosts", "text[]"},
	{"enabled", "boolean"}, {"event_types", "text[]"}, {"filter", "jsonb"},
	{"secret", "text"}, {"secret_version", "integer"}, {"previous_secret_until", "timestamptz"},
}

// columnType is col's SQL type ("" when it is not one an operator sets).
func columnType(col string) string {
	for _, c := range EndpointColumns {
		if c.Name == col {
			return c.Type
		}
	}
	return ""
}

// Value is what a column is set to: Text is its value as PostgreSQL reads
// it (cast from text to the column's type); Default sets the column's
// default (NULL but for enabled and secret_version). Merge, for a jsonb
// object, sets only the keys Text holds (success: status alone).
type Value struct {
	Text    string
	Default bool
	Merge   bool
}

// EndpointWrite is one change an operator makes to postbox.endpoints.
type EndpointWrite struct {
	Name string
	// Set are the columns changed; the others keep their value (Update),
	// or take their default (Insert, Upsert).
	Set map[string]Value
	// NoCheck writes a row that would be invalid (a disable: its events
	// wait either way).
	NoCheck bool
}

// Write operations.
const (
	WriteInsert = "insert" // a new row; refused when name exists
	WriteUpdate = "update" // the columns Set on an existing row
	WriteUpsert = "upsert" // the row made exactly Set (import)
)

// ErrNoEndpoint: the row to change does not exist; ErrEndpointExists:
// the row to create does.
var (
	ErrNoEndpoint     = errors.New("no such endpoint in postbox.endpoints")
	ErrEndpointExists = errors.New("the endpoint exists in postbox.endpoints")
)

// InvalidError is a row postbox would hold as invalid: it was not written.
type InvalidError struct {
	Name, Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("endpoint %s would be invalid: %s", e.Name, e.Reason)
}

// WriteResult is what a write did to one row.
type WriteResult struct {
	Name     string `json:"endpoint"`
	Op       string `json:"op"` // created, changed, unchanged, deleted
	Revision int64  `json:"revision,omitempty"`
	// Held is why the endpoint's events wait ("disabled"), "" when not.
	Held string `json:"held,omitempty"`
	// Conflict: the file defines the name too, and its settings are used.
	Conflict bool `json:"conflict,omitempty"`
}

// writeBatch is how many writes WriteEndpoints sends at once: an import
// of thousands waits for a round trip a batch, not one a row.
const writeBatch = 500

// WriteEndpoints applies writes in one transaction, each checked as the
// relay will read it: a row that would be invalid (InvalidError) or that
// the table's constraints refuse rolls all of them back. Each row written
// is read back before the commit, as the columns' text output: what the
// stream will carry to the relays, parsed as they parse it. cfg resolves
// the rows against its defaults and named secrets. actor, when not "", is
// who the change log names (the console's session); otherwise the
// session's role.
func WriteEndpoints(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, actor, op string, writes []EndpointWrite) ([]WriteResult, error) {
	stmts := make([]writeStmt, len(writes))
	for i, w := range writes {
		st, err := buildWrite(op, w)
		if err != nil {
			return nil, err
		}
		stmts[i] = st
	}
	out := make([]WriteResult, 0, len(writes))
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := setActor(ctx, tx, actor); err != nil {
			return err
		}
		for from := 0; from < len(writes); from += writeBatch {
			chunk := writes[from:min(from+writeBatch, len(writes))]
			b := &pgx.Batch{}
			for i := range chunk {
				b.Queue(stmts[from+i].sql, stmts[from+i].args...)
			}
			br := tx.SendBatch(ctx, b)
			var written []string
			check := map[string]bool{}
			for _, w := range chunk {
				res, err := writeResult(br.QueryRow(), op, w)
				if err != nil {
					_ = br.Close()
					return err
				}
				if res.Op != "unchanged" {
					written = append(written, w.Name)
					check[w.Name] = !w.NoCheck
				}
				_, res.Conflict = cfg.Endpoints[w.Name]
				out = append(out, res)
			}
			if err := br.Close(); err != nil {
				return fmt.Errorf("endpoints: write: %w", err)
			}
			if len(written) == 0 {
				continue
			}
			rows, err := readRows(ctx, tx, written...)
			if err != nil {
				return err
			}
			tes := make([]config.TableEndpoint, len(rows))
			for i, r := range rows {
				tes[i] = endpoints.Parse(r)
			}
			held := map[string]string{}
			for i, ep := range ResolveAll(cfg, tes) {
				if ep.Invalid != "" && check[tes[i].Name] {
					return &InvalidError{Name: tes[i].Name, Reason: ep.Invalid}
				}
				held[tes[i].Name] = ep.Held()
			}
			for i := len(out) - len(chunk); i < len(out); i++ {
				out[i].Held = held[out[i].Name]
			}
		}
		return nil
	})
	if err != nil {
		return nil, constraintError(err)
	}
	return out, nil
}

// writeStmt is one write's statement.
type writeStmt struct {
	sql  string
	args []any
}

func buildWrite(op string, w EndpointWrite) (writeStmt, error) {
	cols := make([]string, 0, len(w.Set))
	for c := range w.Set {
		if columnType(c) == "" {
			return writeStmt{}, fmt.Errorf("endpoints: %s is not a column of postbox.endpoints", c)
		}
		cols = append(cols, c)
	}
	slices.Sort(cols)
	args := []any{w.Name}
	value := func(c string) string {
		v := w.Set[c]
		if v.Default {
			return "DEFAULT"
		}
		args = append(args, v.Text)
		expr := fmt.Sprintf("$%d::text::%s", len(args), columnType(c))
		if v.Merge && op == WriteUpdate {
			expr = fmt.Sprintf("coalesce(%s, '{}') || %s", pgx.Identifier{c}.Sanitize(), expr)
		}
		return expr
	}
	var sql string
	switch op {
	case WriteUpdate:
		if len(cols) == 0 {
			return writeStmt{}, errors.New("endpoints set: nothing to change")
		}
		sets := make([]string, len(cols))
		for i, c := range cols {
			sets[i] = pgx.Identifier{c}.Sanitize() + " = " + value(c)
		}
		sql = `UPDATE postbox.endpoints SET ` + strings.Join(sets, ", ") + ` WHERE name = $1 RETURNING revision, false`
	case WriteInsert, WriteUpsert:
		// An upsert sets every column: those the write leaves out take
		// their default, as a new row's would.
		names, values := []string{"name"}, []string{"$1"}
		for _, c := range EndpointColumns {
			if _, ok := w.Set[c.Name]; !ok && op == WriteInsert {
				continue
			}
			names = append(names, pgx.Identifier{c.Name}.Sanitize())
			if _, ok := w.Set[c.Name]; ok {
				values = append(values, value(c.Name))
			} else {
				values = append(values, "DEFAULT")
			}
		}
		sql = `INSERT INTO postbox.endpoints AS e (` + strings.Join(names, ", ") + `) VALUES (` + strings.Join(values, ", ") + `)`
		if op == WriteUpsert {
			// Unchanged rows are not written: no new revision, no change
			// logged.
			sets := make([]string, 0, len(names)-1)
			olds := make([]string, 0, len(names)-1)
			news := make([]string, 0, len(names)-1)
			for _, n := range names[1:] {
				sets = append(sets, n+" = EXCLUDED."+n)
				olds = append(olds, "e."+n)
				news = append(news, "EXCLUDED."+n)
			}
			sql += ` ON CONFLICT (name) DO UPDATE SET ` + strings.Join(sets, ", ") +
				` WHERE (` + strings.Join(olds, ", ") + `) IS DISTINCT FROM (` + strings.Join(news, ", ") + `)`
		}
		sql += ` RETURNING revision, xmax = 0`
	default:
		return writeStmt{}, fmt.Errorf("endpoints: unknown write %q", op)
	}
	return writeStmt{sql: sql, args: args}, nil
}

// writeResult reads what one write did.
func writeResult(row pgx.Row, op string, w EndpointWrite) (WriteResult, error) {
	res := WriteResult{Name: w.Name}
	var inserted bool
	err := row.Scan(&res.Revision, &inserted)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && op == WriteUpsert:
		res.Op = "unchanged"
		return res, nil
	case errors.Is(err, pgx.ErrNoRows):
		return res, fmt.Errorf("%w: %s", ErrNoEndpoint, w.Name)
	case err != nil:
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return res, fmt.Errorf("%w: %s", ErrEndpointExists, w.Name)
		}
		return res, fmt.Errorf("endpoints: write %s: %w", w.Name, err)
	}
	res.Op = "changed"
	if inserted {
		res.Op = "created"
	}
	return res, nil
}

// RefusedError is a value the table refused: a check constraint (Column
// names its column) or a value of the wrong form for its type.
type RefusedError struct {
	Column, Constraint, Msg string
}

func (e *RefusedError) Error() string {
	if e.Constraint != "" {
		return fmt.Sprintf("%s: refused by postbox.endpoints (constraint %s)", e.Column, e.Constraint)
	}
	return "a value does not fit its column: " + e.Msg
}

// constraintError says which column a refused value was for: the check
// constraints are named by PostgreSQL as endpoints_<column>_check.
func constraintError(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "23514": // check_violation
		col := strings.TrimSuffix(strings.TrimPrefix(pe.ConstraintName, "endpoints_"), "_check")
		return &RefusedError{Column: col, Constraint: pe.ConstraintName}
	case "22P02", "22007", "22008", "22023", "22003": // a value of the wrong form for its type
		return &RefusedError{Msg: pe.Message}
	}
	return err
}

// DeleteEndpoint deletes name's row; false when there was none. actor is
// as WriteEndpoints's.
func DeleteEndpoint(ctx context.Context, pool *pgxpool.Pool, actor, name string) (bool, error) {
	var deleted bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := setActor(ctx, tx, actor); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM postbox.endpoints WHERE name = $1`, name)
		deleted = tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("endpoints: delete %s: %w", name, err)
	}
	return deleted, nil
}

// setActor names who the change log records for tx's changes (the
// trigger reads postbox.actor), for tx alone.
func setActor(ctx context.Context, tx pgx.Tx, actor string) error {
	if actor == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('postbox.actor', $1, true)`, actor); err != nil {
		return fmt.Errorf("endpoints: name the actor: %w", err)
	}
	return nil
}

// queryer is a pool, a connection or a transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readRows reads postbox.endpoints as PostgreSQL's text output of each
// column, as the stream sends it: the rows named, or every row when no
// name is given.
func readRows(ctx context.Context, q queryer, names ...string) ([]endpoints.Row, error) {
	rows, err := q.Query(ctx, `SELECT * FROM postbox.endpoints WHERE coalesce(cardinality($1::text[]), 0) = 0 OR name = ANY($1) ORDER BY name`,
		pgx.QueryResultFormats{pgx.TextFormatCode}, names)
	if err != nil {
		return nil, fmt.Errorf("endpoints: read postbox.endpoints: %w", err)
	}
	return endpoints.CollectRows(rows)
}

// TableEndpoints reads postbox.endpoints (one row, or all when name is
// ""), each row parsed as the relay parses it.
func TableEndpoints(ctx context.Context, pool *pgxpool.Pool, name string) ([]config.TableEndpoint, error) {
	var names []string
	if name != "" {
		names = []string{name}
	}
	rows, err := readRows(ctx, pool, names...)
	if err != nil {
		return nil, err
	}
	out := make([]config.TableEndpoint, len(rows))
	for i, r := range rows {
		out[i] = endpoints.Parse(r)
	}
	return out, nil
}

// Resolve resolves a table row under cfg as the relay would were the file
// not to define the name too: what the row itself makes of the endpoint.
func Resolve(cfg *config.Config, te config.TableEndpoint) config.Endpoint {
	return ResolveAll(cfg, []config.TableEndpoint{te})[0]
}

// ResolveAll resolves each row as Resolve does, under one copy of cfg.
func ResolveAll(cfg *config.Config, tes []config.TableEndpoint) []config.Endpoint {
	c := *cfg
	c.Endpoints = make(map[string]config.Endpoint, len(cfg.Endpoints))
	for k, v := range cfg.Endpoints {
		c.Endpoints[k] = v
	}
	c.EndpointTable = config.NewEndpointTable()
	for _, te := range tes {
		delete(c.Endpoints, te.Name)
		c.EndpointTable.Apply(te)
	}
	out := make([]config.Endpoint, len(tes))
	for i, te := range tes {
		out[i] = c.Endpoint(te.Name)
	}
	return out
}

// EndpointChange is one entry of the change log: a row inserted, updated
// or deleted, and the keys whose values changed.
type EndpointChange struct {
	At       time.Time   `json:"changed_at"`
	Actor    string      `json:"actor"`
	Op       string      `json:"op"`
	Revision int64       `json:"revision"`
	Changes  []KeyChange `json:"changes"`
}

// KeyChange is one key's value before and after (nil: NULL, or no row).
// Header values are never shown: Old and New of a header are "***"; nor
// is a URL's password (xxxxx).
type KeyChange struct {
	Key string          `json:"key"`
	Old json.RawMessage `json:"old"`
	New json.RawMessage `json:"new"`
}

// Masked is what a header's value shows as in the change log.
const Masked = `"***"`

// EndpointHistory is name's change log, oldest first (at most limit
// entries, the newest, when limit > 0).
func EndpointHistory(ctx context.Context, pool *pgxpool.Pool, name string, limit int) ([]EndpointChange, error) {
	if limit <= 0 {
		limit = -1
	}
	rows, err := pool.Query(ctx, `
		SELECT changed_at, actor, op, revision, coalesce(old, '{}'), coalesce(new, '{}') FROM (
		  SELECT * FROM postbox.endpoint_changes WHERE name = $1 ORDER BY id DESC LIMIT nullif($2::int, -1)
		) c ORDER BY id`, name, limit)
	if err != nil {
		return nil, fmt.Errorf("endpoints: read the change log: %w", err)
	}
	defer rows.Close()
	var out []EndpointChange
	for rows.Next() {
		var c EndpointChange
		var oldRow, newRow map[string]json.RawMessage
		if err := rows.Scan(&c.At, &c.Actor, &c.Op, &c.Revision, &oldRow, &newRow); err != nil {
			return nil, fmt.Errorf("endpoints: read the change log: %w", err)
		}
		c.Changes = diffRows(oldRow, newRow)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("endpoints: read the change log: %w", err)
	}
	return out, nil
}

// diffRows lists the keys whose values differ, in the columns' order;
// headers one key each (headers.NAME), their values masked.
func diffRows(oldRow, newRow map[string]json.RawMessage) []KeyChange {
	var out []KeyChange
	val := func(m map[string]json.RawMessage, k string) json.RawMessage {
		v, ok := m[k]
		if !ok || string(v) == "null" {
			return nil
		}
		return v
	}
	for _, c := range append([]struct{ Name, Type string }{{"name", "text"}}, EndpointColumns...) {
		o, n := val(oldRow, c.Name), val(newRow, c.Name)
		if c.Name == "name" && (o == nil || n == nil) {
			continue // an insert's or a delete's: the entry's own
		}
		if c.Name == "headers" {
			out = append(out, diffHeaders(o, n)...)
			continue
		}
		if !jsonEqual(o, n) {
			if c.Name == "url" {
				o, n = redactPassword(o), redactPassword(n)
			}
			out = append(out, KeyChange{Key: c.Name, Old: o, New: n})
		}
	}
	return out
}

// diffHeaders lists each header added, removed or changed, by name, with
// "***" for its value: a header may carry a credential.
func diffHeaders(o, n json.RawMessage) []KeyChange {
	var before, after map[string]json.RawMessage
	_ = json.Unmarshal(o, &before)
	_ = json.Unmarshal(n, &after)
	names := map[string]bool{}
	for k := range before {
		names[k] = true
	}
	for k := range after {
		names[k] = true
	}
	sorted := make([]string, 0, len(names))
	for k := range names {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	var out []KeyChange
	for _, k := range sorted {
		b, inBefore := before[k]
		a, inAfter := after[k]
		if inBefore && inAfter && jsonEqual(a, b) {
			continue
		}
		kc := KeyChange{Key: "headers." + k}
		if inBefore {
			kc.Old = json.RawMessage(Masked)
		}
		if inAfter {
			kc.New = json.RawMessage(Masked)
		}
		out = append(out, kc)
	}
	return out
}

func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// IntervalText is d as PostgreSQL reads an interval, exactly.
func IntervalText(d time.Duration) string {
	return strconv.FormatInt(d.Microseconds(), 10) + " microseconds"
}

// redactPassword is a URL (a JSON string) with its password as xxxxx; a
// template that does not parse as a URL is left as it is.
func redactPassword(v json.RawMessage) json.RawMessage {
	var s string
	if v == nil || json.Unmarshal(v, &s) != nil {
		return v
	}
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return v
	}
	if _, ok := u.User.Password(); !ok {
		return v
	}
	b, _ := json.Marshal(u.Redacted())
	return b
}
