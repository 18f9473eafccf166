// The ingest's writes: events and their first deliveries, inserted on the
// ingest's own connection (IngestConn).

package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// NewEvent is an outbox row to ingest, with its delivery's first state
// already decided: in_flight (claimed by this instance for the in-memory
// fast path), pending (for the queue), or dead_letter (with LastError).
type NewEvent struct {
	OutboxRow
	// Lane is the lane the delivery is queued and protected in when it is
	// not the endpoint's own: the endpoint and its row URL's host
	// (config.Config.Lane). "" (NULL) is the endpoint's lane.
	Lane        string
	CommitLSN   pglogrepl.LSN // 0 when found by reconciliation
	CommittedAt time.Time     // zero when unknown
	Status      postboxtype.DeliveryState
	LastError   string
	// Delivered is the outcome of a first attempt that delivered before
	// the insert (Status is then Delivered): the delivery is written
	// done, with the attempt kept on it (attempted_by, migration 026),
	// instead of in flight and updated by the recorder
	// (dispatch.Job.TakeDelivered).
	Delivered *state.Result
	// PayloadDropped is the size of a payload not stored (above max_body);
	// Payload is then JSON null.
	PayloadDropped int
	// UnderWay (with Status InFlight) asks that a copied batch write the
	// event alone, its delivery to be written once its attempt ends
	// (recordUnderWay), and name it in a range of the ingesting instance
	// (Ingested.Range). A batch inserted by the statement writes it in
	// flight all the same.
	UnderWay bool
}

// Key is ev's lane key: its Lane, or its endpoint's.
func (ev *NewEvent) Key() string {
	return state.LaneKey(ev.Endpoint, ev.Lane)
}

// Ingested identifies the delivery created for NewEvent number Index of an
// Insert call. Events that were already ingested get none.
type Ingested struct {
	Index      int
	DeliveryID int64 // 0 for an event under way
	EventPK    int64
	Range      int64 // the under_way range of an event under way
}

// insertEventsSQL writes events and their first deliveries in one
// statement, skipping events already ingested (see absent). Rows are
// inserted in (event_id, endpoint) order, the unique key's order, so two
// ingests of overlapping rows (the stream and a reconciliation) lock in
// the same order and cannot deadlock.
//
// The lines marked "-- delivered" write the deliveries whose first
// attempts delivered before the insert (NewEvent.Delivered) as such, with
// the attempt kept on the row (migration 026) rather than in an attempt row
// of its own, created when that attempt started (never after it was
// delivered); a batch without any (a catch-up's) runs the
// statement without them (withoutDelivered), as it was before they were
// written so.
//
// Event ids arrive as text[] and are cast here: pgx has no binary
// encoding of a []string as uuid[], and trying one first, for every
// statement, cost an error that formats the whole array.
const insertEventsSQL = `
WITH input AS (
  SELECT * FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                       $7::timestamptz[], $8::int8[], $9::text[], $10::timestamptz[], $11::text[], $12::text[], $14::int4[], $15::text[], $16::bool[], $17::text[]
                       , $18::timestamptz[], $19::int4[], $20::float4[], $21::text[], $22::float4[], $23::text[], $24::int8[], $25::text[] -- delivered
                       )
    WITH ORDINALITY AS i(event_id, endpoint, url, event_type, payload, headers,
                         created_at, outbox_id, commit_lsn, committed_at, status, last_error, payload_dropped, lane, message, matched,
                         done_at, status_code, response_ms, response, c2d_ms, target, revision, sent, -- delivered
                         ord)
),
ev AS (
  INSERT INTO postbox.events (event_id, endpoint, url, event_type, payload, headers,
                              created_at, outbox_id, commit_lsn, committed_at, search, payload_dropped, message, matched)
  SELECT event_id, endpoint, url, event_type, p.v, headers::jsonb,
         coalesce(created_at, now()), outbox_id, commit_lsn::pg_lsn, committed_at,
         {{search}},
         nullif(payload_dropped, 0), message, matched
  FROM input CROSS JOIN LATERAL (SELECT payload::jsonb AS v) AS p
  {{absent}}
  ORDER BY event_id, endpoint
  {{conflict}}
  RETURNING id, event_id, endpoint
),
dl AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status, lease_owner, kept, last_error
                                  , attempt_count, delivered_at, last_status_code, last_response_ms, last_response, commit_to_delivery_ms, updated_at, -- delivered
                                  attempt_target, attempted_by, attempt_revision, attempt_sent, created_at -- delivered
                                  )
  SELECT ev.id, ev.endpoint, i.lane, i.status,
         CASE WHEN i.status = 'in_flight' THEN $13 END, i.status = 'in_flight',
         nullif(i.last_error, '')
         , CASE WHEN i.status = 'delivered' THEN 1 ELSE 0 END, i.done_at, i.status_code, i.response_ms, nullif(i.response, ''), -- delivered
         nullif(i.c2d_ms, -1), coalesce(i.done_at, now()), -- delivered
         CASE WHEN i.status = 'delivered' THEN nullif(i.target, '') END, CASE WHEN i.status = 'delivered' THEN $13 END, -- delivered
         CASE WHEN i.status = 'delivered' THEN nullif(i.revision, 0) END, -- delivered
         CASE WHEN i.status = 'delivered' THEN nullif(i.sent, '') END, -- delivered
         least(now(), i.done_at - i.response_ms * interval '1 millisecond') -- delivered
  FROM ev JOIN input i ON i.event_id = ev.event_id AND i.endpoint = ev.endpoint
  ORDER BY i.ord -- delivery ids follow commit order: ordered endpoints rely on it
  RETURNING id, event_pk
)
SELECT i.ord, dl.id, dl.event_pk
FROM dl JOIN ev ON ev.id = dl.event_pk JOIN input i ON i.event_id = ev.event_id AND i.endpoint = ev.endpoint`

