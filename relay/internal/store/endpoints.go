// The endpoints as applied (postbox.endpoint_state): the streaming
// instance writes each change of postbox.endpoints in the ingest
// transaction of the events after it, seeds the whole table once per slot
// (and after a reconciliation), and every instance reads them from here.

package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// EndpointsChannel is NOTIFYed as an ingest that applied endpoint changes
// commits: every instance reads endpoint_state again.
const EndpointsChannel = "postbox_endpoints"

// EndpointWrite is one change of postbox.endpoints to apply: Row is the
// columns' text output as a JSON object (a column left out keeps the
// value applied before: an unchanged TOAST value), nil for a delete.
type EndpointWrite struct {
	Name string
	// From, on an update that renamed the row, is its old name: the
	// columns the update left out are kept from that name's row.
	From     string
	Row      []byte
	Revision int64
	LSN      pglogrepl.LSN // the change's commit
}

// EndpointState is a row of postbox.endpoint_state: Row nil is a deleted
// endpoint (a tombstone, kept so that instances reading what changed
// since a position learn of deletes too).
type EndpointState struct {
	Name string
	Row  map[string]*string
	// Text is Row as read, its JSON (ScanEndpointState; nil for a delete).
	Text     []byte
	Revision int64
	LSN      pglogrepl.LSN
}

// applyEndpointSQL applies a change over the applied row unless that is
// of a later revision: an update's row is merged into the applied one
// (its TOAST-unchanged columns left out keep theirs); an insert's, a
// delete's tombstone (JSON null), or anything over a tombstone replaces
// it. A delete keeps its row's revision, so that the row inserted again
// later (a later revision) is applied over it.
const applyEndpointSQL = `
INSERT INTO postbox.endpoint_state AS s (name, row, revision, lsn)
VALUES ($1, CASE WHEN $6 <> '' AND NOT $5 AND jsonb_typeof($2::jsonb) = 'object'
                 THEN coalesce((SELECT o.row FROM postbox.endpoint_state o WHERE o.name = $6 AND jsonb_typeof(o.row) = 'object'), '{}') || $2::jsonb
                 ELSE $2::jsonb END,
        $3, $4::pg_lsn)
ON CONFLICT (name) DO UPDATE SET
  row = CASE WHEN jsonb_typeof(s.row) = 'object' AND jsonb_typeof(excluded.row) = 'object' AND NOT $5
             THEN s.row || excluded.row ELSE excluded.row END,
  revision = excluded.revision, lsn = excluded.lsn
WHERE s.revision <= excluded.revision`

// WriteEndpoints applies endpoint changes, in order, in the open ingest
// transaction (opening one); its commit then stores the checkpoint's
// endpoints_lsn and NOTIFYs EndpointsChannel. replace marks rows that are
// whole (an insert, a seed): they replace the applied row rather than
// merge into it.
func (ic *IngestConn) WriteEndpoints(ctx context.Context, ws []EndpointWrite, replace []bool) error {
	if len(ws) == 0 {
		return nil
	}
	b := ic.newBatch()
	for i, w := range ws {
		queueApplyEndpoint(b, w, replace[i])
		ic.endpointsLSN = max(ic.endpointsLSN, w.LSN)
	}
	br, err := ic.sendBatch(ctx, b)
	if err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("apply endpoint changes: %w", err)
	}
	return nil
}

func queueApplyEndpoint(b *pgx.Batch, w EndpointWrite, replace bool) {
	row := w.Row
	if row == nil {
		row = []byte("null")
	}
	b.Queue(applyEndpointSQL, w.Name, string(row), w.Revision, w.LSN.String(), replace, w.From)
}

