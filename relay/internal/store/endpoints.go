// The endpoints as applied (postbox.endpoint_state): the streaming
// instance writes each change of postbox.endpoints in the ingest
// transaction of the events after it, seeds the whole table once per slot
// (and after a reconciliation), and every instance reads them from here.

package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// since a position learn of deletes too, until PurgeEndpointTombstones).
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
  revision = excluded.revision, lsn = excluded.lsn, written_at = now()
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

// seedEndpointsSQL copies the rows of postbox.endpoints into
// endpoint_state in one statement, each as the JSON object of its
// columns' text output (as the stream sends them); %s is the columns'
// values in the order $1 names them. NULL columns and the times no
// instance reads are left out, as every reader of endpoint_state leaves
// them (a column missing is NULL to endpoints.Parse): a row set with a
// few columns is a third of the bytes to write. Each replaces the
// applied row unless that is of a later revision, or the same: a seed
// owed again (after a reconciliation) writes only what the stream
// missed, and the instance reads the table again only if it wrote
// something. Rows applied already are passed over by the join, not by
// the conflict clause, which would lock each. Done in the server: a read
// of every row into postbox and its write back, a chunk at a time, took
// seconds for 100,000 rows.
var seedEndpointsSQL = `
WITH t AS (
  SELECT e.name, jsonb_strip_nulls(jsonb_object($1::text[], ARRAY[%s]::text[])) - 'created_at' - 'updated_at' AS row, e.revision
  FROM postbox.endpoints e
)
INSERT INTO postbox.endpoint_state AS s (name, row, revision, lsn)
SELECT t.name, t.row, t.revision, $2::pg_lsn
FROM t LEFT JOIN postbox.endpoint_state o ON o.name = t.name
WHERE o.name IS NULL OR o.revision <= t.revision AND ` + appliedRow("o.row") + ` IS DISTINCT FROM t.row
ON CONFLICT (name) DO UPDATE SET row = excluded.row, revision = excluded.revision, lsn = excluded.lsn, written_at = now()
WHERE s.revision <= excluded.revision AND ` + appliedRow("s.row") + ` IS DISTINCT FROM excluded.row`

// appliedRow is the applied row col as a reader sees it, to compare with
// a seed's: one the stream wrote has its NULL columns and times.
func appliedRow(col string) string {
	return "CASE WHEN jsonb_typeof(" + col + ") = 'object' THEN jsonb_strip_nulls(" + col + ") - 'created_at' - 'updated_at' ELSE " + col + " END"
}

// endpointColumnsSQL names the columns of postbox.endpoints, as SELECT *
// reads them, and says which are boolean.
const endpointColumnsSQL = `
SELECT attname::text, atttypid = 'boolean'::regtype FROM pg_attribute
WHERE attrelid = 'postbox.endpoints'::regclass AND attnum > 0 AND NOT attisdropped
ORDER BY attnum`

// seedSQL is seedEndpointsSQL for the columns named. A cast to text is
// the type's output, which the stream sends, but for a boolean ('true'
// where the output is 't'); format('%s', …) would be right for every
// type, at twice the server's time.
func seedSQL(columns []string, boolean []bool) string {
	values := make([]string, len(columns))
	for i, c := range columns {
		col := "e." + pgx.Identifier{c}.Sanitize()
		if boolean[i] {
			values[i] = "CASE WHEN " + col + " THEN 't' WHEN NOT " + col + " THEN 'f' END"
		} else {
			values[i] = col + "::text"
		}
	}
	return fmt.Sprintf(seedEndpointsSQL, strings.Join(values, ", "))
}

// SeedEndpoints copies postbox.endpoints whole into endpoint_state (rows
// gone from the table become tombstones) as of position lsn, in one
// transaction, and marks the slot's copy seeded. The stream's changes
// committed around it come again; their revisions make that harmless.
// Run by the leader before it streams, so no ingest runs beside it. It
// returns the rows it wrote, tombstones included: none when
// endpoint_state held the table already.
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
		var columns []string
		var boolean []bool
		var column string
		var isBool bool
		rows, err := tx.Query(ctx, endpointColumnsSQL)
		if err != nil {
			return err
		}
		if _, err := pgx.ForEachRow(rows, []any{&column, &isBool}, func() error {
			columns, boolean = append(columns, column), append(boolean, isBool)
			return nil
		}); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, seedSQL(columns, boolean), columns, rowsAt.String())
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		b := &pgx.Batch{}
		b.Queue(`UPDATE postbox.endpoint_state s SET row = 'null', lsn = $1::pg_lsn, written_at = now()
			WHERE jsonb_typeof(s.row) = 'object' AND NOT EXISTS (SELECT 1 FROM postbox.endpoints e WHERE e.name = s.name)`, rowsAt.String()).
			Exec(func(tag pgconn.CommandTag) error {
				n += int(tag.RowsAffected())
				return nil
			})
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
// since the slot was made and since a reconciliation was last owed (see
// SetReconcilePending).
func (s *Store) EndpointsSeeded(ctx context.Context) (bool, error) {
	var seeded bool
	err := s.Pool.QueryRow(ctx, `SELECT endpoints_seeded FROM postbox.checkpoints WHERE slot = $1`, s.Slot).Scan(&seeded)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the checkpoint: %w", err)
	}
	return seeded, nil
}

// readEndpointStateSQL reads, in one snapshot, how far the ingest has
// gone (every endpoint change committed before it is in endpoint_state)
// and the rows applied at or after $2: those of the same position are
// read again, harmlessly, rather than one written at it missed. The
// positions are read as numbers: parsing 100,000 of them as text took a
// tenth of the start-up's read.
const readEndpointStateSQL = `
SELECT (c.lsn - '0/0')::int8, s.name,
       CASE WHEN jsonb_typeof(s.row) = 'object' THEN jsonb_strip_nulls(s.row) - 'created_at' - 'updated_at' ELSE s.row END::text,
       s.revision, (s.lsn - '0/0')::int8
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
	var cp int64
	var row []byte
	var rev, lsnP *int64
	var nameP *string
	for rows.Next() {
		row = row[:0]
		if err := rows.Scan(&cp, &nameP, &row, &rev, &lsnP); err != nil {
			return 0, fmt.Errorf("read endpoint_state: %w", err)
		}
		at = pglogrepl.LSN(cp)
		if nameP == nil {
			continue
		}
		st := EndpointState{Name: *nameP, Revision: *rev, LSN: pglogrepl.LSN(*lsnP)}
		if st.Row, err = decodeRow(row); err != nil {
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
