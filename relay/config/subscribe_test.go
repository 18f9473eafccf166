package config_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func names(ms []config.Match) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Endpoint + " " + m.Why()
	}
	return out
}

// TestSubscribersMatchExactPrefixAndFilter: exact types, "p.*" below p
// only, "*" everything, a filter by containment, disabled endpoints
// never; each endpoint once, with its narrowest pattern.
func TestSubscribersMatchExactPrefixAndFilter(t *testing.T) {
	t.Parallel()
	tab := config.NewEndpointTable()
	tab.Apply(config.TableEndpoint{Name: "exact", Enabled: true, EventTypes: []string{"order.paid"}})
	tab.Apply(config.TableEndpoint{Name: "orders", Enabled: true, EventTypes: []string{"order.*"}})
	tab.Apply(config.TableEndpoint{Name: "both", Enabled: true, EventTypes: []string{"order.*", "order.paid"}})
	tab.Apply(config.TableEndpoint{Name: "deep", Enabled: true, EventTypes: []string{"order.paid.*"}})
	tab.Apply(config.TableEndpoint{Name: "all", Enabled: true, EventTypes: []string{"*"}})
	tab.Apply(config.TableEndpoint{Name: "casino", Enabled: true, EventTypes: []string{"order.*"}, Filter: []byte(`{"brand": "casino-de"}`)})
	tab.Apply(config.TableEndpoint{Name: "off", Enabled: false, EventTypes: []string{"order.paid"}})
	tab.Apply(config.TableEndpoint{Name: "none", Enabled: true})

	require.Equal(t, []string{"all *", "both order.paid", "exact order.paid", "orders order.*"},
		names(tab.Subscribers("order.paid", []byte(`{"brand": "casino-fr"}`))))
	require.Equal(t, []string{"all *", "both order.paid", "casino order.* + filter", "exact order.paid", "orders order.*"},
		names(tab.Subscribers("order.paid", []byte(`{"brand": "casino-de", "amount": 5}`))))
	require.Equal(t, []string{"all *", "both order.*", "deep order.paid.*", "orders order.*"},
		names(tab.Subscribers("order.paid.twice", []byte(`[]`))))
	require.Equal(t, []string{"all *"}, names(tab.Subscribers("order", []byte(`{}`))), "order.* is below order, not order")
	require.Equal(t, []string{"all *"}, names(tab.Subscribers("orders.paid", []byte(`{}`))))
	require.Empty(t, tab.Subscribers("", []byte(`{}`)))
	require.Equal(t, []string{"all *", "both order.*", "orders order.*"},
		names(tab.Subscribers("order.x", []byte(`not json`))), "a payload that does not decode passes no filter")

	// One endpoint changed, disabled, removed: only its own entries move.
	tab.Apply(config.TableEndpoint{Name: "exact", Enabled: true, EventTypes: []string{"user.*"}, Revision: 2})
	tab.Apply(config.TableEndpoint{Name: "orders", Enabled: false, EventTypes: []string{"order.*"}, Revision: 2})
	tab.Remove("all", 1)
	tab.Apply(config.TableEndpoint{Name: "both", Enabled: true, EventTypes: []string{"user.made"}, Revision: 0})
	tab.Apply(config.TableEndpoint{Name: "both", Enabled: true, EventTypes: []string{"user.made"}, Revision: 3})
	tab.Apply(config.TableEndpoint{Name: "both", Enabled: true, EventTypes: []string{"order.paid"}, Revision: 2})
	require.Equal(t, []string{"both user.made", "exact user.*"}, names(tab.Subscribers("user.made", nil)))
	require.Empty(t, tab.Subscribers("order.paid", []byte(`{"brand": "casino-fr"}`)))

	tab.Replace([]config.TableEndpoint{{Name: "r", Enabled: true, EventTypes: []string{"a.*"}}})
	require.Equal(t, []string{"r a.*"}, names(tab.Subscribers("a.b", nil)))
	require.Empty(t, tab.Subscribers("user.made", nil))
}

// containsCases are jsonb containment's corners, each held against
// PostgreSQL's own @> below.
var containsCases = [][2]string{
	{`{"a":1,"b":2}`, `{"a":1}`}, {`{"a":1}`, `{"a":1,"b":2}`}, {`{"a":1}`, `{}`}, {`{}`, `{}`},
	{`{"a":1.0}`, `{"a":1}`}, {`{"a":-0}`, `{"a":0}`}, {`{"a":1e2}`, `{"a":100}`}, {`{"a":0.10}`, `{"a":1E-1}`},
	{`{"a":"1"}`, `{"a":1}`}, {`{"a":null}`, `{"a":null}`}, {`{"a":true}`, `{"a":false}`},
	{`{"a":["x","y"]}`, `{"a":["y"]}`}, {`{"a":["x"]}`, `{"a":"x"}`}, {`{"a":"x"}`, `{"a":["x"]}`},
	{`{"a":{"b":{"c":1,"d":2}}}`, `{"a":{"b":{"c":1}}}`}, {`{"a":{"b":1}}`, `{"a":{}}`},
	{`[1,2,3]`, `[3,1]`}, {`[1,2]`, `[1,1,1]`}, {`[1,[2,3]]`, `[[3]]`}, {`[1,[2,3]]`, `[2]`},
	{`[[1]]`, `[1]`}, {`[{"a":1,"b":2}]`, `[{"a":1}]`}, {`[{"a":1}]`, `[[]]`}, {`[{"a":1}]`, `[{}]`}, {`[[]]`, `[{}]`},
	{`["foo","bar"]`, `"foo"`}, {`"foo"`, `["foo"]`}, {`"foo"`, `"foo"`}, {`1`, `1.00`}, {`[]`, `[]`},
	{`{"a":1}`, `[]`}, {`[]`, `{}`}, {`null`, `null`}, {`[null]`, `null`}, {`"\u00e9"`, `"é"`},
	{`{"a":1,"a":2}`, `{"a":2}`}, {`{"a":1,"a":2}`, `{"a":1}`}, {`{"brand":"casino-de","n":[1,{"x":[true]}]}`, `{"n":[{"x":[true]}]}`},
	{`123456789012345678901234567890`, `123456789012345678901234567890.000`}, {`1e-5`, `0.00001`}, {`[1,2]`, `[1,2,3]`},
}

