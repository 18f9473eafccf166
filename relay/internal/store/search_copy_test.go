package store

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestSearchOfMatchesSQL: the search value a copied ingest computes
// (searchOf) is the one the insert statement extracts in SQL, for every
// payload it accepts; those it refuses (ok false) are the ones whose text
// PostgreSQL might write otherwise.
func TestSearchOfMatchesSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := Open(ctx, pgtest.NewDatabase(t), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	keys := []string{"n", "s", "d", "b", "o", "z", "missing", "click-id"}
	// The statement's expression, over a payload given as text.
	expr := strings.ReplaceAll(insertEventsStatements(keys, false).one, "\n", " ")
	expr = expr[strings.Index(expr, "nullif(jsonb_strip_nulls(") : strings.Index(expr, ", '{}'::jsonb)")+len(", '{}'::jsonb)")]
	sql := `SELECT (` + expr + `)::text FROM (SELECT $1::jsonb AS v) AS p`

	for _, tc := range []struct {
		payload string
		ok      bool
	}{
		{`{"n": 42, "s": "abc", "b": true}`, true},
		{`{"d": 1.50, "n": -7, "z": null, "o": {"n": 1}, "s": ["x"]}`, true},
		{`{"s": "q\"u\\o\u00e9\ud83d\ude00 <&>", "click-id": "c-1", "b": false}`, true},
		{`{"n": 0.000, "d": 123456789012345678901234567890.5}`, true},
		{`{"n": 1, "n": "last"}`, true},
		{`{"o": {}, "z": null}`, true},
		{`{}`, true},
		{`[{"n": 1}]`, true},
		{`"n"`, true},
		{`null`, true},
		{`{"n": 1e2}`, false},
		{`{"n": -0.0}`, false},
		{`{"n": -0}`, false},
		{`{"d": 2.5E-3}`, false},
	} {
		got, ok := searchOf([]byte(tc.payload), keys)
		require.Equal(t, tc.ok, ok, tc.payload)
		if !ok {
			continue
		}
		var want *string
		require.NoError(t, pool.QueryRow(ctx, sql, tc.payload).Scan(&want), tc.payload)
		if want == nil {
			require.Nil(t, got, tc.payload)
			continue
		}
		require.NotNil(t, got, tc.payload)
		var same bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT $1::jsonb = $2::jsonb`, *want, string(got)).Scan(&same))
		require.True(t, same, "%s: SQL %s, here %s", tc.payload, *want, got)
	}
}

// FuzzSearchOf: whatever the payload, searchOf returns, when it accepts
// it, nothing or a JSON object of the keys asked for, each with a string.
func FuzzSearchOf(f *testing.F) {
	for _, p := range []string{`{"n": 1, "s": "x"}`, `{"n": 1e2}`, `{"s": "\ud83d\ude00", "b": true}`, `[1]`, `{"n": -0.0}`, `{`, `null`} {
		f.Add([]byte(p))
	}
	keys := []string{"n", "s", "b"}
	f.Fuzz(func(t *testing.T, payload []byte) {
		v, ok := searchOf(payload, keys)
		if !ok || v == nil {
			return
		}
		var got map[string]string
		if err := json.Unmarshal(v, &got); err != nil {
			t.Fatalf("%q: search %q is not an object of strings: %v", payload, v, err)
		}
		if len(got) == 0 {
			t.Fatalf("%q: an empty search object instead of NULL", payload)
		}
		for k := range got {
			if !slices.Contains(keys, k) {
				t.Fatalf("%q: key %q was not asked for", payload, k)
			}
		}
	})
}