// seedEndpointsSQL writes a chunk of the seed, whole rows, in one
// statement rather than applyEndpointSQL's replace a row at a time (see
// docs/benchmarks.md): each replaces the applied row unless that is of a
// later revision.
const seedEndpointsSQL = `
INSERT INTO postbox.endpoint_state AS s (name, row, revision, lsn)
SELECT u.name, u.row::jsonb, u.revision, $4::pg_lsn
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(name, row, revision)
ON CONFLICT (name) DO UPDATE SET row = excluded.row, revision = excluded.revision, lsn = excluded.lsn
WHERE s.revision <= excluded.revision`

// SeedChunkDefault is the rows of postbox.endpoints SeedEndpoints reads
// and writes at a time.
const SeedChunkDefault = 1000

// seedChunk reads the seed cursor's next rows in their text format, as
// the stream sends them.
func seedChunk(ctx context.Context, tx pgx.Tx, lsn pglogrepl.LSN) ([]EndpointWrite, error) {
	rows, err := tx.Query(ctx, `FETCH `+strconv.Itoa(SeedChunkDefault)+` FROM postbox_seed`, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ws []EndpointWrite
	for rows.Next() {
		fields := rows.FieldDescriptions()
		row := make(map[string]*string, len(fields))
		for i, v := range rows.RawValues() {
			if v == nil {
				row[fields[i].Name] = nil
				continue
			}
			t := string(v)
			row[fields[i].Name] = &t
		}
		w := EndpointWrite{LSN: lsn}
		if v := row["name"]; v != nil {
			w.Name = *v
		}
		if v := row["revision"]; v != nil {
			if _, err := fmt.Sscan(*v, &w.Revision); err != nil {
				return nil, fmt.Errorf("revision of %s: %w", w.Name, err)
			}
		}
		if w.Row, err = json.Marshal(row); err != nil {
			return nil, err
		}
		ws = append(ws, w)
	}
	return ws, rows.Err()
}

// SeedEndpoints copies postbox.endpoints whole into endpoint_state (rows
// gone from the table become tombstones) as of position lsn, in one
// transaction, and marks the slot's copy seeded. The stream's changes
// committed around it come again; their revisions make that harmless.
// Run by the leader before it streams, so no ingest runs beside it.
func (s *Store) SeedEndpoints(ctx context.Context, lsn pglogrepl.LSN) (int, error) {
	n := 0
	// The rows are written just below lsn, the checkpoint's position: a
	// read of endpoint_state takes rows at or after the ingest position it
	// last read (rows at it may be followed by more), and rows at it would
	// be read again, every one, until the checkpoint moves. Below it, they
	// are what every change committed before it left.
	rowsAt := lsn
	if rowsAt > 0 {
		rowsAt--
	}
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		// Read through a cursor SeedChunkDefault rows at a time, each
		// chunk written before the next is read: 100,000 rows read and
		// queued at once held hundreds of MB.
		if _, err := tx.Exec(ctx, `DECLARE postbox_seed NO SCROLL CURSOR FOR SELECT * FROM postbox.endpoints`); err != nil {
			return err
		}
		names := []string{} // not NULL: ANY(NULL) would tombstone nothing
		for {
			ws, err := seedChunk(ctx, tx, lsn)
			if err != nil {
				return err
			}
			if len(ws) == 0 {
				break
			}
			chunk := make([]string, len(ws))
			texts := make([]string, len(ws))
			revisions := make([]int64, len(ws))
			for i, w := range ws {
				chunk[i], texts[i], revisions[i] = w.Name, string(w.Row), w.Revision
			}
			if _, err := tx.Exec(ctx, seedEndpointsSQL, chunk, texts, revisions, rowsAt.String()); err != nil {
				return err
			}
			names = append(names, chunk...)
			n += len(ws)
		}
		b := &pgx.Batch{}
		b.Queue(`UPDATE postbox.endpoint_state SET row = 'null', lsn = $2::pg_lsn
			WHERE jsonb_typeof(row) = 'object' AND NOT (name = ANY($1::text[]))`, names, rowsAt.String())
		b.Queue(`UPDATE postbox.checkpoints SET endpoints_seeded = true, endpoints_lsn = greatest(endpoints_lsn, $2::pg_lsn)
			WHERE slot = $1`, s.Slot, lsn.String())
		b.Queue(`SELECT pg_notify($1, '')`, EndpointsChannel)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, fmt.Errorf("seed endpoint_state from postbox.endpoints: %w", err)
	}
	return n, nil
}