// insertEventSQL is insertEventsSQL for one event, with the same
// parameters (arrays of one): the single event of a live transaction
// skips the unnest and the joins that match many events to their
// deliveries, which cost more than the inserts themselves.
const insertEventSQL = `
WITH ev AS (
  INSERT INTO postbox.events (event_id, endpoint, url, event_type, payload, headers,
                              created_at, outbox_id, commit_lsn, committed_at, search, payload_dropped, message, matched)
  SELECT (($1::text[])[1])::uuid, ($2::text[])[1], ($3::text[])[1], ($4::text[])[1], p.v, (($6::text[])[1])::jsonb,
         coalesce(($7::timestamptz[])[1], now()), ($8::int8[])[1], (($9::text[])[1])::pg_lsn, ($10::timestamptz[])[1],
         {{search}},
         nullif(($14::int4[])[1], 0), ($16::bool[])[1], ($17::text[])[1]
  FROM (SELECT (($5::text[])[1])::jsonb AS v) AS p
  {{absent}}
  {{conflict}}
  RETURNING id, endpoint
),
dl AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status, lease_owner, kept, last_error
                                  , attempt_count, delivered_at, last_status_code, last_response_ms, last_response, commit_to_delivery_ms, updated_at, -- delivered
                                  attempt_target, attempted_by, attempt_revision, attempt_sent, created_at -- delivered
                                  )
  SELECT ev.id, ev.endpoint, ($15::text[])[1], ($11::text[])[1],
         CASE WHEN ($11::text[])[1] = 'in_flight' THEN $13 END, ($11::text[])[1] = 'in_flight',
         nullif(($12::text[])[1], '')
         , CASE WHEN ($11::text[])[1] = 'delivered' THEN 1 ELSE 0 END, ($18::timestamptz[])[1], ($19::int4[])[1], -- delivered
         ($20::float4[])[1], nullif(($21::text[])[1], ''), nullif(($22::float4[])[1], -1), -- delivered
         coalesce(($18::timestamptz[])[1], now()), -- delivered
         CASE WHEN ($11::text[])[1] = 'delivered' THEN nullif(($23::text[])[1], '') END, -- delivered
         CASE WHEN ($11::text[])[1] = 'delivered' THEN $13 END, -- delivered
         CASE WHEN ($11::text[])[1] = 'delivered' THEN nullif(($24::int8[])[1], 0) END, -- delivered
         CASE WHEN ($11::text[])[1] = 'delivered' THEN nullif(($25::text[])[1], '') END, -- delivered
         least(now(), ($18::timestamptz[])[1] - ($20::float4[])[1] * interval '1 millisecond') -- delivered
  FROM ev
  RETURNING id, event_pk
)
SELECT 1::int8, dl.id, dl.event_pk FROM dl`

