// The outbox table as the relay reads it: its row, the reconciliation's
// reads (Snapshot, UningestedOutbox), the purge, and the endpoint name cut.

package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/postbox-relay/postbox/relay/internal/state"
)

// OutboxRow is one outbox row, its columns decoded by their types: what
// the WAL stream decodes (wal) and reconciliation reads
// (UningestedOutbox), and what the ingest writes (NewEvent).
type OutboxRow struct {
	state.Event
	OutboxID int64 // 0 for a logical decoding message
	// PayloadTooLarge is the payload's size when it was above max_body
	// and so not read (Payload is then nil).
	PayloadTooLarge int
	// Invalid says why the row cannot be delivered as it stands (a
	// contract column missing or unreadable, a created_at that is not a
	// finite time); it becomes a dead letter with it.
	Invalid string
	// Fanout: the row's endpoint is NULL, and it goes to every endpoint
	// subscribed to its event type. Matches are those endpoints, once
	// Routed (an empty list: no subscriber).
	Fanout  bool
	Routed  bool
	Matches []Match
	// Matched, on each event a routed row is ingested as (one per match),
	// is why its endpoint matched (Match.Why; "" for the no_subscriber
	// record), stored in events.matched: NULL for a row's own endpoint.
	Matched string
}

// Match is an endpoint a routed outbox row goes to, and why (the
// subscription's pattern, "+ filter" when a filter held), stored in
// events.matched.
type Match struct {
	Endpoint string
	Why      string
}