// EndpointsSeeded reports whether the slot's endpoint_state was seeded
// and whether a reconciliation is owed (which seeds it again).
func (s *Store) EndpointsSeeded(ctx context.Context) (seeded, reconcile bool, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT endpoints_seeded, reconcile_pending FROM postbox.checkpoints WHERE slot = $1`, s.Slot).
		Scan(&seeded, &reconcile)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("read the checkpoint: %w", err)
	}
	return seeded, reconcile, nil
}

// readEndpointStateSQL reads, in one snapshot, how far the ingest has
// gone (every endpoint change committed before it is in endpoint_state)
// and the rows applied at or after $2: those of the same position are
// read again, harmlessly, rather than one written at it missed.
const readEndpointStateSQL = `
SELECT c.lsn::text, s.name,
       CASE WHEN jsonb_typeof(s.row) = 'object' THEN jsonb_strip_nulls(s.row) - 'created_at' - 'updated_at' ELSE s.row END::text,
       s.revision, s.lsn::text
FROM (SELECT lsn FROM postbox.checkpoints WHERE slot = $1) c
LEFT JOIN postbox.endpoint_state s ON s.lsn >= $2::pg_lsn AND ($3 OR jsonb_typeof(s.row) = 'object')`

// ReadEndpointState returns the ingest's position and the rows of
// endpoint_state applied at or after since; all (tombstones left out)
// when all is set.
func (s *Store) ReadEndpointState(ctx context.Context, since pglogrepl.LSN, all bool) (pglogrepl.LSN, []EndpointState, error) {
	var out []EndpointState
	at, err := s.ScanEndpointState(ctx, since, all, func(st EndpointState) error {
		out = append(out, st)
		return nil
	})
	return at, out, err
}

// ScanEndpointState is ReadEndpointState calling each with every row as
// it is read, rather than holding them all: 100,000 rows decoded at once
// held 200 MB at start-up, where each parsed alone is garbage at once.
// Columns that are NULL are left out of a row, as the parser reads a
// missing column as NULL, and so are created_at and updated_at, which no
// instance reads.
func (s *Store) ScanEndpointState(ctx context.Context, since pglogrepl.LSN, all bool, each func(EndpointState) error) (pglogrepl.LSN, error) {
	if all {
		since = 0
	}
	rows, err := s.Pool.Query(ctx, readEndpointStateSQL, s.Slot, since.String(), !all)
	if err != nil {
		return 0, fmt.Errorf("read endpoint_state: %w", err)
	}
	defer rows.Close()
	var at pglogrepl.LSN
	var cp, name, lsn string
	var row []byte
	var rev *int64
	var nameP, lsnP *string
	for rows.Next() {
		row = row[:0]
		if err := rows.Scan(&cp, &nameP, &row, &rev, &lsnP); err != nil {
			return 0, fmt.Errorf("read endpoint_state: %w", err)
		}
		if at, err = pglogrepl.ParseLSN(cp); err != nil {
			return 0, err
		}
		if nameP == nil {
			continue
		}
		name, lsn = *nameP, *lsnP
		st := EndpointState{Name: name, Revision: *rev}
		if st.LSN, err = pglogrepl.ParseLSN(lsn); err != nil {
			return 0, err
		}
		if err := json.Unmarshal(row, &st.Row); err != nil {
			return 0, fmt.Errorf("endpoint_state row of %s: %w", st.Name, err)
		}
		if st.Row != nil {
			st.Text = slices.Clone(row)
		}
		if err := each(st); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read endpoint_state: %w", err)
	}
	return at, nil
}
