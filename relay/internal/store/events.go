package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
// of its own; a batch without any (a catch-up's) runs the
// statement without them (withoutDelivered), as it was before they were
// written so.
//
// Event ids arrive as text[] and are cast here: pgx has no binary
// encoding of a []string as uuid[], and trying one first, for every
// statement, cost an error that formats the whole array.
const insertEventsSQL = `
WITH input AS (
  SELECT * FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                       $7::timestamptz[], $8::int8[], $9::text[], $10::timestamptz[], $11::text[], $12::text[], $14::int4[], $15::text[], $16::bool[]
                       , $17::timestamptz[], $18::int4[], $19::float4[], $20::text[], $21::float4[], $22::text[] -- delivered
                       )
    WITH ORDINALITY AS i(event_id, endpoint, url, event_type, payload, headers,
                         created_at, outbox_id, commit_lsn, committed_at, status, last_error, payload_dropped, lane, message,
                         done_at, status_code, response_ms, response, c2d_ms, target, -- delivered
                         ord)
),
ev AS (
  INSERT INTO postbox.events (event_id, endpoint, url, event_type, payload, headers,
                              created_at, outbox_id, commit_lsn, committed_at, search, payload_dropped, message)
  SELECT event_id, endpoint, url, event_type, p.v, headers::jsonb,
         coalesce(created_at, now()), outbox_id, commit_lsn::pg_lsn, committed_at,
         {{search}},
         nullif(payload_dropped, 0), message
  FROM input CROSS JOIN LATERAL (SELECT payload::jsonb AS v) AS p
  {{absent}}
  ORDER BY event_id, endpoint
  {{conflict}}
  RETURNING id, event_id, endpoint
),
dl AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status, lease_owner, kept, last_error
                                  , attempt_count, delivered_at, last_status_code, last_response_ms, last_response, commit_to_delivery_ms, updated_at, -- delivered
                                  attempt_target, attempted_by -- delivered
                                  )
  SELECT ev.id, ev.endpoint, i.lane, i.status,
         CASE WHEN i.status = 'in_flight' THEN $13 END, i.status = 'in_flight',
         nullif(i.last_error, '')
         , CASE WHEN i.status = 'delivered' THEN 1 ELSE 0 END, i.done_at, i.status_code, i.response_ms, nullif(i.response, ''), -- delivered
         nullif(i.c2d_ms, -1), coalesce(i.done_at, now()), -- delivered
         CASE WHEN i.status = 'delivered' THEN nullif(i.target, '') END, CASE WHEN i.status = 'delivered' THEN $13 END -- delivered
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
                              created_at, outbox_id, commit_lsn, committed_at, search, payload_dropped, message)
  SELECT (($1::text[])[1])::uuid, ($2::text[])[1], ($3::text[])[1], ($4::text[])[1], p.v, (($6::text[])[1])::jsonb,
         coalesce(($7::timestamptz[])[1], now()), ($8::int8[])[1], (($9::text[])[1])::pg_lsn, ($10::timestamptz[])[1],
         {{search}},
         nullif(($14::int4[])[1], 0), ($16::bool[])[1]
  FROM (SELECT (($5::text[])[1])::jsonb AS v) AS p
  {{absent}}
  {{conflict}}
  RETURNING id, endpoint
),
dl AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status, lease_owner, kept, last_error
                                  , attempt_count, delivered_at, last_status_code, last_response_ms, last_response, commit_to_delivery_ms, updated_at, -- delivered
                                  attempt_target, attempted_by -- delivered
                                  )
  SELECT ev.id, ev.endpoint, ($15::text[])[1], ($11::text[])[1],
         CASE WHEN ($11::text[])[1] = 'in_flight' THEN $13 END, ($11::text[])[1] = 'in_flight',
         nullif(($12::text[])[1], '')
         , CASE WHEN ($11::text[])[1] = 'delivered' THEN 1 ELSE 0 END, ($17::timestamptz[])[1], ($18::int4[])[1], -- delivered
         ($19::float4[])[1], nullif(($20::text[])[1], ''), nullif(($21::float4[])[1], -1), -- delivered
         coalesce(($17::timestamptz[])[1], now()), -- delivered
         CASE WHEN ($11::text[])[1] = 'delivered' THEN nullif(($22::text[])[1], '') END, -- delivered
         CASE WHEN ($11::text[])[1] = 'delivered' THEN $13 END -- delivered
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
// of the statements without their "-- delivered" lines ($1 to $16), and
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
		created, committed                             = make([]*time.Time, n), make([]*time.Time, n)
		// the first attempts that delivered before the insert (Delivered)
		doneAt          []*time.Time
		codes           []*int32
		ms, c2d         []*float32
		bodies, targets []*string
	)
	if done {
		doneAt, codes = make([]*time.Time, n), make([]*int32, n)
		ms, c2d, bodies, targets = make([]*float32, n), make([]*float32, n), make([]*string, n), make([]*string, n)
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
			bodies[i], targets[i] = &r.Response, &r.Target
			if code != 0 {
				codes[i] = &code
			}
		}
	}
	args := []any{ids, endpoints, urls, types, payloads, headers, created, outboxIDs, lsns, committed, statuses, errs, owner, dropped, lanes, messages}
	if done {
		args = append(args, doneAt, codes, ms, bodies, c2d, targets)
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

// saveCheckpointSQL stores the end LSN of an ingested transaction, and the
// server it came from, if the caller still holds leadership token $3;
// otherwise it raises PBF01 (postbox.checkpoint_fenced) and the caller's
// whole ingest transaction rolls back. A plain statement, not a PL/pgSQL
// call: the function call cost more than the update.
const saveCheckpointSQL = `
WITH saved AS (
  UPDATE postbox.checkpoints
  SET lsn = greatest(lsn, $2::pg_lsn), system_id = $4, timeline = $5, updated_at = now()
  WHERE slot = $1 AND fencing = $3
  RETURNING 1
)
SELECT postbox.checkpoint_fenced($1, $3) WHERE NOT EXISTS (SELECT FROM saved)`

// Commit stores the checkpoint (when lsn is not zero) and commits; with notify, it wakes every instance's
// claimer as it commits (rows were queued). Without an open transaction it
// stores only the checkpoint.
func (ic *IngestConn) Commit(ctx context.Context, lsn pglogrepl.LSN, notify bool) error {
	_, err := ic.commit(ctx, lsn, notify, false)
	return err
}

// CommitUnflushed commits as Commit does, but without waiting for the
// server to flush the commit to its WAL (synchronous_commit = off), which
// a crash of the server (not of postbox) would then undo. It returns a WAL
// position at or past the commit's record: once the server has flushed
// that far, the commit is durable. (That holds as well for the checkpoint
// alone, written without an open transaction, which follows the server's
// synchronous_commit.) It returns 0 when there was nothing to write.
func (ic *IngestConn) CommitUnflushed(ctx context.Context, lsn pglogrepl.LSN, notify bool) (pglogrepl.LSN, error) {
	return ic.commit(ctx, lsn, notify, true)
}

func (ic *IngestConn) commit(ctx context.Context, lsn pglogrepl.LSN, notify, unflushed bool) (pglogrepl.LSN, error) {
	b := &pgx.Batch{}
	if !ic.inTx && lsn == 0 {
		return 0, nil
	}
	if unflushed && ic.inTx {
		b.Queue("SET LOCAL synchronous_commit = off")
	}
	if notify {
		b.Queue(`SELECT pg_notify($1, '')`, WakeChannel)
	}
	if lsn != 0 {
		b.Queue(saveCheckpointSQL, ic.s.Slot, lsn.String(), ic.lead.Token, ic.systemID, ic.timeline)
	}
	if ic.inTx {
		b.Queue("COMMIT")
	}
	if unflushed {
		// The insert position once the commit has returned lies past its
		// commit record.
		b.Queue("SELECT pg_current_wal_insert_lsn()::text")
	}
	var flushBy pglogrepl.LSN
	br := ic.conn.SendBatch(ctx, b)
	var err error
	if unflushed {
		flushBy, err = lastLSN(br, b.Len())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && ic.inTx {
		// A failed statement left the transaction aborted: end it.
		_, _ = ic.conn.Exec(context.Background(), "ROLLBACK")
	}
	ic.inTx = false
	if IsFenced(err) {
		return 0, fmt.Errorf("commit ingest: %w", ErrFenced)
	}
	if err != nil {
		return 0, fmt.Errorf("commit ingest: %w", err)
	}
	return flushBy, nil
}

// FlushWAL makes everything committed before it durable, also what was
// committed without waiting for its flush (IngestConn.CommitUnflushed):
// it commits a transaction of its own that waits for its WAL flush
// whatever the server's synchronous_commit, and returns how far the
// server's WAL is then flushed. The transaction writes the slot's
// checkpoint row unchanged: a commit waits for its flush only when the
// transaction wrote to the WAL before it.
func (s *Store) FlushWAL(ctx context.Context) (pglogrepl.LSN, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = local")
	b.Queue("UPDATE postbox.checkpoints SET lsn = lsn WHERE slot = $1", s.Slot)
	b.Queue("COMMIT")
	b.Queue("SELECT pg_current_wal_flush_lsn()::text")
	br := s.Pool.SendBatch(ctx, b)
	flushed, err := lastLSN(br, b.Len())
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("flush the WAL: %w", err)
	}
	return flushed, nil
}

// lastLSN reads the results of a batch of n statements whose last returns
// a WAL position as text, and returns that position.
func lastLSN(br pgx.BatchResults, n int) (pglogrepl.LSN, error) {
	for range n - 1 {
		if _, err := br.Exec(); err != nil {
			return 0, err
		}
	}
	var text string
	if err := br.QueryRow().Scan(&text); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(text)
}

// Rollback abandons the open transaction, if any. Its error is the
// server's word on the transaction when it ended the session first (an
// idle_in_transaction_session_timeout, a terminated backend).
func (ic *IngestConn) Rollback(ctx context.Context) error {
	if !ic.inTx {
		return nil
	}
	ic.inTx = false
	if _, err := ic.conn.Exec(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("roll back the ingest: %w", err)
	}
	return nil
}

// Release returns the connection to the pool (closing it when a
// transaction was left open, so no half-written batch survives).
func (ic *IngestConn) Release() {
	if ic.inTx {
		_ = ic.conn.Conn().Close(context.Background())
	} else {
		_, _ = ic.conn.Exec(context.Background(), "RESET plan_cache_mode; RESET enable_nestloop; RESET enable_seqscan")
	}
	ic.conn.Release()
}

// Checkpoint is where ingestion stands for a slot, and on which server.
type Checkpoint struct {
	LSN      pglogrepl.LSN // end of the last ingested transaction (0: none)
	SystemID string        // the server's system identifier then ("": unknown)
	Timeline int32
	// ReconcilePending: a leader found the outbox owed a reconciliation
	// and has not finished it.
	ReconcilePending bool
}

// Checkpoint returns the slot's checkpoint (zero when none).
func (s *Store) Checkpoint(ctx context.Context) (Checkpoint, error) {
	var text string
	var c Checkpoint
	var sys *string
	var tli *int32
	err := s.Pool.QueryRow(ctx, `SELECT lsn::text, system_id, timeline, reconcile_pending FROM postbox.checkpoints WHERE slot = $1`, s.Slot).
		Scan(&text, &sys, &tli, &c.ReconcilePending)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read checkpoint: %w", err)
	}
	if sys != nil {
		c.SystemID = *sys
	}
	if tli != nil {
		c.Timeline = *tli
	}
	c.LSN, err = pglogrepl.ParseLSN(text)
	return c, err
}

// SetReconcilePending records (or clears) that the outbox table must be
// reconciled: rows were written that the slot will never bring.
func (s *Store) SetReconcilePending(ctx context.Context, pending bool) error {
	if _, err := s.Pool.Exec(ctx, `UPDATE postbox.checkpoints SET reconcile_pending = $2 WHERE slot = $1`, s.Slot, pending); err != nil {
		return fmt.Errorf("record reconciliation owed: %w", err)
	}
	return nil
}

// ErrFenced means another instance took over streaming: this one's
// leadership token is stale and its checkpoint write was refused.
var ErrFenced = errors.New("fenced off: another instance took over streaming")

// codeFenced is the SQLSTATE postbox.checkpoint_fenced (and the previous
// version's save_checkpoint) raises when fenced.
const codeFenced = "PBF01"

// IsFenced reports whether err is a fenced checkpoint write.
func IsFenced(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, ErrFenced) || (errors.As(err, &pgErr) && pgErr.Code == codeFenced)
}

// Leadership is a held lease on streaming a slot.
type Leadership struct {
	Token int64
}

// AcquireLeadership makes owner the slot's streamer if nobody holds a
// current lease (or owner already does), with a new fencing token. It
// reports false, with the current leader, when another instance leads.
func (s *Store) AcquireLeadership(ctx context.Context, owner string, lease time.Duration) (Leadership, bool, string, error) {
	var token int64
	err := s.Pool.QueryRow(ctx, `
		INSERT INTO postbox.checkpoints AS c (slot, leader, fencing, lease_expires_at)
		VALUES ($1, $2, 1, now() + $3 * interval '1 second')
		ON CONFLICT (slot) DO UPDATE SET leader = $2, fencing = c.fencing + 1,
		                                 lease_expires_at = now() + $3 * interval '1 second'
		WHERE c.leader IS NULL OR c.leader = $2 OR c.lease_expires_at < now()
		RETURNING fencing`, s.Slot, owner, lease.Seconds()).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		var leader string
		_ = s.Pool.QueryRow(ctx, `SELECT coalesce(leader, '') FROM postbox.checkpoints WHERE slot = $1`, s.Slot).Scan(&leader)
		return Leadership{}, false, leader, nil
	}
	if err != nil {
		return Leadership{}, false, "", fmt.Errorf("acquire leadership: %w", err)
	}
	return Leadership{Token: token}, true, owner, nil
}

// RenewLeadership extends owner's lease; it reports false once another
// instance has taken over.
func (s *Store) RenewLeadership(ctx context.Context, owner string, l Leadership, lease time.Duration) (bool, error) {
	tag, err := s.Pool.Exec(ctx, `
		UPDATE postbox.checkpoints SET lease_expires_at = now() + $4 * interval '1 second'
		WHERE slot = $1 AND leader = $2 AND fencing = $3`, s.Slot, owner, l.Token, lease.Seconds())
	if err != nil {
		return false, fmt.Errorf("renew leadership: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseLeadership gives the lease up, so a standby takes over at once.
func (s *Store) ReleaseLeadership(ctx context.Context, owner string, l Leadership) error {
	_, err := s.Pool.Exec(ctx, `
		UPDATE postbox.checkpoints SET leader = NULL, lease_expires_at = NULL
		WHERE slot = $1 AND leader = $2 AND fencing = $3`, s.Slot, owner, l.Token)
	return err
}

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
		  AND NOT EXISTS (SELECT 1 FROM postbox.events e WHERE e.event_id = o.event_id AND e.endpoint = left(o.endpoint, `+endpointKept+`))
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
		// A NULL where the contract wants a value (a table made by hand)
		// makes the row a dead letter, as the stream does; it never stops
		// reconciliation.
		for _, c := range []struct {
			name string
			v    *string
			dst  *string
		}{{"endpoint", endpoint, &r.Endpoint}, {"payload", payload, nil}, {"event_type", eventType, &r.EventType}} {
			switch {
			case c.v == nil && c.name != "event_type" && (c.name != "payload" || r.PayloadTooLarge == 0):
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

// PurgeIngestedOutbox looks at up to window outbox rows, in the order of
// their ids, from the first after after, and deletes those older than
// retention that have been ingested (their event id and endpoint are in
// postbox.events). It returns how many it deleted and where the next
// purge goes on: after the last row it looked at, or from the start (0)
// once it reached the end of the table or a row younger than retention.
//
// It reads the table through its primary key, a window at a time, never
// the whole table: an outbox kept for hours holds hours of rows, and one
// that is emptied at the ingest (retention 0) holds its deleted rows
// until vacuum. Ids follow the inserts, so the oldest rows come first;
// rows that are old but not ingested (left for reconciliation) do not
// stop the purge, which steps over them to the rows after.
func (s *Store) PurgeIngestedOutbox(ctx context.Context, retention time.Duration, after int64, window int) (deleted, next int64, err error) {
	var last int64
	var seen int
	var young bool
	err = s.Pool.QueryRow(ctx, purgeOutboxSQL(s.Table.Ident()), retention.Seconds(), after, window).Scan(&deleted, &last, &seen, &young)
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
// is younger than $1.
func purgeOutboxSQL(table string) string {
	return `
		WITH w AS MATERIALIZED (
		  SELECT o.id, o.event_id, o.endpoint, o.created_at < now() - $1 * interval '1 second' AS old
		  FROM ` + table + ` o WHERE o.id > $2 ORDER BY o.id LIMIT $3
		), gone AS (
		  DELETE FROM ` + table + ` o USING w
		  WHERE o.id = w.id AND w.old
		    AND EXISTS (SELECT 1 FROM postbox.events e WHERE e.event_id = w.event_id AND e.endpoint = left(w.endpoint, ` + endpointKept + `))
		  RETURNING o.id
		)
		SELECT (SELECT count(*) FROM gone), coalesce((SELECT max(id) FROM w), 0), (SELECT count(*) FROM w),
		       coalesce((SELECT NOT bool_and(old) FROM w), false)`
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