// Snapshot returns a snapshot of now (pg_current_snapshot) and a WAL
// position at or after every commit it sees.
func (s *Store) Snapshot(ctx context.Context) (string, pglogrepl.LSN, error) {
	var snap, lsn string
	if err := s.Pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text, pg_current_wal_lsn()::text`).Scan(&snap, &lsn); err != nil {
		return "", 0, fmt.Errorf("snapshot: %w", err)
	}
	pos, err := pglogrepl.ParseLSN(lsn)
	return snap, pos, err
}

// UningestedOutbox returns up to limit outbox rows with id > after that are
// not in postbox.events and that were committed as of snapshot (see
// Snapshot; "" for all), in id order. Rows committed later are the
// stream's to bring.
//
// A row's xmin is a 32-bit transaction id; it is widened to the 64-bit
// form pg_visible_in_snapshot takes with the epoch of the snapshot's
// xmax (one less when the id is above xmax's low half, i.e. from before
// the last wraparound).
func (s *Store) UningestedOutbox(ctx context.Context, after int64, limit int, snapshot string, maxBody int64) ([]OutboxRow, error) {
	rows, err := s.Pool.Query(ctx, `
		WITH snap AS (
		  SELECT $3::text::pg_snapshot AS s, pg_snapshot_xmax($3::text::pg_snapshot)::text::int8 AS xmax8
		  WHERE $3::text <> ''
		)
		SELECT o.id, o.event_id::text, o.endpoint, coalesce(o.url, ''), o.event_type,
		       CASE WHEN octet_length(o.payload::text) <= $4 THEN o.payload::text END, octet_length(o.payload::text),
		       o.headers::text, o.created_at::timestamptz
		FROM `+s.Table.Ident()+` o
		WHERE o.id > $1
		  AND NOT EXISTS (SELECT 1 FROM postbox.events e WHERE `+ingestedBy("o")+`)
		  AND ($3::text = '' OR (SELECT pg_visible_in_snapshot(
		        ((((snap.xmax8 >> 32) - CASE WHEN o.xmin::text::int8 > (snap.xmax8 & 4294967295) THEN 1 ELSE 0 END) << 32)
		          | o.xmin::text::int8)::text::xid8, snap.s) FROM snap))
		ORDER BY o.id LIMIT $2`, after, limit, snapshot, maxBody)
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", needs(err, s.outboxNeeds("SELECT", "reconciliation")))
	}
	defer rows.Close()
	var out []OutboxRow
	for rows.Next() {
		var r OutboxRow
		var endpoint, eventType, payload, headers *string
		var size *int
		var created pgtype.Timestamptz
		if err := rows.Scan(&r.OutboxID, &r.EventID, &endpoint, &r.URL, &eventType, &payload, &size, &headers, &created); err != nil {
			return nil, fmt.Errorf("read outbox: %w", err)
		}
		if payload == nil && size != nil {
			// Above maxBody: measured, not read, as the stream does.
			r.PayloadTooLarge = *size
		}
		// A NULL endpoint routes the row by its type, as the stream does
		// (the reconciliation routes it under the endpoints applied now).
		if endpoint == nil {
			r.Fanout, endpoint = true, new(string)
			if eventType == nil || *eventType == "" {
				r.Invalid = "invalid_row: endpoint and event_type are both empty: the row names no endpoint and no type to route it by"
			}
		}
		// A NULL where the contract wants a value (a table made by hand)
		// makes the row a dead letter, as the stream does; it never stops
		// reconciliation.
		for _, c := range []struct {
			name string
			v    *string
			dst  *string
		}{{"endpoint", endpoint, &r.Endpoint}, {"payload", payload, nil}, {"event_type", eventType, &r.EventType}} {
			switch {
			case c.v == nil && c.name != "event_type" && (c.name != "payload" || r.PayloadTooLarge == 0) && r.Invalid == "":
				r.Invalid = "invalid_row: column " + c.name + " missing or unreadable"
			case c.v != nil && c.dst != nil:
				*c.dst = *c.v
			}
		}
		switch {
		case r.Invalid != "":
		case created.Valid && created.InfinityModifier == pgtype.Finite:
			r.CreatedAt = created.Time
		case created.Valid:
			r.Invalid = "invalid_row: column created_at in " + s.Table.String() + " is not a time: " + created.InfinityModifier.String()
		}
		if payload != nil {
			r.Payload = []byte(*payload)
		}
		if headers != nil {
			r.Headers = []byte(*headers)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox: %w", needs(err, s.outboxNeeds("SELECT", "reconciliation")))
	}
	return out, nil
}

// OutboxHorizon is a point the outbox purge can later prove ingested
// without looking for each row's event (which event_retention may have
// purged first): every transaction with an id below XID had ended when
// the server's WAL was at LSN, so once the slot's checkpoint is at LSN or
// past it, with no reconciliation owed and on the same server and
// timeline, every outbox row those transactions wrote has been ingested.
// The zero value proves nothing.
type OutboxHorizon struct {
	XID      uint64
	LSN      pglogrepl.LSN
	SystemID *string // the checkpoint's when the horizon was taken
	Timeline *int32
}

// OutboxHorizon takes a horizon now (see OutboxHorizon). The statement's
// snapshot is taken before its functions run, so the WAL position read
// is at or after the commit of every transaction the snapshot sees
// ended.
func (s *Store) OutboxHorizon(ctx context.Context) (OutboxHorizon, error) {
	var h OutboxHorizon
	var lsn string
	err := s.Pool.QueryRow(ctx, `
		SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8, pg_current_wal_insert_lsn()::text,
		       (SELECT system_id FROM postbox.checkpoints WHERE slot = $1),
		       (SELECT timeline FROM postbox.checkpoints WHERE slot = $1)`, s.Slot).Scan(&h.XID, &lsn, &h.SystemID, &h.Timeline)
	if err != nil {
		return OutboxHorizon{}, fmt.Errorf("outbox horizon: %w", err)
	}
	h.LSN, err = pglogrepl.ParseLSN(lsn)
	return h, err
}

// PurgeIngestedOutbox deletes, of the window of outbox rows after the id
// after (window of them, in id order), those older than retention that
// are ingested: their event is in postbox.events, or horizon (from an
// earlier OutboxHorizon) proves their transaction ingested. It returns
// how many it deleted and where the next window starts: 0 when this one
// reached the end of the table or a row younger than retention.
func (s *Store) PurgeIngestedOutbox(ctx context.Context, retention time.Duration, after int64, window int, horizon OutboxHorizon) (deleted, next int64, err error) {
	var last int64
	var seen int
	var young bool
	var xid *string // NULL proves nothing
	if horizon.XID != 0 {
		x := strconv.FormatUint(horizon.XID, 10)
		xid = &x
	}
	err = s.Pool.QueryRow(ctx, purgeOutboxSQL(s.Table.Ident()), retention.Seconds(), after, window,
		xid, horizon.LSN.String(), horizon.SystemID, horizon.Timeline, s.Slot).Scan(&deleted, &last, &seen, &young)
	if err != nil {
		return 0, 0, fmt.Errorf("purge outbox: %w", needs(err, s.outboxNeeds("SELECT, DELETE", "the outbox purge")))
	}
	if seen < window || young {
		return deleted, 0, nil
	}
	return deleted, last, nil
}

// purgeOutboxSQL is PurgeIngestedOutbox's statement for the outbox table
// (its quoted name): of the window of rows after $2 ($3 of them), it
// deletes those older than $1 seconds that are ingested, and returns how
// many it deleted, the window's last id, its size and whether a row of it
// is younger than $1. $4..$8 are the horizon ($4 NULL: none) and the
// slot. A row's xmin is older than the horizon's id when its age is
// greater (a frozen xmin's age is the greatest of all).
func purgeOutboxSQL(table string) string {
	return `
		WITH w AS MATERIALIZED (
		  SELECT o.id, o.event_id, o.endpoint, o.created_at < now() - $1 * interval '1 second' AS old,
		         age(o.xmin) > age(xid($4::text::xid8)) AS before
		  FROM ` + table + ` o WHERE o.id > $2 ORDER BY o.id LIMIT $3
		), proven AS (
		  SELECT EXISTS (SELECT FROM postbox.checkpoints c
		                 WHERE c.slot = $8 AND $4::text IS NOT NULL AND c.lsn >= $5::pg_lsn AND NOT c.reconcile_pending
		                   AND c.system_id IS NOT DISTINCT FROM $6 AND c.timeline IS NOT DISTINCT FROM $7) AS yes
		), gone AS (
		  DELETE FROM ` + table + ` o USING w
		  WHERE o.id = w.id AND w.old
		    AND ((w.before AND (SELECT yes FROM proven))
		         OR EXISTS (SELECT 1 FROM postbox.events e WHERE ` + ingestedBy("w") + `))
		  RETURNING o.id
		)
		SELECT (SELECT count(*) FROM gone), coalesce((SELECT max(id) FROM w), 0), (SELECT count(*) FROM w),
		       coalesce((SELECT NOT bool_and(old) FROM w), false)`
}

// ingestedBy is the condition that an event e ingests the outbox row o
// (its alias): the event of the row's event id and endpoint (as stored,
// see StoredEndpoint) or, for a row routed by subscription (NULL
// endpoint), any of the events it was routed to (matched is set on each,
// its no_subscriber record too), all ingested in one transaction. Either
// way a look-up of the unique key's (event_id, endpoint) index.
func ingestedBy(o string) string {
	return `e.event_id = ` + o + `.event_id AND CASE WHEN ` + o + `.endpoint IS NULL THEN e.matched IS NOT NULL
	        ELSE e.endpoint = left(` + o + `.endpoint, ` + endpointKept + `) END`
}

// endpointKept is StoredEndpoint's cut in SQL: left(name, it).
var endpointKept = strconv.Itoa(MaxEndpointLen + 1)

// MaxEndpointLen is the longest endpoint name, in bytes, a row may give:
// the console shows names in lists and headings, and a name is part of
// several index keys (an index entry has a size limit). A longer one is a
// dead letter (invalid_row), stored under StoredEndpoint's cut of it.
const MaxEndpointLen = 200

// StoredEndpoint is the name an event of endpoint name is stored under:
// the name itself, or for one longer than MaxEndpointLen its first
// MaxEndpointLen+1 characters, which SQL's left() gives too (so the
// reconciliation and the outbox purge match a row to its event), and
// which is still too long to be delivered when replayed.
func StoredEndpoint(name string) string {
	if len(name) <= MaxEndpointLen {
		return name
	}
	n := 0
	for i := range name {
		if n == MaxEndpointLen+1 {
			return name[:i]
		}
		n++
	}
	return name
}
