package store_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestSeedWritesEachColumnAsTheStreamSendsIt: the seed, done in the
// server, writes each row of postbox.endpoints as the JSON object of its
// columns' text output, exactly as a read of the table in the text format
// (the stream's) gives them, for every type the table has (booleans as
// 't', arrays, intervals, jsonb, times), NULLs and the row's times left
// out; a row gone from the
// table is a tombstone, one of a later revision is left as it is.
func TestSeedWritesEachColumnAsTheStreamSendsIt(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.checkpoints (slot, lsn) VALUES ($1, '0/0')`, s.Slot)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO postbox.endpoints (name, url, method, body, headers, timeout, max_attempts, backoff_base, backoff_cap,
		  failure_threshold, cooldown, max_cooldown, rate_limit, max_in_flight, success, retry_on, ordered, redact_path,
		  allow_row_url, row_url_hosts, enabled, event_types, filter, secret, secret_version, previous_secret_until)
		VALUES ('full', 'https://p.example/{{ .event_id }}?a=''b''', 'post', '{"x": "{{ .payload }}"}',
		  '{"X-A": "1", "X-B": "two \"quoted\""}', '1500 milliseconds', 7, '2 seconds', '1 hour 3 minutes',
		  4, '30 seconds', '10 minutes', '20/s', 3, '{"status": [200, 201]}', '{429,503}', true, '["a", "b"]',
		  false, '{p.example,"q,example"}', false, '{order.*,user.created}', '{"brand": "casino-de"}', 'named', 2,
		  '2026-12-07 10:11:12.345+00'),
		       ('bare', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
		  NULL, NULL, DEFAULT, NULL, NULL, NULL, DEFAULT, NULL),
		       ('newer', 'https://n.example/', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
		  NULL, NULL, DEFAULT, NULL, NULL, NULL, DEFAULT, NULL)`)
	require.NoError(t, err)
	// Applied before the seed: a row since deleted, and one of a revision
	// the table's row has not reached (the stream ahead of the read).
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO postbox.endpoint_state (name, row, revision, lsn) VALUES
		  ('gone', '{"name": "gone", "url": "https://g.example/"}', 1, '0/10'),
		  ('newer', '{"name": "newer", "url": "https://later.example/"}', 1000000, '0/10')`)
	require.NoError(t, err)

	// What the stream sends, and the seed read before: every column's
	// text output, NULL as null.
	rows, err := s.Pool.Query(ctx, `SELECT * FROM postbox.endpoints WHERE name <> 'newer'`, pgx.QueryResultFormats{pgx.TextFormatCode})
	require.NoError(t, err)
	want := map[string]map[string]*string{}
	for rows.Next() {
		row := map[string]*string{}
		for i, v := range rows.RawValues() {
			name := rows.FieldDescriptions()[i].Name
			if v == nil {
				row[name] = nil
				continue
			}
			text := string(v)
			row[name] = &text
		}
		// Left out of the applied row, as every reader leaves them.
		for k, v := range row {
			if v == nil || k == "created_at" || k == "updated_at" {
				delete(row, k)
			}
		}
		want[*row["name"]] = row
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 2)
	require.Equal(t, "t", *want["full"]["ordered"], "booleans are sent as t and f")

	n, err := s.SeedEndpoints(ctx, 0x100)
	require.NoError(t, err)
	require.Equal(t, 3, n, "two rows and a tombstone; the row of a later revision is left as applied")

	got := map[string]json.RawMessage{}
	states, err := s.Pool.Query(ctx, `SELECT name, row::text, lsn::text FROM postbox.endpoint_state`)
	require.NoError(t, err)
	lsns := map[string]string{}
	for states.Next() {
		var name, row, lsn string
		require.NoError(t, states.Scan(&name, &row, &lsn))
		got[name], lsns[name] = json.RawMessage(row), lsn
	}
	require.NoError(t, states.Err())
	for name, row := range want {
		var seeded map[string]*string
		require.NoError(t, json.Unmarshal(got[name], &seeded))
		require.Equal(t, row, seeded, "row %s", name)
		require.Equal(t, "0/FF", lsns[name], "written just below the position")
	}
	require.JSONEq(t, `null`, string(got["gone"]), "a row gone from the table is a tombstone")
	require.JSONEq(t, `{"name": "newer", "url": "https://later.example/"}`, string(got["newer"]))
	var seeded bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT endpoints_seeded FROM postbox.checkpoints WHERE slot = $1`, s.Slot).Scan(&seeded))
	require.True(t, seeded)

	// A row the stream wrote since, whole (its NULL columns, its times),
	// as the table has it: the same row to a reader, not written again.
	_, err = s.Pool.Exec(ctx, `UPDATE postbox.endpoint_state SET row = row || '{"body": null, "created_at": "2026-01-01 00:00:00+00"}' WHERE name = 'bare'`)
	require.NoError(t, err)
	// Owed again with nothing changed, it writes nothing.
	n, err = s.SeedEndpoints(ctx, 0x200)
	require.NoError(t, err)
	require.Zero(t, n)
	var lsn string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT lsn::text FROM postbox.endpoint_state WHERE name = 'full'`).Scan(&lsn))
	require.Equal(t, "0/FF", lsn, "not written again")
}

// TestReconciliationOwedMarksTheSeedOwed: a reconciliation recorded owed
// makes the endpoints' seed owed; the seed pays that part, and the
// outbox's part still owed does not make it owed again, nor does its
// payment.
func TestReconciliationOwedMarksTheSeedOwed(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `INSERT INTO postbox.checkpoints (slot, lsn) VALUES ($1, '0/0')`, s.Slot)
	require.NoError(t, err)
	seeded := func() bool {
		ok, err := s.EndpointsSeeded(ctx)
		require.NoError(t, err)
		return ok
	}
	require.False(t, seeded(), "never seeded for the slot")
	_, err = s.SeedEndpoints(ctx, 0x100)
	require.NoError(t, err)
	require.True(t, seeded())

	require.NoError(t, s.SetReconcilePending(ctx, true))
	require.False(t, seeded(), "the slot missed endpoint changes as it missed rows")
	_, err = s.SeedEndpoints(ctx, 0x200)
	require.NoError(t, err)
	require.True(t, seeded(), "the seed paid its part; the outbox's is still owed")
	cp, err := s.Checkpoint(ctx)
	require.NoError(t, err)
	require.True(t, cp.ReconcilePending)
	require.NoError(t, s.SetReconcilePending(ctx, false))
	require.True(t, seeded())
}
