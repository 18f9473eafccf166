// Package macro is the template dialect of endpoint URLs and bodies (and
// of rows' URLs): parsing, which the configuration uses to validate what
// was written, and expansion, which the relay uses for each event. It
// imports nothing of postbox, so that the configuration can stay data.
package macro

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// A Template is a URL or body with macros, the postback dialect of
// affiliate networks:
//
//	https://track.example/pb?click_id={payload.click_id}&payout={payload.payout}&sub1={payload.sub1|}
//
// Macros are {event_id}, {event_type}, {endpoint}, {created_at} (RFC 3339,
// UTC) and {payload.<path>}, a path of object keys and array indexes
// ({payload.items.0.sku}). {macro|default} gives a default ({payload.sub1|}
// is empty when missing); without one, a missing value is an error. In a
// URL, values are escaped for where they stand: a path segment (a "/" in
// the value stays inside the segment) or a query value ("&", "=", spaces,
// unicode).
type Template struct {
	raw   string
	parts []part
}

type part struct {
	lit   string
	macro *macro
	where position // for URLs: where the macro stands
	// inString: in a body, the macro stands inside a JSON string's quotes.
	inString bool
}

type macro struct {
	text string // as written, for errors
	name string // event_id, event_type, endpoint, created_at, payload
	path []string
	def  *string
}

type position int

const (
	inPath position = iota
	inQuery
	inFragment
)

// ErrTemplate marks a template that cannot be expanded for an event.
var ErrTemplate = errors.New("template_error")

var macroNames = map[string]bool{"event_id": true, "event_type": true, "endpoint": true, "created_at": true, "payload": true}

// Parse parses s. For a URL template (isURL), macros may not stand
// in the scheme or host.
func Parse(s string, isURL bool) (Template, error) {
	t := Template{raw: s}
	var lit strings.Builder
	where := inPath
	hostEnd := -1
	inString, escaped := false, false // in a body: within a JSON string, after a backslash
	if isURL {
		if i := strings.Index(s, "://"); i >= 0 {
			hostEnd = i + 3
			if j := strings.IndexAny(s[hostEnd:], "/?#"); j >= 0 {
				hostEnd += j
			} else {
				hostEnd = len(s)
			}
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				if !isURL {
					break // a literal brace in a body (JSON)
				}
				return t, fmt.Errorf("unclosed { at position %d", i)
			}
			candidate := s[i : i+end+1]
			if !isURL && !looksLikeMacro(candidate) {
				break // a literal brace in a body (JSON)
			}
			if isURL && i < hostEnd {
				return t, errors.New("macros may not stand in the scheme or host")
			}
			m, err := parseMacro(candidate)
			if err != nil {
				return t, err
			}
			if lit.Len() > 0 {
				t.parts = append(t.parts, part{lit: lit.String()})
				lit.Reset()
			}
			t.parts = append(t.parts, part{macro: m, where: where, inString: inString})
			i += end
			escaped = false
			continue
		case c == '}' && isURL:
			return t, fmt.Errorf("unopened } at position %d", i)
		case isURL && c == '?' && where == inPath:
			where = inQuery
		case isURL && c == '#':
			where = inFragment
		case !isURL && c == '"' && !escaped:
			inString = !inString
		}
		escaped = !isURL && c == '\\' && !escaped
		lit.WriteByte(c)
	}
	if lit.Len() > 0 {
		t.parts = append(t.parts, part{lit: lit.String()})
	}
	return t, nil
}

// looksLikeMacro tells a macro from a JSON brace in a body template: a
// known macro name right after the brace, no nested brace or quote.
func looksLikeMacro(text string) bool {
	name, _, _ := strings.Cut(text[1:len(text)-1], "|")
	if strings.ContainsAny(name, "{\" ") {
		return false
	}
	name, _, _ = strings.Cut(name, ".")
	return macroNames[name]
}

func parseMacro(text string) (*macro, error) {
	body := text[1 : len(text)-1]
	m := &macro{text: text}
	if name, def, ok := strings.Cut(body, "|"); ok {
		body, m.def = name, &def
	}
	name, path, _ := strings.Cut(body, ".")
	if !macroNames[name] {
		return nil, fmt.Errorf("unknown macro %s (known: {event_id}, {event_type}, {endpoint}, {created_at}, {payload.<path>})", text)
	}
	if name == "payload" {
		if path == "" {
			return nil, fmt.Errorf("macro %s needs a path: {payload.<key>}", text)
		}
		m.path = strings.Split(path, ".")
	} else if path != "" {
		return nil, fmt.Errorf("macro %s takes no path", text)
	}
	m.name = name
	return m, nil
}