// withoutDelivered drops an insert statement's lines marked "-- delivered".
func withoutDelivered(sql string) string {
	lines := strings.Split(sql, "\n")
	kept := lines[:0]
	for _, l := range lines {
		if !strings.HasSuffix(l, "-- delivered") {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "\n")
}

// insertEventsArgs are the insert statements' arguments for evs: those
// of the statements without their "-- delivered" lines ($1 to $17), and
// with done (some of evs were Delivered) those of these lines too.
func insertEventsArgs(owner string, evs []NewEvent, done bool) []any {
	n := len(evs)
	var (
		ids, endpoints, urls, types, payloads, headers = make([]string, n), make([]string, n), make([]*string, n), make([]string, n), make([]string, n), make([]*string, n)
		lsns, statuses, errs                           = make([]*string, n), make([]string, n), make([]string, n)
		dropped                                        = make([]int32, n)
		lanes                                          = make([]*string, n)
		outboxIDs                                      = make([]*int64, n)
		messages                                       = make([]bool, n)
		matched                                        = make([]*string, n)
		created, committed                             = make([]*time.Time, n), make([]*time.Time, n)
		// the first attempts that delivered before the insert (Delivered)
		doneAt          []*time.Time
		codes           []*int32
		ms, c2d         []*float32
		bodies, targets []*string
		sents           []*string
		revisions       []int64
	)
	if done {
		doneAt, codes = make([]*time.Time, n), make([]*int32, n)
		ms, c2d, bodies, targets = make([]*float32, n), make([]*float32, n), make([]*string, n), make([]*string, n)
		revisions, sents = make([]int64, n), make([]*string, n)
	}
	for i := range evs {
		e := &evs[i]
		ids[i], endpoints[i], types[i], payloads[i] = e.EventID, e.Endpoint, e.EventType, string(e.Payload)
		statuses[i], errs[i], dropped[i], messages[i] = string(e.Status), e.LastError, int32(e.PayloadDropped), e.Message
		if e.Lane != "" && e.Lane != e.Endpoint {
			lanes[i] = &e.Lane
		}
		if !e.CreatedAt.IsZero() {
			created[i] = &e.CreatedAt
		}
		if e.URL != "" {
			urls[i] = &e.URL
		}
		if e.Headers != nil {
			h := string(e.Headers)
			headers[i] = &h
		}
		if e.OutboxID != 0 {
			outboxIDs[i] = &e.OutboxID
		}
		if e.Fanout {
			matched[i] = &e.Matched
		}
		if e.CommitLSN != 0 {
			s := e.CommitLSN.String()
			lsns[i] = &s
		}
		if !e.CommittedAt.IsZero() {
			committed[i] = &e.CommittedAt
		}
		if r := e.Delivered; r != nil && done {
			at := r.At
			code, took, c2dMS := int32(r.StatusCode), float32(r.ResponseMS), float32(r.CommitToDeliveryMS)
			doneAt[i], ms[i], c2d[i] = &at, &took, &c2dMS
			bodies[i], targets[i], revisions[i] = &r.Response, &r.Target, r.EndpointRevision
			if r.Sent != "" {
				sents[i] = &r.Sent
			}
			if code != 0 {
				codes[i] = &code
			}
		}
	}
	args := []any{ids, endpoints, urls, types, payloads, headers, created, outboxIDs, lsns, committed, statuses, errs, owner, dropped, lanes, messages, matched}
	if done {
		args = append(args, doneAt, codes, ms, bodies, c2d, targets, revisions, sents)
	}
	return args
}

// IngestConn writes ingested events on one connection, in transactions
// that it opens on the first Insert and closes with Commit, which also
// stores the checkpoint. BEGIN and the insert travel together, and so do
// the checkpoint and COMMIT, so a transaction costs two round trips (a
// batch that is copied, see copyEventsMin, two to four more); the caller
// may start delivering between them.
type IngestConn struct {
	conn  *pgxpool.Conn
	s     *Store
	inTx  bool
	owner string
	// searchKeys are the payload fields extracted into events.search, and
	// insert the statements that extract them.
	searchKeys []string
	insert     *insertStatements
	concurrent bool // see SetConcurrent
	// The session's leadership and server, written with each checkpoint.
	lead     Leadership
	systemID string
	timeline int32
	// endpointsLSN is the last endpoint change the open transaction
	// applied (WriteEndpoints), stored with its checkpoint.
	endpointsLSN pglogrepl.LSN
}

// SetSession sets the leadership token and the server identity checkpoint
// writes are made under.
func (ic *IngestConn) SetSession(l Leadership, systemID string, timeline int32) {
	ic.lead, ic.systemID, ic.timeline = l, systemID, timeline
}

// AcquireIngest takes a connection from the pool for ingesting. owner
// holds the in_flight deliveries (the fast path).
func (s *Store) AcquireIngest(ctx context.Context, owner string) (*IngestConn, error) {
	c, err := s.Pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// The ingest statements read no table by a scan (they insert from
	// parameters and join their own results), so a cached generic plan is
	// safe here and saves planning on the latency path. Their joins match
	// a batch's rows to each other, by hash: the planner, guessing that
	// absent's filter leaves one row of a batch's thousands, would loop
	// over the whole batch for each. The outbox rows' delete goes by the
	// primary key: planned while the table looked small, it read the
	// whole of a table that producers were filling, and cost four times
	// as much under full insert load.
	if _, err := c.Exec(ctx, "SET plan_cache_mode = auto; SET enable_nestloop = off; SET enable_seqscan = off"); err != nil {
		c.Release()
		return nil, err
	}
	ic := &IngestConn{conn: c, s: s, owner: owner}
	ic.insert = insertEventsStatements(nil, false)
	return ic, nil
}

// SetConcurrent declares that another ingest may insert the same events
// while this one does (reconciliation, beside the stream): inserts then
// skip existing events with ON CONFLICT (see absent).
func (ic *IngestConn) SetConcurrent() {
	ic.concurrent = true
	ic.insert = insertEventsStatements(ic.searchKeys, true)
}

// SetSearchKeys sets the payload fields the following inserts extract
// for search (search_keys).
func (ic *IngestConn) SetSearchKeys(keys []string) {
	if ic.insert != nil && slices.Equal(keys, ic.searchKeys) {
		return
	}
	ic.searchKeys = slices.Clone(keys)
	ic.insert = insertEventsStatements(keys, ic.concurrent)
}

// An insert skips the events already ingested ({{absent}}, {{conflict}}
// in the statements) in one of two ways. Alone, an ingest reads the unique
// key for each event (absent: a subquery per row, which the planner cannot
// turn into a join that scans the table) and inserts those it does not
// find. Beside another ingest of the same rows (a reconciliation beside
// the stream) it inserts with ON CONFLICT, which waits for the other's
// insert of a key to commit or abort. That speculative insertion writes a
// second WAL record per event, to confirm it; without it an event costs
// one record less, and the walsender one turn less. Were another ingest
// to insert a key between the read and the insert all the same (a deposed
// leader's, committed just before its fencing), the insert fails on the
// unique key, nothing of the transaction is written, and the stream brings
// the rows again.
const (
	absent     = `WHERE (SELECT 1 FROM postbox.events x WHERE x.event_id = %s AND x.endpoint = %s) IS NULL`
	onConflict = `ON CONFLICT (event_id, endpoint) DO NOTHING`
)

// insertStatements are the ingest's insert statements: of many events
// or one, with deliveries written delivered (done) or without.
type insertStatements struct {
	many, one, manyDone, oneDone string
}

// insertEventsStatements are insertEventsSQL and insertEventSQL
// extracting keys: each key's
// value when it is a scalar, as text, written into the statement (keys are
// validated names, and quoted) so that a row costs one jsonb_build_object,
// not a subquery; NULL (no index entry) when none is there.
func insertEventsStatements(keys []string, concurrent bool) *insertStatements {
	search := "NULL::jsonb"
	if len(keys) > 0 {
		var b strings.Builder
		b.WriteString("nullif(jsonb_strip_nulls(jsonb_build_object(")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			lit := "'" + strings.ReplaceAll(k, "'", "''") + "'"
			fmt.Fprintf(&b, "%s, CASE WHEN jsonb_typeof(p.v -> %s) IN ('string', 'number', 'boolean') THEN p.v ->> %s END", lit, lit, lit)
		}
		b.WriteString(")), '{}'::jsonb)")
		search = b.String()
	}
	absentMany, absentOne := fmt.Sprintf(absent, "input.event_id", "input.endpoint"), fmt.Sprintf(absent, "(($1::text[])[1])::uuid", "($2::text[])[1]")
	conflict := ""
	if concurrent {
		absentMany, absentOne, conflict = "", "", onConflict
	}
	many := strings.NewReplacer("{{search}}", search, "{{absent}}", absentMany, "{{conflict}}", conflict).Replace(insertEventsSQL)
	one := strings.NewReplacer("{{search}}", search, "{{absent}}", absentOne, "{{conflict}}", conflict).Replace(insertEventSQL)
	return &insertStatements{many: withoutDelivered(many), one: withoutDelivered(one), manyDone: many, oneDone: one}
}

