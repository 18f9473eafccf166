package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
)

// The endpoint form: one field per column of postbox.endpoints, written
// as PostgreSQL reads the column's type (an empty field is NULL: the
// defaults apply), lists comma-separated, headers one "Name: value" a
// line.
//
// Header values may be credentials: the console never shows them. The
// form shows each stored header as "Name: ***", and a line left as
// "Name: ***" keeps the stored value; a new value replaces it.

// fieldKind is how a field is entered and cast.
type fieldKind int

const (
	kindText     fieldKind = iota // text
	kindTextarea                  // text, several lines
	kindInterval                  // interval
	kindInt                       // integer
	kindBool                      // boolean: the defaults', yes, no
	kindList                      // text[], comma-separated
	kindIntList                   // integer[], comma-separated
	kindJSON                      // jsonb
	kindHeaders                   // jsonb object, "Name: value" lines
	kindTime                      // timestamptz
)

// formField is one column of the form.
type formField struct {
	Col, Label, Help string
	Kind             fieldKind
	// Group starts a new part of the form under this heading.
	Group string
}

// cast is the SQL cast of the field's parameter to its column's type.
func (f formField) cast() string {
	switch f.Kind {
	case kindInterval:
		return "::text::interval"
	case kindInt:
		return "::text::integer"
	case kindBool:
		return "::text::boolean"
	case kindList:
		return "::text[]"
	case kindIntList:
		return "::text[]::integer[]"
	case kindJSON, kindHeaders:
		return "::text::jsonb"
	case kindTime:
		return "::text::timestamptz"
	}
	return "::text"
}

// plain says, in plain words, what a value of the field must look like.
func (f formField) plain() string {
	switch f.Kind {
	case kindInterval:
		return "is not a duration: write, for example, 5s, 2 minutes or 1h30m"
	case kindInt:
		return "is not a whole number"
	case kindIntList:
		return "is not a list of whole numbers: write, for example, 409, 503"
	case kindJSON:
		return "is not valid JSON"
	case kindTime:
		return "is not a time: write, for example, 2026-12-08 10:00:00+00"
	}
	return "is not valid"
}

// formFields are the form's columns in order (name and enabled apart).
var formFields = []formField{
	{Col: "url", Label: "URL", Kind: kindText, Group: "Request", Help: "https://… — a template: {payload.key}, {event_id}, … as in the configuration file"},
	{Col: "method", Label: "Method", Kind: kindText, Help: "GET, POST, PUT or PATCH"},
	{Col: "body", Label: "Body", Kind: kindTextarea, Help: "a body template; empty: the payload"},
	{Col: "headers", Label: "Headers", Kind: kindHeaders, Help: "one Name: value a line; values are never shown: leave *** to keep one"},
	{Col: "event_types", Label: "Event types", Kind: kindList, Group: "Subscription", Help: "exact names or prefix.*, comma-separated"},
	{Col: "filter", Label: "Filter", Kind: kindJSON, Help: `JSON the payload must contain, e.g. {"brand": "casino-de"}`},
	{Col: "timeout", Label: "Timeout", Kind: kindInterval, Group: "Delivery", Help: "e.g. 10s"},
	{Col: "max_attempts", Label: "Max attempts", Kind: kindInt},
	{Col: "backoff_base", Label: "Backoff base", Kind: kindInterval},
	{Col: "backoff_cap", Label: "Backoff cap", Kind: kindInterval},
	{Col: "retry_on", Label: "Retry on", Kind: kindIntList, Help: "status codes, comma-separated"},
	{Col: "success", Label: "Success", Kind: kindJSON, Help: `e.g. {"status": [200, 204], "body_contains": "OK"}`},
	{Col: "rate_limit", Label: "Rate limit", Kind: kindText, Help: "e.g. 50/s"},
	{Col: "max_in_flight", Label: "Max in flight", Kind: kindInt},
	{Col: "failure_threshold", Label: "Failure threshold", Kind: kindInt, Group: "Breaker"},
	{Col: "cooldown", Label: "Cooldown", Kind: kindInterval},
	{Col: "max_cooldown", Label: "Max cooldown", Kind: kindInterval},
	{Col: "ordered", Label: "Ordered", Kind: kindBool, Group: "Rows"},
	{Col: "allow_row_url", Label: "Allow row URL", Kind: kindBool},
	{Col: "row_url_hosts", Label: "Row URL hosts", Kind: kindList, Help: "hosts a row's url may name, comma-separated"},
	{Col: "redact_path", Label: "Redact path", Kind: kindJSON, Help: "true, or the path segments to record as ***, e.g. [2]"},
	{Col: "secret", Label: "Secret", Kind: kindText, Group: "Signing", Help: "the name of a secret under signing.named; empty: the endpoint's derived secret"},
	{Col: "secret_version", Label: "Secret version", Kind: kindInt, Help: "bump to rotate the derived secret"},
	{Col: "previous_secret_until", Label: "Previous secret until", Kind: kindTime, Help: "the previous version signs too until then"},
}

