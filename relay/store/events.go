package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NewEvent is an outbox row to ingest, with its delivery's first state
// already decided: in_flight (claimed by this instance for the in-memory
// fast path), pending (for the queue), or dead_letter (with LastError).
type NewEvent struct {
	EventID     string
	Endpoint    string
	URL         string // "" is NULL
	EventType   string
	Payload     []byte // JSON text
	Headers     []byte // JSON text; nil is NULL
	CreatedAt   string // timestamptz as PostgreSQL prints it (UTC, ISO)
	OutboxID    int64
	CommitLSN   pglogrepl.LSN // 0 when found by reconciliation
	CommittedAt time.Time     // zero when unknown
	Status      string
	LastError   string
}

// Ingested identifies the delivery created for NewEvent number Index of an
// Insert call. Events that were already ingested get none.
type Ingested struct {
	Index      int
	DeliveryID int64
	EventPK    int64
}

// insertEventsSQL writes events and their first deliveries in one
// statement. Rows are inserted in (event_id, endpoint) order, the unique
// key's order, so two ingests of overlapping rows (the stream and a
// reconciliation) lock in the same order and cannot deadlock.
const insertEventsSQL = `
WITH input AS (
  SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                       $7::text[], $8::int8[], $9::text[], $10::timestamptz[], $11::text[], $12::text[])
    WITH ORDINALITY AS i(event_id, endpoint, url, event_type, payload, headers,
                         created_at, outbox_id, commit_lsn, committed_at, status, last_error, ord)
),
ev AS (
  INSERT INTO postbox.events (event_id, endpoint, url, event_type, payload, headers,
                              created_at, outbox_id, commit_lsn, committed_at)
  SELECT event_id, endpoint, url, event_type, payload::jsonb, headers::jsonb,
         created_at::timestamptz, outbox_id, commit_lsn::pg_lsn, committed_at
  FROM input ORDER BY event_id, endpoint
  ON CONFLICT (event_id, endpoint) DO NOTHING
  RETURNING id, event_id, endpoint
),
dl AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, status, lease_owner, last_error)
  SELECT ev.id, ev.endpoint, i.status,
         CASE WHEN i.status = 'in_flight' THEN $13 END,
         nullif(i.last_error, '')
  FROM ev JOIN input i ON i.event_id = ev.event_id AND i.endpoint = ev.endpoint
  ORDER BY i.ord -- delivery ids follow commit order: ordered endpoints rely on it
  RETURNING id, event_pk
)
SELECT i.ord, dl.id, dl.event_pk
FROM dl JOIN ev ON ev.id = dl.event_pk JOIN input i ON i.event_id = ev.event_id AND i.endpoint = ev.endpoint`

func insertEventsArgs(owner string, evs []NewEvent) []any {
	n := len(evs)
	var (
		ids, endpoints, urls, types, payloads, headers = make([]string, n), make([]string, n), make([]*string, n), make([]string, n), make([]string, n), make([]*string, n)
		created, lsns, statuses, errs                  = make([]string, n), make([]*string, n), make([]string, n), make([]string, n)
		outboxIDs                                      = make([]*int64, n)
		committed                                      = make([]*time.Time, n)
	)
	for i := range evs {
		e := &evs[i]
		ids[i], endpoints[i], types[i], payloads[i] = e.EventID, e.Endpoint, e.EventType, string(e.Payload)
		created[i], statuses[i], errs[i] = e.CreatedAt, e.Status, e.LastError
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
	}
	return []any{ids, endpoints, urls, types, payloads, headers, created, outboxIDs, lsns, committed, statuses, errs, owner}
}

// IngestConn writes ingested events on one connection, in transactions
// that it opens on the first Insert and closes with Commit, which also
// stores the checkpoint. BEGIN and the insert travel together, and so do
// the checkpoint and COMMIT, so a transaction costs two round trips; the
// caller may start delivering between them.
type IngestConn struct {
	conn  *pgxpool.Conn
	s     *Store
	inTx  bool
	owner string
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
	// safe here and saves planning on the latency path.
	if _, err := c.Exec(ctx, "SET plan_cache_mode = auto"); err != nil {
		c.Release()
		return nil, err
	}
	return &IngestConn{conn: c, s: s, owner: owner}, nil
}

// InTx reports whether a transaction is open.
func (ic *IngestConn) InTx() bool { return ic.inTx }

// Insert writes events (deduplicated by event id and endpoint) in the open
// transaction, opening one if needed. The returned deliveries exist once
// Commit succeeds.
func (ic *IngestConn) Insert(ctx context.Context, evs []NewEvent) ([]Ingested, error) {
	evs, orig := dedupe(evs)
	b := &pgx.Batch{}
	if !ic.inTx {
		b.Queue("BEGIN")
	}
	b.Queue(insertEventsSQL, insertEventsArgs(ic.owner, evs)...)
	br := ic.conn.SendBatch(ctx, b)
	if !ic.inTx {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("begin ingest: %w", err)
		}
		ic.inTx = true
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
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("insert events: %w", err)
	}
	return out, nil
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

