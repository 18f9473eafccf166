package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// copyEventsMin is the batch size from which an ingest alone copies its
// events, their deliveries and the first attempts written with them into
// their tables (COPY FROM STDIN, binary) instead of inserting them from
// arrays (insertEventsSQL). COPY writes a page's worth of new rows as one
// WAL record where an insert writes one per row (three per event, a
// delivery written delivered with its attempt), and every record costs
// the walsender a turn of its loop; it skips the arrays' unnest too. The
// look-up and the three copies cost a round trip each, so the smallest
// batches insert. From 8 on the copy pays at live rates too
// (docs/benchmarks.md).
//
// Only an ingest alone copies: beside another ingest of the same rows
// (SetConcurrent) it needs ON CONFLICT, which COPY has not. It skips the
// events already ingested as the statement alone does (absent): it reads
// the unique key for each first, and a key inserted after that read fails
// the copy on the unique key, nothing of the transaction is written, and
// the stream brings the rows again. With search_keys set the keys are
// extracted here (searchOf) as the statement extracts them in SQL; a batch
// with a value whose text PostgreSQL might write otherwise is inserted.
const copyEventsMin = 8

// copyPlanSQL reads, for a batch about to be copied, which of its events
// were ingested before, and numbers the others: an event id and a delivery
// id each, from the tables' own sequences, delivery ids in batch order
// (commit order: ordered endpoints rely on it). It returns the
// transaction's time too, written where the statement would write now().
// A subquery per row, as absent's, so that no plan scans the table.
const copyPlanSQL = `
SELECT s.ord,
       CASE WHEN NOT s.known THEN nextval('postbox.events_id_seq') END,
       CASE WHEN NOT s.known THEN nextval('postbox.deliveries_id_seq') END,
       now()
FROM (SELECT i.ord, (SELECT 1 FROM postbox.events x WHERE x.event_id = i.event_id AND x.endpoint = i.endpoint) IS NOT NULL AS known
      FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS i(event_id, endpoint, ord)
      ORDER BY i.ord) AS s`

var (
	copyEventColumns = []string{"id", "event_id", "endpoint", "url", "event_type", "payload", "headers",
		"created_at", "outbox_id", "commit_lsn", "committed_at", "payload_dropped", "search", "message", "matched"}
	copyDeliveryColumns = []string{"id", "event_pk", "endpoint", "lane", "status", "lease_owner", "kept",
		"last_error", "attempt_count", "delivered_at", "last_status_code", "last_response_ms", "last_response", "commit_to_delivery_ms",
		"updated_at", "attempt_target", "attempted_by", "attempt_revision", "attempt_sent", "created_at"}
)

// copyable reports whether Insert may copy evs (see copyEventsMin).
func (ic *IngestConn) copyable(evs []NewEvent) bool {
	return len(evs) >= copyEventsMin && !ic.concurrent
}

// copyValues are what a copy of evs writes that the statement computes in
// SQL: the event ids as uuids and, with search keys, the events.search
// values (nil: NULL). ok is false when one of them could differ from the
// statement's (see searchOf) or an id does not parse: the batch is then
// inserted, and the statement decides.
func (ic *IngestConn) copyValues(evs []NewEvent) (uuids []pgtype.UUID, search [][]byte, ok bool) {
	uuids = make([]pgtype.UUID, len(evs))
	if len(ic.searchKeys) > 0 {
		search = make([][]byte, len(evs))
	}
	for i := range evs {
		if uuids[i].Scan(evs[i].EventID) != nil {
			return nil, nil, false
		}
		if search != nil {
			if search[i], ok = searchOf(evs[i].Payload, ic.searchKeys); !ok {
				return nil, nil, false
			}
		}
	}
	return uuids, search, true
}