// Insert writes events (deduplicated by event id and endpoint) in the open
// transaction, opening one if needed. With deleteOutbox (outbox_retention
// 0) it deletes their outbox rows in the same transaction, so a
// transaction of any size needs no list of its rows until the commit. The
// returned deliveries exist once Commit succeeds. A batch from
// copyEventsMin events on is copied into the tables (copyInsert) rather
// than inserted by the statement.
func (ic *IngestConn) Insert(ctx context.Context, evs []NewEvent, deleteOutbox bool) ([]Ingested, error) {
	var outboxIDs []int64
	if deleteOutbox {
		for _, ev := range evs {
			if ev.OutboxID != 0 {
				outboxIDs = append(outboxIDs, ev.OutboxID)
			}
		}
	}
	evs, orig := dedupe(evs)
	done := slices.ContainsFunc(evs, func(ev NewEvent) bool { return ev.Delivered != nil })
	if ic.copyable(evs) {
		if uuids, search, ok := ic.copyValues(evs); ok {
			out, err := ic.copyInsert(ctx, evs, outboxIDs, uuids, search)
			if err != nil {
				return nil, err
			}
			if orig != nil {
				for k := range out {
					out[k].Index = orig[out[k].Index]
				}
			}
			return out, nil
		}
	}
	b := ic.newBatch()
	var sql string
	switch {
	case done && len(evs) == 1:
		sql = ic.insert.oneDone
	case done:
		sql = ic.insert.manyDone
	case len(evs) == 1:
		sql = ic.insert.one
	default:
		sql = ic.insert.many
	}
	b.Queue(sql, insertEventsArgs(ic.owner, evs, done)...)
	ic.queueOutboxDelete(b, outboxIDs)
	br, err := ic.sendBatch(ctx, b)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("insert events: %w", err)
	}
	out := make([]Ingested, 0, len(evs))
	for rows.Next() {
		var g Ingested
		var ord int64
		if err := rows.Scan(&ord, &g.DeliveryID, &g.EventPK); err != nil {
			rows.Close()
			_ = br.Close()
			return nil, fmt.Errorf("insert events: %w", err)
		}
		g.Index = int(ord) - 1
		if orig != nil {
			g.Index = orig[g.Index]
		}
		out = append(out, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("insert events: %w", err)
	}
	if len(outboxIDs) > 0 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("delete ingested outbox rows: %w", needs(err, ic.s.outboxNeeds("DELETE", "the ingest (outbox_retention 0)")))
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("insert events: %w", err)
	}
	return out, nil
}

