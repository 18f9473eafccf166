// The applied rows' text (endpoint_state.row) read back into columns.

package store

import (
	"encoding/json"
	"unicode/utf8"
)

// decodeRow reads a row of endpoint_state, a JSON object of column names
// to their text or null (or null itself, a tombstone), as json.Unmarshal
// into a map[string]*string would. An instance reads every row at start
// (100,000 of them), and encoding/json's reflection took most of that
// read; jsonb's output is flat and plain, so it is read by hand, and
// anything else (a \u escape, other values) is left to encoding/json.
func decodeRow(b []byte) (map[string]*string, error) {
	if row, ok := decodeFlat(b); ok {
		return row, nil
	}
	var row map[string]*string
	err := json.Unmarshal(b, &row)
	return row, err
}

// decodeFlat reads b when it is an object whose keys and values are
// strings (or null values) without \u escapes; ok is false for anything
// else.
func decodeFlat(b []byte) (row map[string]*string, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	row = make(map[string]*string, 8) // most rows set a few columns
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return row, skipSpace(b, i+1) == len(b)
	}
	for {
		key, next, ok := plainString(b, i)
		if !ok {
			return nil, false
		}
		i = skipSpace(b, next)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		switch {
		case i+4 <= len(b) && string(b[i:i+4]) == "null":
			row[key] = nil
			i += 4
		default:
			v, next, ok := plainString(b, i)
			if !ok {
				return nil, false
			}
			row[key] = &v
			i = next
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return row, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// plainString reads the JSON string at b[i] when it has no \u escape,
// no control character and is valid UTF-8 (what json.Unmarshal would
// take as it is, its one-letter escapes undone: a JSON object column's
// text has its quotes escaped); it returns the index after its closing
// quote.
func plainString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	ascii := true
	var out []byte // the text so far, once an escape was undone
	from := i + 1  // the first byte not yet in out
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s := b[i+1 : j]
			if !ascii && !utf8.Valid(s) {
				return "", 0, false
			}
			if out == nil {
				return string(s), j + 1, true
			}
			return string(append(out, b[from:j]...)), j + 1, true
		case c == '\\':
			if j+1 >= len(b) {
				return "", 0, false
			}
			r, ok := unescape[b[j+1]]
			if !ok {
				return "", 0, false // \u, or not JSON
			}
			out = append(append(out, b[from:j]...), r)
			j++
			from = j + 1
		case c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}

// unescape is JSON's one-letter escapes.
var unescape = map[byte]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
