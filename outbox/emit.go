package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// MessagePrefix is the logical decoding message prefix of events written
// by Emit, which postbox reads from its replication stream.
const MessagePrefix = "postbox"

// MessageHeader is the first line of an emitted event's message; the
// payload follows it after one newline, unencoded, so that postbox can
// measure a payload above max_body without reading it.
type MessageHeader struct {
	Version   int               `json:"v"`
	ID        string            `json:"id"`
	Endpoint  string            `json:"endpoint"`
	URL       string            `json:"url,omitempty"`
	Type      string            `json:"type,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

// Emit writes e into the write-ahead log of tx's transaction as a logical
// decoding message (pg_logical_emit_message, transactional, prefix
// MessagePrefix) instead of an outbox table row: postbox delivers it if
// and only if the transaction commits, as with Insert, and the database
// writes no outbox row, index entry or delete for it. The trade-off: until
// postbox has ingested it, the event exists only in the WAL its
// replication slot holds, so a lost slot cannot be reconciled from a
// table (see docs/integration.md). tx is a pgx.Tx or a *sql.Tx. It
// returns the event id.
//
// The relay delivers emitted events only with outbox_messages: true in its
// configuration; without it each becomes a dead letter (messages_off),
// delivered by postbox replay once it is on. Any role that may run
// pg_logical_emit_message could emit one, and PostgreSQL grants it to
// PUBLIC: revoke that, grant EXECUTE on it to the application's role
// alone, and list that role in outbox_message_roles (postbox doctor
// prints the statements, and fails until they are run).
func Emit(ctx context.Context, tx any, e Event) (string, error) {
	msg, id, err := EncodeMessage(e, time.Now())
	if err != nil {
		return "", err
	}
	const query = "SELECT pg_logical_emit_message(true, '" + MessagePrefix + "', $1::bytea)"
	switch x := tx.(type) {
	case PgxExecer:
		_, err = x.Exec(ctx, query, msg)
	case SQLExecer:
		_, err = x.ExecContext(ctx, query, msg)
	default:
		return "", ErrNotExecer
	}
	if err != nil {
		return "", fmt.Errorf("outbox: emit event for endpoint %q: %w", e.Endpoint, err)
	}
	return id, nil
}

// EncodeMessage is the message Emit writes for e: its MessageHeader as
// JSON, a newline, and the payload. It returns the event id too.
func EncodeMessage(e Event, now time.Time) ([]byte, string, error) {
	if e.Endpoint == "" && e.Type == "" {
		return nil, "", errors.New("outbox: event needs an endpoint, or a type to route it by")
	}
	if e.ID == "" {
		e.ID = NewEventID()
	}
	payload := []byte(e.Payload)
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	if !json.Valid(payload) {
		return nil, "", errors.New("outbox: payload is not valid JSON")
	}
	head, err := json.Marshal(MessageHeader{Version: 1, ID: e.ID, Endpoint: e.Endpoint, URL: e.URL, Type: e.Type,
		Headers: e.Headers, CreatedAt: now.UTC()})
	if err != nil {
		return nil, "", fmt.Errorf("outbox: encode event: %w", err)
	}
	var b bytes.Buffer
	b.Grow(len(head) + 1 + len(payload))
	b.Write(head) // json.Marshal escapes newlines: the header is one line
	b.WriteByte('\n')
	b.Write(payload)
	return b.Bytes(), e.ID, nil
}
