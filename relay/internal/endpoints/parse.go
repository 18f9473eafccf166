// Package endpoints applies the rows of postbox.endpoints: it parses a
// row as PostgreSQL sends it (the stream, or a read of the applied copy)
// into the settings the configuration resolves (config.TableEndpoint).
package endpoints

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/relay/config"
)

// Row is one row of postbox.endpoints as PostgreSQL's text output of
// each column, by column name; a key missing or nil is NULL.
type Row map[string]*string

// types decodes the columns' text output; a pgtype.Map is safe for
// concurrent Scan once built.
var types = pgtype.NewMap()

// Parse reads row into a table endpoint. A value that does not parse
// makes it invalid, naming its column; the columns the table constrains
// (checked by PostgreSQL) are parsed all the same, as the applied copy
// may come from an older schema.
func Parse(row Row) config.TableEndpoint {
	p := parser{row: row}
	te := config.TableEndpoint{Enabled: true, SecretVersion: 1}
	te.Name = p.text("name")
	s := &te.Settings
	s.URL, s.Method, s.Body = p.textp("url"), p.textp("method"), p.textp("body")
	s.Timeout, s.BackoffBase, s.BackoffCap = p.interval("timeout"), p.interval("backoff_base"), p.interval("backoff_cap")
	s.Cooldown, s.MaxCooldown = p.interval("cooldown"), p.interval("max_cooldown")
	s.MaxAttempts, s.FailureThreshold, s.MaxInFlight = p.intp("max_attempts"), p.intp("failure_threshold"), p.intp("max_in_flight")
	if v := p.textp("rate_limit"); v != nil {
		r, err := config.ParseRate(*v)
		p.fail("rate_limit", err)
		s.RateLimit = &r
	}
	if v := p.value("headers"); v != nil {
		var h map[string]string
		p.fail("headers", json.Unmarshal([]byte(*v), &h))
		s.Headers = h
	}
	if v := p.value("success"); v != nil {
		var sc config.Success
		p.fail("success", yamlStrict(*v, &sc))
		s.Success = &sc
	}
	if v := p.value("redact_path"); v != nil {
		var rp config.RedactPath
		p.fail("redact_path", yamlStrict(*v, &rp))
		s.RedactPath = &rp
	}
	s.RetryOn = p.ints("retry_on")
	s.Ordered, s.AllowRowURL = p.boolp("ordered"), p.boolp("allow_row_url")
	s.RowURLHosts = p.texts("row_url_hosts")
	if b := p.boolp("enabled"); b != nil {
		te.Enabled = *b
	}
	te.EventTypes = p.texts("event_types")
	if v := p.value("filter"); v != nil {
		var f map[string]any
		p.fail("filter", json.Unmarshal([]byte(*v), &f))
		te.Filter = []byte(*v)
	}
	te.Secret = p.text("secret")
	if v := p.intp("secret_version"); v != nil {
		te.SecretVersion = *v
	}
	if v := p.value("previous_secret_until"); v != nil {
		var t pgtype.Timestamptz
		p.fail("previous_secret_until", types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, []byte(*v), &t))
		te.PreviousSecretUntil = t.Time
	}
	if v := p.value("revision"); v != nil {
		n, err := strconv.ParseInt(*v, 10, 64)
		p.fail("revision", err)
		te.Revision = n
	}
	te.Invalid = p.invalid
	return te
}

// parser reads a row's columns, keeping the first error as the row's
// reason to be invalid.
type parser struct {
	row     Row
	invalid string
}

func (p *parser) fail(col string, err error) {
	if err != nil && p.invalid == "" {
		p.invalid = col + ": " + err.Error()
	}
}

func (p *parser) value(col string) *string { return p.row[col] }

func (p *parser) text(col string) string {
	if v := p.row[col]; v != nil {
		return *v
	}
	return ""
}

func (p *parser) textp(col string) *string {
	if v := p.row[col]; v != nil {
		s := *v
		return &s
	}
	return nil
}

func (p *parser) intp(col string) *int {
	v := p.row[col]
	if v == nil {
		return nil
	}
	n, err := strconv.Atoi(*v)
	p.fail(col, err)
	return &n
}

func (p *parser) boolp(col string) *bool {
	v := p.row[col]
	if v == nil {
		return nil
	}
	var b bool
	switch *v {
	case "t", "true":
		b = true
	case "f", "false":
	default:
		p.fail(col, fmt.Errorf("%q is not a boolean", *v))
	}
	return &b
}

// interval reads an interval column as a duration: months have no fixed
// length, so an interval with any is refused; a day is 24 hours.
func (p *parser) interval(col string) *config.Duration {
	v := p.row[col]
	if v == nil {
		return nil
	}
	var iv pgtype.Interval
	if err := types.Scan(pgtype.IntervalOID, pgtype.TextFormatCode, []byte(*v), &iv); err != nil {
		p.fail(col, err)
		return nil
	}
	if iv.Months != 0 {
		p.fail(col, fmt.Errorf("%q has months, which have no fixed length", *v))
		return nil
	}
	d := config.Duration(time.Duration(iv.Days)*24*time.Hour + time.Duration(iv.Microseconds)*time.Microsecond)
	return &d
}

func (p *parser) ints(col string) []int {
	v := p.row[col]
	if v == nil {
		return nil
	}
	var a []int32
	if err := types.Scan(pgtype.Int4ArrayOID, pgtype.TextFormatCode, []byte(*v), &a); err != nil {
		p.fail(col, err)
		return nil
	}
	out := make([]int, len(a))
	for i, n := range a {
		out[i] = int(n)
	}
	return out
}

func (p *parser) texts(col string) []string {
	v := p.row[col]
	if v == nil {
		return nil
	}
	var a []string
	p.fail(col, types.Scan(pgtype.TextArrayOID, pgtype.TextFormatCode, []byte(*v), &a))
	return a
}

// yamlStrict decodes a JSON value (YAML's subset) into v by v's own YAML
// rules, refusing unknown keys, as the configuration file does.
func yamlStrict(src string, v any) error {
	d := yaml.NewDecoder(bytes.NewReader([]byte(src)))
	d.KnownFields(true)
	return d.Decode(v)
}