// fieldView is a field as the form shows it.
type fieldView struct {
	formField
	Value, Error string
	Textarea     bool
	Bool         bool
}

// endpointForm is the form as shown: for a new endpoint or a row's edit.
type endpointForm struct {
	New      bool
	Name     string
	Enabled  bool
	Revision string
	Fields   []fieldView
	// NameError and Error are errors of the name and of the whole form.
	NameError, Error string
	// Actor is how the change log names this session.
	Actor string
}

// hasErrors reports whether the form has any error to show.
func (f *endpointForm) hasErrors() bool {
	if f.NameError != "" || f.Error != "" {
		return true
	}
	for _, fv := range f.Fields {
		if fv.Error != "" {
			return true
		}
	}
	return false
}

// field is the field of column col, nil when the form has none.
func (f *endpointForm) field(col string) *fieldView {
	for i := range f.Fields {
		if f.Fields[i].Col == col {
			return &f.Fields[i]
		}
	}
	return nil
}

// setError puts msg next to the field col names (the form's top when none
// does).
func (f *endpointForm) setError(col, msg string) {
	if col == "name" {
		f.NameError = msg
		return
	}
	if fv := f.field(col); fv != nil {
		if fv.Error == "" {
			fv.Error = msg
		}
		return
	}
	if f.Error == "" {
		f.Error = msg
	}
}

// formFromRow is a row's form: each column's text output as the field
// shows it (lists comma-separated, headers' values as ***).
func formFromRow(row endpoints.Row) *endpointForm {
	f := &endpointForm{Name: val(row, "name"), Enabled: val(row, "enabled") != "f", Revision: val(row, "revision")}
	for _, ff := range formFields {
		fv := fieldView{formField: ff, Value: val(row, ff.Col)}
		switch ff.Kind {
		case kindList, kindIntList:
			var a []string
			if fv.Value != "" && types.Scan(pgtype.TextArrayOID, pgtype.TextFormatCode, []byte(fv.Value), &a) == nil {
				fv.Value = strings.Join(a, ", ")
			}
		case kindHeaders:
			fv.Value = maskedHeaders(fv.Value)
		case kindBool:
			fv.Value = map[string]string{"t": "true", "f": "false"}[fv.Value]
		}
		f.Fields = append(f.Fields, fv.withKind())
	}
	return f
}

func (fv fieldView) withKind() fieldView {
	fv.Textarea = fv.Kind == kindTextarea || fv.Kind == kindHeaders
	fv.Bool = fv.Kind == kindBool
	return fv
}

var types = pgtype.NewMap()

func val(row endpoints.Row, col string) string {
	if v := row[col]; v != nil {
		return *v
	}
	return ""
}

// maskedHeaders is a headers column as "Name: ***" lines, by name (of
// any JSON object: a row written by SQL may hold a value that is not a
// string, which makes it invalid, and keeps it until it is changed).
func maskedHeaders(js string) string {
	var h map[string]json.RawMessage
	if js == "" || json.Unmarshal([]byte(js), &h) != nil {
		return ""
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		b.WriteString(k + ": " + masked + "\n")
	}
	return b.String()
}

// masked stands for a header's value.
const masked = "***"

// formFromRequest reads the posted form.
func formFromRequest(r *http.Request, isNew bool) *endpointForm {
	f := &endpointForm{New: isNew, Name: strings.TrimSpace(r.PostFormValue("name")),
		Enabled: r.PostFormValue("enabled") != "false", Revision: r.PostFormValue("revision")}
	for _, ff := range formFields {
		// Browsers send a textarea's lines ended by CRLF.
		v := strings.ReplaceAll(r.PostFormValue(ff.Col), "\r\n", "\n")
		if ff.Kind != kindTextarea {
			v = strings.TrimSpace(v)
		}
		f.Fields = append(f.Fields, fieldView{formField: ff, Value: v}.withKind())
	}
	return f
}

// submission is a validated form: the parameters to write.
type submission struct {
	params []any // per formFields: nil (NULL), string or []string
}