// TestContainsAgreesWithPostgreSQL: the Go containment decides as jsonb's
// @> on every corner above and on random pairs (b often a part of a, so
// that both answers are common).
func TestContainsAgreesWithPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)

	as, bs := make([]string, 0, 4000), make([]string, 0, 4000)
	for _, c := range containsCases {
		as, bs = append(as, c[0]), append(bs, c[1])
	}
	r := rand.New(rand.NewPCG(52, 4))
	for range 3000 {
		a := randomJSON(r, 3)
		b := a
		if r.IntN(3) > 0 {
			b = part(r, a)
		} else {
			b = randomJSON(r, 2)
		}
		as, bs = append(as, encode(a)), append(bs, encode(b))
	}
	rows, err := conn.Query(ctx, `SELECT a::jsonb @> b::jsonb FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(a, b, i) ORDER BY i`, as, bs)
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	require.NoError(t, err)
	require.Len(t, want, len(as))
	agreed := map[bool]int{}
	for i := range as {
		require.Equal(t, want[i], config.Contains([]byte(as[i]), []byte(bs[i])), "%s @> %s", as[i], bs[i])
		agreed[want[i]]++
	}
	require.Greater(t, agreed[true], 500, "random pairs contain often enough to test it")
	require.Greater(t, agreed[false], 500)
}

var scalars = []any{"1", "1.0", "-0", "0", "1e2", "100", "-1.50", `"a"`, `"b"`, `""`, "true", "false", "null"}

// randomJSON is a JSON value of small alphabet (numbers kept as text).
func randomJSON(r *rand.Rand, depth int) any {
	k := r.IntN(5)
	if depth == 0 || k < 2 {
		return scalars[r.IntN(len(scalars))]
	}
	n := r.IntN(4)
	if k == 2 || k == 3 {
		arr := make([]any, n)
		for i := range arr {
			arr[i] = randomJSON(r, depth-1)
		}
		return arr
	}
	obj := map[string]any{}
	for range n {
		obj[string(rune('a'+r.IntN(3)))] = randomJSON(r, depth-1)
	}
	return obj
}

// part is a random part of v: some of its keys or elements, each a part
// of its own, now and then a number written otherwise or a new value.
func part(r *rand.Rand, v any) any {
	switch x := v.(type) {
	case []any:
		var out []any
		for _, e := range x {
			if r.IntN(2) == 0 {
				out = append(out, part(r, e))
			}
		}
		if r.IntN(8) == 0 {
			out = append(out, randomJSON(r, 1))
		}
		if out == nil {
			out = []any{}
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if r.IntN(2) == 0 {
				out[k] = part(r, e)
			}
		}
		return out
	case string:
		switch {
		case x == "1" && r.IntN(2) == 0:
			return "1.000"
		case x == "100":
			return "1E+2"
		case r.IntN(10) == 0:
			return scalars[r.IntN(len(scalars))]
		}
	}
	return v
}

func encode(v any) string {
	switch x := v.(type) {
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = encode(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case map[string]any:
		parts := make([]string, 0, len(x))
		for k, e := range x {
			parts = append(parts, fmt.Sprintf("%q:%s", k, encode(e)))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	return v.(string)
}

// BenchmarkSubscribers: an event type among 100,000 endpoints, 100 of
// them subscribed to it (half by a prefix, a quarter with a filter).
func BenchmarkSubscribers(b *testing.B) {
	tab := config.NewEndpointTable()
	for i := range 100_000 {
		te := config.TableEndpoint{Name: fmt.Sprintf("ep-%06d", i), Enabled: true, EventTypes: []string{fmt.Sprintf("type.%d", i%1000)}}
		if i < 100 {
			te.EventTypes = []string{"order.paid"}
			if i%2 == 0 {
				te.EventTypes = []string{"order.*"}
			}
			if i%4 == 0 {
				te.Filter = []byte(`{"brand": "casino-de"}`)
			}
		}
		tab.Apply(te)
	}
	payload := []byte(`{"brand": "casino-de", "amount": 10, "click_id": "abc"}`)
	b.ResetTimer()
	for b.Loop() {
		if n := len(tab.Subscribers("order.paid", payload)); n != 100 {
			b.Fatal(n)
		}
	}
}

// BenchmarkApplyOneOf100000: one endpoint's change among 100,000 moves its
// own subscriptions only.
func BenchmarkApplyOneOf100000(b *testing.B) {
	tab := config.NewEndpointTable()
	for i := range 100_000 {
		tab.Apply(config.TableEndpoint{Name: fmt.Sprintf("ep-%06d", i), Enabled: true, EventTypes: []string{"order.*", fmt.Sprintf("type.%d", i%1000)}})
	}
	rev := int64(0)
	for b.Loop() {
		rev++
		tab.Apply(config.TableEndpoint{Name: "ep-000042", Enabled: true, Revision: rev,
			EventTypes: []string{"order.*", fmt.Sprintf("type.%d", rev%1000)}, Filter: []byte(`{"brand": "casino-de"}`)})
	}
}
