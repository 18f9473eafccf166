package wal

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// messageBytes is a pgoutput Message as the server sends it.
func messageBytes(transactional bool, lsn uint64, prefix string, content []byte) []byte {
	b := []byte{byte(pglogrepl.MessageTypeMessage), 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// TestMessagesDecodeAsEmitted: an event encoded by outbox.EncodeMessage
// decodes to the row Emit meant; a payload above max_body is measured,
// not kept; anything else is an invalid row with a reason and a stable
// id; a message cut short is an error, never a panic.
func TestMessagesDecodeAsEmitted(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	content, id, err := outbox.EncodeMessage(outbox.Event{Endpoint: "hooks", URL: "https://x.test/pb?a=1", Type: "t",
		Payload: []byte(`{"a":"b\nc"}`), Headers: map[string]string{"X-A": "1"}}, at)
	require.NoError(t, err)
	raw := messageBytes(true, 0x1234, outbox.MessagePrefix, content)
	tx, lsn, prefix, got, err := parseMessage(raw)
	require.NoError(t, err)
	require.True(t, tx)
	require.Equal(t, pglogrepl.LSN(0x1234), lsn)
	require.Equal(t, outbox.MessagePrefix, prefix)
	row := decodeMessage(got, lsn, 1000)
	require.Empty(t, row.Invalid)
	require.Equal(t, store.OutboxRow{
		Event: state.Event{EventID: id, Endpoint: "hooks", URL: "https://x.test/pb?a=1", EventType: "t", Payload: []byte(`{"a":"b\nc"}`), Headers: []byte(`{"X-A":"1"}`), CreatedAt: at},
	}, row)

	row = decodeMessage(got, lsn, 5)
	require.Nil(t, row.Payload)
	require.Equal(t, len(`{"a":"b\nc"}`), row.PayloadTooLarge)

	for content, reason := range map[string]string{
		"no newline":    "no header line",
		"{not json\n{}": "header is not the JSON",
		`{"v":2,"id":"` + id + `","endpoint":"e"}` + "\n{}": "version 2",
		`{"v":1,"id":"x","endpoint":"e"}` + "\n{}":          "is not a UUID",
		`{"v":1,"id":"` + id + `"}` + "\n{}":                "has no endpoint, nor a type",
		`{"v":1,"id":"` + id + `","endpoint":"e"}` + "\n{":  "payload is not JSON",
	} {
		row := decodeMessage([]byte(content), 0x99, 1000)
		require.Contains(t, row.Invalid, reason, content)
		require.True(t, uuidRe.MatchString(row.EventID))
		require.True(t, json.Valid(row.Payload), "a dead letter's payload is stored as jsonb")
	}
	require.Equal(t, decodeMessage([]byte("x"), 0x99, 0).EventID, decodeMessage([]byte("y"), 0x99, 0).EventID,
		"an invalid message's id follows from its LSN")
	for i := range raw {
		if _, _, _, _, err := parseMessage(raw[:i]); err == nil && i < len(raw) {
			require.Failf(t, "a message cut short parsed", "at %d of %d", i, len(raw))
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	content, _, _ := outbox.EncodeMessage(outbox.Event{Endpoint: "e", Payload: []byte(`{"x":[1,2]}`),
		Headers: map[string]string{"a": "b"}}, time.Unix(0, 0))
	f.Add(messageBytes(true, 1, outbox.MessagePrefix, content), 100)
	f.Add(messageBytes(false, 1, "other", []byte("x")), 0)
	f.Add([]byte(strings.Repeat("M", 20)), 10)
	f.Fuzz(func(t *testing.T, data []byte, maxBody int) {
		_, lsn, _, content, err := parseMessage(data)
		if err != nil {
			return
		}
		row := decodeMessage(content, lsn, maxBody)
		if row.Invalid == "" {
			require.True(t, uuidRe.MatchString(row.EventID))
			require.True(t, row.Endpoint != "" || row.Fanout && row.EventType != "", "an endpoint, or routed by its type")
		}
		require.True(t, row.PayloadTooLarge > 0 || json.Valid(row.Payload), "payload %q", row.Payload)
	})
}
