package config

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// Match is a table endpoint an event is routed to by subscription, and
// why: the event_types pattern that matched, and whether the endpoint's
// filter narrowed it.
type Match struct {
	Endpoint string
	Pattern  string
	Filter   bool
}

// Why is the match as postbox records and shows it: the pattern, then
// "+ filter" when a filter had to hold too.
func (m Match) Why() string {
	if m.Filter {
		return m.Pattern + " + filter"
	}
	return m.Pattern
}

// subscription is what the index keeps of an enabled endpoint that
// subscribes: its filter, decoded once.
type subscription struct {
	name      string
	filter    any  // the decoded filter (a JSON object), when hasFilter
	hasFilter bool // a filter that does not decode matches nothing
	badFilter bool
}

// subIndex finds the subscribers of an event type without looking at the
// endpoints that do not subscribe to it: exact types in one map, "p.*"
// patterns in another by p, so a look-up costs one probe per dot of the
// type. A change to one endpoint touches its own entries only.
type subIndex struct {
	exact  map[string]map[string]*subscription // event type -> name -> sub
	prefix map[string]map[string]*subscription // p of "p.*" ("" for "*") -> name -> sub
}

func newSubIndex() subIndex {
	return subIndex{exact: map[string]map[string]*subscription{}, prefix: map[string]map[string]*subscription{}}
}

// pattern splits an event_types entry into its key and whether it is a
// prefix: "order.*" is every type below "order", "*" every type.
func pattern(p string) (key string, isPrefix bool) {
	if p == "*" {
		return "", true
	}
	if k, ok := strings.CutSuffix(p, ".*"); ok {
		return k, true
	}
	return p, false
}

func (ix *subIndex) add(te *TableEndpoint) {
	if !te.Enabled || len(te.EventTypes) == 0 {
		return
	}
	if ix.exact == nil {
		*ix = newSubIndex() // a table not made by NewEndpointTable
	}
	s := &subscription{name: te.Name}
	if te.Filter != nil {
		s.hasFilter = true
		v, err := decodeJSON(te.Filter)
		s.filter, s.badFilter = v, err != nil
	}
	for _, p := range te.EventTypes {
		k, isPrefix := pattern(p)
		m := ix.exact
		if isPrefix {
			m = ix.prefix
		}
		set := m[k]
		if set == nil {
			set = map[string]*subscription{}
			m[k] = set
		}
		set[te.Name] = s
	}
}

func (ix *subIndex) remove(te *TableEndpoint) {
	for _, p := range te.EventTypes {
		k, isPrefix := pattern(p)
		m := ix.exact
		if isPrefix {
			m = ix.prefix
		}
		if set := m[k]; set != nil {
			delete(set, te.Name)
			if len(set) == 0 {
				delete(m, k)
			}
		}
	}
}

// Subscribers are the enabled table endpoints an event of eventType with
// payload is routed to (see TableEndpoint.EventTypes), each once, sorted
// by name, with the first pattern that matched it: the exact type before
// the longest prefix. An endpoint with a filter matches only when payload
// contains it as PostgreSQL's jsonb @> decides; payload is decoded once,
// and only when a subscriber has a filter.
func (t *EndpointTable) Subscribers(eventType string, payload []byte) []Match {
	if t == nil || eventType == "" {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []Match
	var seen map[string]struct{}
	var doc any
	decoded, docErr := false, error(nil)
	consider := func(set map[string]*subscription, pat string) {
		for name, s := range set {
			if _, dup := seen[name]; dup {
				continue
			}
			if s.hasFilter {
				if s.badFilter {
					continue
				}
				if !decoded {
					doc, docErr = decodeJSON(payload)
					decoded = true
				}
				if docErr != nil || !containsTop(doc, s.filter) {
					continue
				}
			}
			if seen == nil {
				seen = map[string]struct{}{}
			}
			seen[name] = struct{}{}
			out = append(out, Match{Endpoint: name, Pattern: pat, Filter: s.hasFilter})
		}
	}
	consider(t.subs.exact[eventType], eventType)
	// Longest prefix first, so an endpoint subscribed twice shows the
	// narrower pattern.
	for i := len(eventType) - 1; i > 0; i-- {
		if eventType[i] == '.' {
			consider(t.subs.prefix[eventType[:i]], eventType[:i]+".*")
		}
	}
	consider(t.subs.prefix[""], "*")
	slices.SortFunc(out, func(a, b Match) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out
}

// decodeJSON decodes one JSON value, numbers kept as their text.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// containsTop is jsonb's a @> b at the top level, where an array may
// contain a bare scalar (['"a"'] @> '"a"'), but a scalar no array.
func containsTop(a, b any) bool {
	_, aArr := a.([]any)
	_, bArr := b.([]any)
	_, aObj := a.(map[string]any)
	_, bObj := b.(map[string]any)
	switch {
	case aObj != bObj:
		return false
	case aArr && !bArr && !bObj:
		return contains(a, []any{b})
	case !aArr && !aObj && bArr:
		return false
	case !aArr && !aObj:
		return scalarEqual(a, b)
	}
	return contains(a, b)
}

// contains is jsonb's a @> b below the top: an object contains an object
// whose every key it has with a value that contains the other's; an array
// contains an array each of whose elements equals one of its scalars or
// is contained by one of its containers of the same kind; scalars contain
// only an equal scalar.
func contains(a, b any) bool {
	switch bv := b.(type) {
	case map[string]any:
		av, ok := a.(map[string]any)
		if !ok {
			return false
		}
		for k, x := range bv {
			y, ok := av[k]
			if !ok || !contains(y, x) {
				return false
			}
		}
		return true
	case []any:
		av, ok := a.([]any)
		if !ok {
			return false
		}
		for _, x := range bv {
			found := false
			for _, y := range av {
				if contains(y, x) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	default:
		return scalarEqual(a, b)
	}
}

// scalarEqual compares two JSON scalars as jsonb does: numbers by value
// (1.0 = 1, -0 = 0), strings by their decoded text.
func scalarEqual(a, b any) bool {
	switch av := a.(type) {
	case json.Number:
		bv, ok := b.(json.Number)
		return ok && (av == bv || canonNumber(string(av)) == canonNumber(string(bv)))
	case string:
		bv, ok := b.(string)
		return ok && av == bv
	case bool:
		bv, ok := b.(bool)
		return ok && av == bv
	case nil:
		return b == nil
	}
	return false
}

// canonNumber writes a JSON number in one form per value: sign, digits
// without leading or trailing zeros, and the power of ten of the last
// ("0" for zero), so that numbers compare exactly, as numeric does,
// however large their exponent.
func canonNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		e := s[i+1:]
		sign := 1
		switch {
		case strings.HasPrefix(e, "-"):
			sign, e = -1, e[1:]
		case strings.HasPrefix(e, "+"):
			e = e[1:]
		}
		n := 0
		for _, c := range e {
			n = n*10 + int(c-'0')
			if n > 1<<30 {
				break // far beyond what numeric holds
			}
		}
		exp = sign * n
	}
	digits := mant
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		digits = mant[:i] + mant[i+1:]
		exp -= len(mant) - i - 1
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0"
	}
	for strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		exp++
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	b.WriteString(digits)
	b.WriteByte('e')
	b.WriteString(strconv.Itoa(exp))
	return b.String()
}