// searchOf is the events.search value insertEventsStatements extracts in
// SQL from payload: each key's top-level value when it is a string, a
// number or a boolean, as text; nil (NULL) when there is none. ok is false
// where PostgreSQL's text could differ from the JSON's: a number with an
// exponent, or negative zero (numeric writes both otherwise), a string
// that is not UTF-8, a payload that does not parse here.
func searchOf(payload []byte, keys []string) (v []byte, ok bool) {
	if len(payload) == 0 || payload[0] != '{' {
		return nil, true // not an object: no key has a value
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil {
		return nil, false
	}
	found := map[string]string{}
	for _, k := range keys {
		raw, present := fields[k]
		if !present || len(raw) == 0 {
			continue
		}
		switch c := raw[0]; {
		case c == '"':
			var s string
			if !utf8.Valid(raw) || json.Unmarshal(raw, &s) != nil {
				return nil, false
			}
			found[k] = s
		case c == 't' || c == 'f':
			found[k] = string(raw)
		case c == '-' || c >= '0' && c <= '9':
			if !plainNumber(raw) {
				return nil, false
			}
			found[k] = string(raw)
		}
	}
	if len(found) == 0 {
		return nil, true
	}
	v, err := json.Marshal(found)
	return v, err == nil
}

// plainNumber reports whether a JSON number is written as PostgreSQL's
// numeric writes it back: no exponent, and not negative zero.
func plainNumber(raw []byte) bool {
	if bytes.ContainsAny(raw, "eE") {
		return false
	}
	if raw[0] == '-' {
		return bytes.ContainsAny(raw, "123456789")
	}
	return true
}

// orNull is s, or NULL when s is empty.
func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// copyInsert is Insert's copy (see copyEventsMin): evs are deduplicated,
// and outboxIDs the outbox rows to delete.
func (ic *IngestConn) copyInsert(ctx context.Context, evs []NewEvent, outboxIDs []int64,
	uuids []pgtype.UUID, search [][]byte) ([]Ingested, error) {
	n := len(evs)
	endpoints := make([]string, n)
	for i := range evs {
		endpoints[i] = evs[i].Endpoint
	}
	b := ic.newBatch()
	eventPK, deliveryID := make([]int64, n), make([]int64, n)
	var now time.Time
	b.Queue(copyPlanSQL, uuids, endpoints).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var ord int64
			var ev, dl *int64
			if err := rows.Scan(&ord, &ev, &dl, &now); err != nil {
				return err
			}
			if ev != nil && dl != nil {
				eventPK[ord-1], deliveryID[ord-1] = *ev, *dl
			}
		}
		return rows.Err()
	})
	ic.queueOutboxDelete(b, outboxIDs)
	br, err := ic.sendBatch(ctx, b)
	if err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("insert events: %w", err)
	}

	// Events in the unique key's order, as the statement inserts them,
	// so that two ingests of the same rows lock in the same order. (The
	// endpoints of one event id are in byte order here, in the collation's
	// there; where the two differ, a reconciliation beside this ingest
	// could deadlock with it, and PostgreSQL would fail one of them, whose
	// rows come again.)
	var fresh []int
	for i := range evs {
		if eventPK[i] != 0 {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return nil, nil
	}
	byKey := slices.Clone(fresh)
	slices.SortFunc(byKey, func(a, b int) int {
		if c := slices.Compare(uuids[a].Bytes[:], uuids[b].Bytes[:]); c != 0 {
			return c
		}
		return strings.Compare(evs[a].Endpoint, evs[b].Endpoint)
	})
	// Event ids in the order the rows are written, as the statement
	// numbers them: the table's physical order is its ids' order, which
	// the planner counts on when it reads events by id.
	numbers := make([]int64, len(fresh))
	for k, i := range fresh {
		numbers[k] = eventPK[i]
	}
	slices.Sort(numbers)
	for k, i := range byKey {
		eventPK[i] = numbers[k]
	}
	_, err = ic.conn.CopyFrom(ctx, pgx.Identifier{"postbox", "events"}, copyEventColumns,
		pgx.CopyFromSlice(len(byKey), func(k int) ([]any, error) {
			i := byKey[k]
			e := &evs[i]
			// In copyEventColumns' order; NULL where the statement
			// writes none.
			var headers, outboxID, lsn, committedAt, dropped, keys, matched any
			createdAt := any(now)
			if e.Headers != nil {
				headers = e.Headers
			}
			if !e.CreatedAt.IsZero() {
				createdAt = e.CreatedAt
			}
			if e.OutboxID != 0 {
				outboxID = e.OutboxID
			}
			if e.CommitLSN != 0 {
				lsn = int64(e.CommitLSN) // pg_lsn's binary form is int8's
			}
			if !e.CommittedAt.IsZero() {
				committedAt = e.CommittedAt
			}
			if e.PayloadDropped != 0 {
				dropped = int32(e.PayloadDropped)
			}
			if search != nil && search[i] != nil {
				keys = search[i]
			}
			if e.Fanout {
				matched = e.Matched
			}
			return []any{eventPK[i], uuids[i], e.Endpoint, orNull(e.URL), e.EventType, e.Payload, headers,
				createdAt, outboxID, lsn, committedAt, dropped, keys, e.Message, matched}, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("insert events: copy events: %w", err)
	}
	// The deliveries of events under way are written when their attempts
	// end; a range names those events as this instance's meanwhile.
	// One whose attempt has delivered already is written delivered.
	isUnderWay := func(i int) bool { return evs[i].UnderWay && evs[i].Status == postboxtype.DeliveryInFlight }
	written, underWay := fresh, []int(nil)
	if slices.ContainsFunc(fresh, isUnderWay) {
		written = nil
		for _, i := range fresh {
			if isUnderWay(i) {
				underWay = append(underWay, i)
			} else {
				written = append(written, i)
			}
		}
	}
	_, err = ic.conn.CopyFrom(ctx, pgx.Identifier{"postbox", "deliveries"}, copyDeliveryColumns,
		pgx.CopyFromSlice(len(written), func(k int) ([]any, error) {
			i := written[k]
			e := &evs[i]
			// In copyDeliveryColumns' order; NULL where the statement
			// writes none.
			var lane, owner, deliveredAt, code, responseMS, response, c2d, target, by, rev, sent any
			attempts, updatedAt, createdAt := int32(0), now, now
			if e.Lane != "" && e.Lane != e.Endpoint {
				lane = e.Lane
			}
			kept := e.Status == postboxtype.DeliveryInFlight
			if kept {
				owner = ic.owner
			}
			if r := e.Delivered; r != nil && e.Status == postboxtype.DeliveryDelivered {
				attempts, deliveredAt, responseMS, response, updatedAt = 1, r.At, float32(r.ResponseMS), orNull(r.Response), r.At
				target, by, sent = orNull(r.Target), ic.owner, orNull(r.Sent)
				// Created when its attempt started: never after it was delivered.
				if start := attemptStart(*r); start.Before(now) {
					createdAt = start
				}
				if r.EndpointRevision != 0 {
					rev = r.EndpointRevision
				}
				if r.StatusCode != 0 {
					code = int32(r.StatusCode)
				}
				if r.CommitToDeliveryMS != -1 {
					c2d = float32(r.CommitToDeliveryMS)
				}
			}
			return []any{deliveryID[i], eventPK[i], e.Endpoint, lane, string(e.Status), owner, kept, orNull(e.LastError),
				attempts, deliveredAt, code, responseMS, response, c2d, updatedAt, target, by, rev, sent, createdAt}, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("insert events: copy deliveries: %w", err)
	}
	var rangeID int64
	if len(underWay) > 0 {
		first, last := eventPK[underWay[0]], eventPK[underWay[0]]
		for _, i := range underWay {
			first, last = min(first, eventPK[i]), max(last, eventPK[i])
		}
		if rangeID, err = addUnderWay(ctx, ic.conn, ic.owner, first, last); err != nil {
			return nil, fmt.Errorf("insert events: %w", err)
		}
	}
	out := make([]Ingested, 0, len(fresh))
	for _, i := range fresh {
		if isUnderWay(i) {
			out = append(out, Ingested{Index: i, EventPK: eventPK[i], Range: rangeID})
		} else {
			out = append(out, Ingested{Index: i, DeliveryID: deliveryID[i], EventPK: eventPK[i]})
		}
	}
	return out, nil
}