// newBatch is a batch that opens the transaction with BEGIN when none is
// open; send it with sendBatch.
func (ic *IngestConn) newBatch() *pgx.Batch {
	b := &pgx.Batch{}
	if !ic.inTx {
		b.Queue("BEGIN")
	}
	return b
}

// sendBatch sends a batch from newBatch and reads its BEGIN's result, if
// it has one: the transaction is open from then on.
func (ic *IngestConn) sendBatch(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	br := ic.conn.SendBatch(ctx, b)
	if !ic.inTx {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("begin ingest: %w", err)
		}
		ic.inTx = true
	}
	return br, nil
}

// queueOutboxDelete queues the delete of ingested outbox rows (none when
// ids is empty).
func (ic *IngestConn) queueOutboxDelete(b *pgx.Batch, ids []int64) {
	if len(ids) > 0 {
		b.Queue(`DELETE FROM `+ic.s.Table.Ident()+` WHERE id = ANY($1)`, ids)
	}
}

// dedupe drops repeated (event id, endpoint) pairs, keeping the first, so
// one statement never inserts the same key twice. orig maps each kept
// event to its index in evs; it is nil when nothing was dropped.
func dedupe(evs []NewEvent) (kept []NewEvent, orig []int) {
	type key struct{ id, ep string }
	seen := make(map[key]struct{}, len(evs))
	for i, e := range evs {
		k := key{strings.ToLower(e.EventID), e.Endpoint}
		if _, ok := seen[k]; ok {
			if orig == nil {
				orig = make([]int, i)
				for j := range orig {
					orig[j] = j
				}
				kept = slices.Clone(evs[:i])
			}
			continue
		}
		seen[k] = struct{}{}
		if orig != nil {
			orig = append(orig, i)
			kept = append(kept, e)
		}
	}
	if orig == nil {
		return evs, nil
	}
	return kept, orig
}