// Contains reports whether s contains a macro.
func Contains(s string) bool { return strings.ContainsRune(s, '{') }

// Values are what macros expand to for one event.
type Values struct {
	EventID   string
	EventType string
	Endpoint  string
	CreatedAt time.Time
	Payload   []byte // JSON
}

// ExpandURL expands a URL template, escaping each value for its position.
// A path segment's value may not be "." or "..": the request would go
// elsewhere on the partner's host than the template says.
func (t Template) ExpandURL(v Values) (string, error) {
	var dots, dotsVal string
	out, err := t.expand(v, func(p part, s string) string {
		switch p.where {
		case inQuery:
			return url.QueryEscape(s)
		case inFragment:
			return url.PathEscape(s)
		}
		if s == "." || s == ".." {
			dots, dotsVal = p.macro.text, s
		}
		return url.PathEscape(s)
	})
	if err == nil && dots != "" {
		return "", fmt.Errorf("%w: %s is %q, which may not stand in the path", ErrTemplate, dots, dotsVal)
	}
	return out, err
}

// ExpandJSON expands a JSON body template: a value inside a JSON string's
// quotes is escaped as string contents; one outside them is inserted as a
// JSON number, true, false or null when it is one, and as a JSON string,
// quoted whole, otherwise, so no value can add keys to the document.
func (t Template) ExpandJSON(v Values) (string, error) {
	return t.expand(v, func(p part, s string) string {
		if p.inString {
			return JSONEscape(s)
		}
		return jsonValue(s)
	})
}

var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// jsonValue is s as one JSON value: itself when a number or a literal, a
// quoted string otherwise.
func jsonValue(s string) string {
	if s == "true" || s == "false" || s == "null" || jsonNumber.MatchString(s) {
		return s
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// ExpandBody expands a body template: values are escaped as JSON string
// contents (json) or as form values (form), or inserted as they are.
func (t Template) ExpandBody(v Values, escape func(string) string) (string, error) {
	return t.expand(v, func(_ part, s string) string { return escape(s) })
}

// JSONEscape escapes s for use inside a JSON string (without the quotes).
func JSONEscape(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

func (t Template) expand(v Values, escape func(part, string) string) (string, error) {
	var payload any
	var decoded bool
	var out strings.Builder
	for _, p := range t.parts {
		if p.macro == nil {
			out.WriteString(p.lit)
			continue
		}
		m := p.macro
		var val string
		ok := true
		switch m.name {
		case "event_id":
			val = v.EventID
		case "event_type":
			val, ok = v.EventType, v.EventType != ""
		case "endpoint":
			val = v.Endpoint
		case "created_at":
			val, ok = v.CreatedAt.UTC().Format(time.RFC3339), !v.CreatedAt.IsZero()
		case "payload":
			if !decoded {
				dec := json.NewDecoder(bytes.NewReader(v.Payload))
				dec.UseNumber()
				if err := dec.Decode(&payload); err != nil {
					return "", fmt.Errorf("%w: the payload is not JSON", ErrTemplate)
				}
				decoded = true
			}
			var err error
			val, ok, err = lookup(payload, m.path)
			if err != nil {
				return "", fmt.Errorf("%w: %s %v", ErrTemplate, m.text, err)
			}
		}
		if !ok {
			if m.def == nil {
				return "", fmt.Errorf("%w: %s has no value (give it a default: {%s|…})", ErrTemplate, m.text, strings.Trim(m.text, "{}"))
			}
			val = *m.def
		}
		out.WriteString(escape(p, val))
	}
	return out.String(), nil
}

// lookup follows path through decoded JSON; a missing key, an index out
// of range or a null is "no value".
func lookup(v any, path []string) (string, bool, error) {
	for _, key := range path {
		switch node := v.(type) {
		case map[string]any:
			next, ok := node[key]
			if !ok {
				return "", false, nil
			}
			v = next
		case []any:
			i, err := strconv.Atoi(key)
			if err != nil {
				return "", false, fmt.Errorf("indexes an array with %q", key)
			}
			if i < 0 || i >= len(node) {
				return "", false, nil
			}
			v = node[i]
		default:
			return "", false, nil
		}
	}
	switch val := v.(type) {
	case nil:
		return "", false, nil
	case string:
		return val, true, nil
	case json.Number:
		return val.String(), true, nil
	case bool:
		return strconv.FormatBool(val), true, nil
	}
	return "", false, errors.New("is an object or array, not a value")
}
