package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

var errShortMessage = errors.New("logical decoding message cut short")

// parseMessage reads a Message (pgoutput, protocol version 1, messages
// 'true'): whether it is transactional, its LSN, prefix and content. The
// content is the message buffer's, valid until the next message.
func parseMessage(src []byte) (transactional bool, lsn pglogrepl.LSN, prefix string, content []byte, err error) {
	// 'M', flags, LSN, prefix (NUL-terminated), length, content.
	if len(src) < 10 || src[0] != byte(pglogrepl.MessageTypeMessage) {
		return false, 0, "", nil, errShortMessage
	}
	transactional = src[1]&1 == 1
	lsn = pglogrepl.LSN(binary.BigEndian.Uint64(src[2:]))
	src = src[10:]
	end := bytes.IndexByte(src, 0)
	if end < 0 {
		return false, 0, "", nil, errShortMessage
	}
	prefix, src = string(src[:end]), src[end+1:]
	if len(src) < 4 {
		return false, 0, "", nil, errShortMessage
	}
	n := binary.BigEndian.Uint32(src)
	src = src[4:]
	if uint64(n) > uint64(len(src)) {
		return false, 0, "", nil, errShortMessage
	}
	return transactional, lsn, prefix, src[:n], nil
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// decodeMessage reads an event written by outbox.Emit: a header line of
// JSON (outbox.MessageHeader), a newline, and the payload. A payload
// longer than maxBody is measured, not copied (PayloadTooLarge); a
// message that breaks the format becomes an invalid row with an id
// derived from its LSN, so it is stored as a dead letter with a reason.
func decodeMessage(content []byte, lsn pglogrepl.LSN, maxBody int) store.OutboxRow {
	var row store.OutboxRow
	invalid := func(format string, args ...any) store.OutboxRow {
		if row.EventID == "" || !uuidRe.MatchString(row.EventID) {
			row.EventID = derivedID("message "+outbox.MessagePrefix, 0, lsn)
		}
		row.Invalid = "invalid_row: message " + fmt.Sprintf(format, args...)
		if row.PayloadTooLarge == 0 && (row.Payload == nil || !json.Valid(row.Payload)) {
			row.Payload = []byte("{}") // stored as jsonb: never a payload that is not JSON
		}
		return row
	}
	nl := bytes.IndexByte(content, '\n')
	if nl < 0 || nl > minKeep {
		return invalid("has no header line of at most %d bytes", minKeep)
	}
	var h outbox.MessageHeader
	if err := json.Unmarshal(content[:nl], &h); err != nil {
		return invalid("header is not the JSON outbox.Emit writes: %v", err)
	}
	row.EventID, row.Endpoint, row.URL, row.EventType, row.CreatedAt = h.ID, h.Endpoint, h.URL, h.Type, h.CreatedAt
	payload := content[nl+1:]
	if maxBody > 0 && len(payload) > maxBody {
		row.PayloadTooLarge = len(payload)
	} else {
		row.Payload = bytes.Clone(payload)
	}
	if len(h.Headers) > 0 {
		row.Headers, _ = json.Marshal(h.Headers) // a map of strings always encodes
	}
	switch {
	case h.Version != 1:
		return invalid("version %d, not 1", h.Version)
	case !uuidRe.MatchString(h.ID):
		return invalid("id %q is not a UUID", h.ID)
	case h.Endpoint == "" && h.Type == "":
		return invalid("has no endpoint, nor a type to route it by")
	case row.Payload != nil && !json.Valid(row.Payload):
		return invalid("payload is not JSON")
	}
	// No endpoint: routed by its type, as a row whose endpoint is NULL.
	row.Fanout = h.Endpoint == ""
	return row
}

// message adds an event emitted with outbox.Emit to the transaction's
// chunk. Other prefixes are other programs' messages. A message written
// outside a transaction (pg_logical_emit_message(false, …), which Emit
// never writes) has no commit to be ingested with and is skipped.
func (ss *session[P]) message(ctx context.Context, data []byte) error {
	transactional, lsn, prefix, content, err := parseMessage(data)
	if err != nil {
		return err
	}
	if prefix != outbox.MessagePrefix || ss.skip {
		return nil
	}
	if !transactional || !ss.inTx {
		ss.log.Warn().Str("lsn", lsn.String()).Msg("skipped a non-transactional postbox message: emit events with outbox.Emit, inside the transaction")
		return nil
	}
	row := decodeMessage(content, lsn, ss.opts.maxBody())
	row.Message = true
	if row.Fanout && row.Invalid == "" && ss.opts.Route != nil {
		ss.opts.Route(&row)
	}
	return ss.add(ctx, row)
}