// validate judges the form as the relay will judge the row: each value
// cast by PostgreSQL to its column's type and read back as its text
// output, the row parsed (endpoints.Parse) and resolved against the
// configuration in force, as the only table endpoint of a scratch table.
// stored is the row being edited (its headers' values, for the lines
// left as ***), nil for a new one. Errors go on the form.
func validate(ctx context.Context, q pgxQuerier, cfg *config.Config, f *endpointForm, stored endpoints.Row) (*submission, error) {
	if f.Name == "" {
		f.setError("name", "An endpoint needs a name.")
	} else if _, ok := cfg.Endpoints[f.Name]; ok && f.New {
		f.setError("name", "The configuration file defines an endpoint of this name: the file's settings would be used, not this row's. Choose another name.")
	}
	s := &submission{params: make([]any, len(formFields))}
	row := endpoints.Row{"name": &f.Name}
	enabled := "f"
	if f.Enabled {
		enabled = "t"
	}
	row["enabled"] = &enabled
	for i := range f.Fields {
		fv := &f.Fields[i]
		var p any
		switch fv.Kind {
		case kindText, kindTextarea, kindInterval, kindInt, kindJSON, kindTime:
			if strings.TrimSpace(fv.Value) != "" {
				p = fv.Value
			}
		case kindBool:
			switch fv.Value {
			case "true", "false":
				p = fv.Value
			case "":
			default:
				fv.Error = "Choose yes, no, or the defaults'."
			}
		case kindList, kindIntList:
			var items []string
			for _, it := range strings.FieldsFunc(fv.Value, func(r rune) bool { return r == ',' || r == '\n' }) {
				if it = strings.TrimSpace(it); it != "" {
					items = append(items, it)
				}
			}
			if items != nil {
				p = items
			}
		case kindHeaders:
			js, problem := headersJSON(fv.Value, stored)
			if problem != "" {
				fv.Error = problem
				continue
			}
			if js != "" {
				p = js
			}
		}
		s.params[i] = p
		if p == nil || fv.Error != "" {
			continue
		}
		if fv.Kind == kindText || fv.Kind == kindTextarea {
			text := p.(string)
			row[fv.Col] = &text
			continue
		}
		// The column's text output, as the relay will read it.
		var text string
		err := q.QueryRow(ctx, "SELECT ($1"+fv.cast()+")::text", p).Scan(&text)
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe):
			fv.Error = "This " + fv.plain() + "."
			continue
		case err != nil:
			return nil, fmt.Errorf("check %s: %w", fv.Col, err)
		}
		row[fv.Col] = &text
	}
	if f.hasErrors() {
		return nil, nil
	}
	if held := resolveScratch(cfg, endpoints.Parse(row)).Held(); strings.HasPrefix(held, "invalid: ") {
		// The reason begins with its column: next to that field the rest
		// says it; elsewhere (no field of that name) the whole of it.
		reason := strings.TrimPrefix(held, "invalid: ")
		col, rest, _ := strings.Cut(reason, ": ")
		if f.field(col) == nil {
			col, rest = "", reason
		}
		f.setError(col, sentence(rest))
		return nil, nil
	}
	return s, nil
}

// sentence capitalises a reason and ends it with a full stop.
func sentence(s string) string {
	if s == "" {
		return s
	}
	s = strings.ToUpper(s[:1]) + s[1:]
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}

// headersJSON reads "Name: value" lines into a JSON object; a value left
// as *** keeps the stored one. problem is what is wrong with the lines,
// in a sentence for the form.
func headersJSON(text string, stored endpoints.Row) (js, problem string) {
	var old map[string]json.RawMessage
	if v := stored["headers"]; v != nil {
		_ = json.Unmarshal([]byte(*v), &old)
	}
	h := map[string]json.RawMessage{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return "", fmt.Sprintf("Line %d: write a header as Name: value.", i+1)
		}
		if v == masked {
			ov, ok := old[k]
			if !ok {
				return "", fmt.Sprintf("Line %d: %s has no stored value to keep: write its value.", i+1, k)
			}
			h[k] = ov
			continue
		}
		h[k], _ = json.Marshal(v) // a string always marshals
	}
	if len(h) == 0 {
		return "", ""
	}
	b, _ := json.Marshal(h) // of valid JSON values: always marshals
	return string(b), ""
}

type pgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// writeEndpoint inserts (f.New) or updates the row in one transaction
// that names actor in the change log. A constraint that refuses the row
// puts its error on the form (and returns nil); errStale says the row
// changed since the form was read.
func writeEndpoint(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, f *endpointForm, s *submission, actor string) error {
	args := []any{f.Name, f.Enabled}
	sql := endpointInsertSQL
	if !f.New {
		args[1], sql = f.Revision, endpointUpdateSQL
	}
	args = append(args, s.params...)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, endpointActorSQL, actor); err != nil {
			return err
		}
		var rev int64
		err := tx.QueryRow(ctx, sql, args...).Scan(&rev)
		if errors.Is(err, pgx.ErrNoRows) {
			return errStale
		}
		return err
	})
	if col, pe := constraintColumn(err); pe != nil {
		f.setError(col, constraintText(col, pe))
		return nil
	}
	return err
}

// constraintText is a constraint's refusal in plain words.
func constraintText(col string, pe *pgconn.PgError) string {
	switch {
	case pe.Code == "23505":
		return "An endpoint of this name exists already."
	case col == "name":
		return "A name is 1 to 200 bytes long."
	case col == "method":
		return "The method must be GET, POST, PUT or PATCH."
	case col == "headers" || col == "success" || col == "filter":
		return "This must be a JSON object."
	case col == "redact_path":
		return "This must be true, false or a list of path segments."
	}
	for _, f := range formFields {
		if f.Col == col {
			switch f.Kind {
			case kindInterval:
				return "This must be longer than zero."
			case kindInt:
				return "This must be at least 1."
			}
		}
	}
	return "PostgreSQL refused this value (" + pe.ConstraintName + ")."
}