// Commit stores the checkpoint (when lsn is not zero), deletes the given
// outbox rows, and commits; with notify, it wakes every instance's
// claimer as it commits (rows were queued). Without an open transaction it
// stores only the checkpoint.
func (ic *IngestConn) Commit(ctx context.Context, lsn pglogrepl.LSN, outboxIDs []int64, notify bool) error {
	b := &pgx.Batch{}
	if !ic.inTx && lsn == 0 {
		return nil
	}
	if notify {
		b.Queue(`SELECT pg_notify($1, '')`, WakeChannel)
	}
	if lsn != 0 {
		b.Queue(saveCheckpointSQL, ic.s.Slot, lsn.String())
	}
	if len(outboxIDs) > 0 {
		b.Queue(`DELETE FROM `+ic.s.Table.Ident()+` WHERE id = ANY($1)`, outboxIDs)
	}
	if ic.inTx {
		b.Queue("COMMIT")
	}
	err := ic.conn.SendBatch(ctx, b).Close()
	ic.inTx = false
	if err != nil {
		return fmt.Errorf("commit ingest: %w", err)
	}
	return nil
}

// Rollback abandons the open transaction, if any.
func (ic *IngestConn) Rollback(ctx context.Context) {
	if ic.inTx {
		_, _ = ic.conn.Exec(ctx, "ROLLBACK")
		ic.inTx = false
	}
}

// Release returns the connection to the pool (closing it when a
// transaction was left open, so no half-written batch survives).
func (ic *IngestConn) Release() {
	if ic.inTx {
		_ = ic.conn.Conn().Close(context.Background())
	} else {
		_, _ = ic.conn.Exec(context.Background(), "RESET plan_cache_mode")
	}
	ic.conn.Release()
}

const saveCheckpointSQL = `
INSERT INTO postbox.checkpoints (slot, lsn, updated_at) VALUES ($1, $2::pg_lsn, now())
ON CONFLICT (slot) DO UPDATE SET lsn = greatest(checkpoints.lsn, excluded.lsn), updated_at = now()`

// Checkpoint returns the end LSN of the last ingested transaction for the
// slot (0 when none).
func (s *Store) Checkpoint(ctx context.Context) (pglogrepl.LSN, error) {
	var text string
	err := s.Pool.QueryRow(ctx, `SELECT lsn::text FROM postbox.checkpoints WHERE slot = $1`, s.Slot).Scan(&text)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read checkpoint: %w", err)
	}
	return pglogrepl.ParseLSN(text)
}

// ResetCheckpoint forgets the checkpoint, for a new slot or server whose
// LSNs the old one cannot be compared with.
func (s *Store) ResetCheckpoint(ctx context.Context) error {
	_, err := s.Pool.Exec(ctx, `DELETE FROM postbox.checkpoints WHERE slot = $1`, s.Slot)
	return err
}

// OutboxRow is an outbox row read by reconciliation.
type OutboxRow struct {
	ID        int64
	EventID   string
	Endpoint  string
	URL       string
	EventType string
	Payload   []byte
	Headers   []byte
	CreatedAt string
}

// UningestedOutbox returns up to limit outbox rows with id > after that are
// not in postbox.events, in id order.
func (s *Store) UningestedOutbox(ctx context.Context, after int64, limit int) ([]OutboxRow, error) {
	rows, err := s.Pool.Query(ctx, `
		SELECT o.id, o.event_id::text, o.endpoint, coalesce(o.url, ''), o.event_type,
		       o.payload::text, o.headers::text, o.created_at::text
		FROM `+s.Table.Ident()+` o
		WHERE o.id > $1
		  AND NOT EXISTS (SELECT 1 FROM postbox.events e WHERE e.event_id = o.event_id AND e.endpoint = o.endpoint)
		ORDER BY o.id LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	var out []OutboxRow
	for rows.Next() {
		var r OutboxRow
		var payload string
		var headers *string
		if err := rows.Scan(&r.ID, &r.EventID, &r.Endpoint, &r.URL, &r.EventType, &payload, &headers, &r.CreatedAt); err != nil {
			return nil, fmt.Errorf("read outbox: %w", err)
		}
		r.Payload = []byte(payload)
		if headers != nil {
			r.Headers = []byte(*headers)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// PurgeIngestedOutbox deletes up to limit outbox rows older than retention
// that have been ingested, and returns how many it deleted.
func (s *Store) PurgeIngestedOutbox(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	tag, err := s.Pool.Exec(ctx, `
		DELETE FROM `+s.Table.Ident()+` WHERE id IN (
		  SELECT o.id FROM `+s.Table.Ident()+` o
		  WHERE o.created_at < now() - $1 * interval '1 second'
		    AND EXISTS (SELECT 1 FROM postbox.events e WHERE e.event_id = o.event_id AND e.endpoint = o.endpoint)
		  LIMIT $2)`, retention.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("purge outbox: %w", err)
	}
	return tag.RowsAffected(), nil
}
