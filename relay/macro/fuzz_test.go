package macro

import (
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// literal is t with every macro left out: what the template's author
// wrote around them.
func (t Template) literal() string {
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.lit)
	}
	return b.String()
}

// withMacrosAs is t with every macro replaced by s.
func (t Template) withMacrosAs(s string) string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.macro != nil {
			b.WriteString(s)
		}
		b.WriteString(p.lit)
	}
	return b.String()
}

// query is the query of a URL as written: from the first "?" to the
// fragment ("" when there is none).
func query(u string) string {
	q := strings.IndexByte(u, '?')
	if q < 0 {
		return ""
	}
	if h := strings.IndexByte(u, '#'); h >= 0 && h < q {
		return ""
	}
	u = u[q+1:]
	if h := strings.IndexByte(u, '#'); h >= 0 {
		u = u[:h]
	}
	return u
}

// FuzzTemplate parses a fuzzed template as a URL or a body and expands it
// with a fuzzed payload and event fields. Expansion fails only with
// ErrTemplate; an expanded URL keeps the scheme and host its template
// wrote and every separator ("?", "#", and in the query "&" and "=") is
// the template's own, never a value's; in a body, a value cannot leave
// the JSON string or form value it stands in.
func FuzzTemplate(f *testing.F) {
	f.Fuzz(func(t *testing.T, tpl string, isURL bool, payload, field string) {
		v := Values{EventID: field, EventType: field, Endpoint: field,
			CreatedAt: time.Date(2026, 3, 1, 12, 34, 56, 0, time.UTC), Payload: []byte(payload)}
		tp, err := Parse(tpl, isURL)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		if isURL {
			checkURL(t, tp, v)
		} else {
			checkBody(t, tpl, v)
		}
	})
}

func checkURL(t *testing.T, tp Template, v Values) {
	got, err := tp.ExpandURL(v)
	if err != nil {
		require.True(t, errors.Is(err, ErrTemplate), "error %v is a template error", err)
		return
	}
	lit := tp.literal()
	for _, sep := range "?#" {
		require.Equal(t, strings.Count(lit, string(sep)), strings.Count(got, string(sep)),
			"%q: only the template writes %q", got, sep)
	}
	for _, sep := range "&=" {
		require.Equal(t, strings.Count(query(lit), string(sep)), strings.Count(query(got), string(sep)),
			"%q: in the query, only the template writes %q", got, sep)
	}
	ref, err := url.Parse(tp.withMacrosAs("x"))
	if err != nil || ref.Scheme == "" || ref.Host == "" {
		return // not an absolute URL even as written
	}
	u, err := url.Parse(got)
	require.NoError(t, err, "%q expands %q", got, tp.raw)
	require.Equal(t, ref.Scheme, u.Scheme, "%q expands %q", got, tp.raw)
	require.Equal(t, ref.Host, u.Host, "%q expands %q", got, tp.raw)
}

func checkBody(t *testing.T, tpl string, v Values) {
	tp, _ := Parse(tpl, false)
	if _, err := tp.ExpandBody(v, func(s string) string { return s }); err != nil {
		require.True(t, errors.Is(err, ErrTemplate), "error %v is a template error", err)
	}

	// In a JSON string: a value never closes the string, whatever it holds.
	if lit := tp.literal(); utf8.ValidString(lit) && !strings.ContainsAny(lit, "\"\\") && !hasControl(lit) {
		doc, err := Parse(`{"v": "`+tpl+`"}`, false)
		if err != nil {
			// A brace the template left open can take the wrapper's
			// closing quote and brace into a macro ({payload|"}).
			require.Contains(t, lit, "{", "%q parses alone but not in a JSON string", tpl)
			return
		}
		// (Unless a brace the template left open takes the closing quote
		// into a macro's default.)
		if got, err := doc.ExpandBody(v, JSONEscape); err == nil && doc.literal() == `{"v": "`+lit+`"}` {
			var out map[string]string
			require.NoError(t, json.Unmarshal([]byte(got), &out), "%s", got)
			require.Len(t, out, 1, "%s", got)
		}
	}

	// In a form value: a value never adds a field.
	if lit := tp.literal(); !strings.ContainsAny(lit, "&=%;") {
		form, err := Parse("v="+tpl+"&w=2", false)
		require.NoError(t, err)
		if got, err := form.ExpandBody(v, url.QueryEscape); err == nil && form.literal() == "v="+lit+"&w=2" {
			q, err := url.ParseQuery(got)
			require.NoError(t, err, "%s", got)
			require.Len(t, q, 2, "%s", got)
			require.Equal(t, []string{"2"}, q["w"], "%s", got)
		}
	}
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 }) >= 0
}
