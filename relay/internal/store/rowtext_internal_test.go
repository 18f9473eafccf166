package store

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecodeRowAsEncodingJSON: the hand-read rows are what encoding/json
// reads, for the plain rows it reads by hand and for those it leaves to
// encoding/json (escapes, invalid UTF-8, values that are not strings,
// malformed text).
func TestDecodeRowAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"url": "https://p.example/a?b=c", "timeout": "00:00:10", "secret": null, "name": "p-1"}`,
		`{}`, ` { } `, `null`, `{"a":"b","c":null}`,
		`{"headers": "{\"X-A\": \"1\"}"}`, `{"body": "line\nbreak \u00e9 \ud83d\ude00"}`,
		`{"name": "caf` + "\xc3\xa9" + `"}`, `{"name": "bad ` + "\xff" + `"}`,
		`{"a": 1}`, `{"a": true}`, `{"a": ["x"]}`, `{"a": {"b": "c"}}`, `{"a": "b",}`, `{"a" "b"}`,
		`{"a": "back\\slash \/ \t \b\f\r\"q\""}`, `{"a": "\x"}`, `{"a": "\"}`, `{"a\"k": "\\"}`, `{"a": "\\u0041"}`,
		`{"a": "b"} x`, `{"a": "b"`, `{"a": nul}`, `[]`, ``, `{"a": "tab	in"}`, `{"a": "b", "a": "c"}`,
	} {
		var want map[string]*string
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := decodeRow([]byte(in))
		if wantErr != nil {
			require.Error(t, err, in)
			continue
		}
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	// A JSON object column's text, its quotes escaped, is read by hand.
	_, ok := decodeFlat([]byte(`{"headers": "{\"X-A\": \"1\"}", "url": null}`))
	require.True(t, ok)
}
