package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestInsertWithPgxAndDatabaseSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	table, err := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, outbox.SchemaSQL(table))
	require.NoError(t, err)

	var pgxID string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		pgxID, err = outbox.Insert(ctx, tx, outbox.Event{Endpoint: "partner-42", Type: "conversion",
			Payload: []byte(`{"click_id":"abc","payout":"12.50"}`), Headers: map[string]string{"X-Tenant": "7"}})
		return err
	}))

	db, err := sql.Open("pgx", dbURL)
	require.NoError(t, err)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	sqlID, err := outbox.Insert(ctx, tx, outbox.Event{ID: "0b6f7a8e-1f7e-4b8a-9b2c-3d4e5f6a7b8c", Endpoint: "crm", URL: "https://crm.example/hook"})
	require.NoError(t, err)
	require.Equal(t, "0b6f7a8e-1f7e-4b8a-9b2c-3d4e5f6a7b8c", sqlID, "a given id is kept")
	routedID, err := outbox.Insert(ctx, tx, outbox.Event{Type: "order.paid"}) // no endpoint: routed by its type
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	// A rolled-back insert leaves nothing.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = outbox.Insert(ctx, tx, outbox.Event{Endpoint: "gone"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	rows, err := pool.Query(ctx, `SELECT event_id::text, coalesce(endpoint, 'NULL'), coalesce(url, ''), event_type, payload::text, coalesce(headers::text, '') FROM postbox.outbox ORDER BY id`)
	require.NoError(t, err)
	type row struct{ ID, Endpoint, URL, Type, Payload, Headers string }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{
		{pgxID, "partner-42", "", "conversion", `{"payout": "12.50", "click_id": "abc"}`, `{"X-Tenant": "7"}`},
		{sqlID, "crm", "https://crm.example/hook", "", `{}`, ""},
		{routedID, "NULL", "", "order.paid", `{}`, ""},
	}, got)
}

func TestInsertRefusesBadInput(t *testing.T) {
	t.Parallel()
	_, err := outbox.Insert(context.Background(), struct{}{}, outbox.Event{Endpoint: "x"})
	require.ErrorIs(t, err, outbox.ErrNotExecer)
	_, err = outbox.Insert(context.Background(), nil, outbox.Event{})
	require.ErrorContains(t, err, "needs an endpoint, or a type to route it by")
	_, err = outbox.Insert(context.Background(), nil, outbox.Event{Endpoint: "x", Payload: []byte("{nope")})
	require.ErrorContains(t, err, "JSON")
}

func TestParseTable(t *testing.T) {
	t.Parallel()
	tb, err := outbox.ParseTable("app.events_outbox")
	require.NoError(t, err)
	require.Equal(t, `"app"."events_outbox"`, tb.Ident())
	require.Contains(t, outbox.SchemaSQL(tb), `CREATE TABLE IF NOT EXISTS "app"."events_outbox"`)
	tb, err = outbox.ParseTable("outbox")
	require.NoError(t, err)
	require.Equal(t, "public.outbox", tb.String())
	for _, bad := range []string{"", "a.b.c", "App.x", `x"; drop table y; --`, "a-b.c"} {
		_, err := outbox.ParseTable(bad)
		require.Error(t, err, bad)
	}
}

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	old, cur := outbox.NewSecret(), outbox.NewSecret()
	require.True(t, strings.HasPrefix(cur, "whsec_"))
	so, _ := outbox.ParseSecret(old)
	sc, _ := outbox.ParseSecret(cur)
	body := []byte(`{"a":1}`)
	now := time.Now()
	h := http.Header{}
	ts := now.Unix()
	h.Set(outbox.HeaderID, "msg_1")
	h.Set(outbox.HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(outbox.HeaderSignature, outbox.SignatureHeader([]outbox.Secret{sc, so}, "msg_1", ts, body))
	require.Len(t, strings.Fields(h.Get(outbox.HeaderSignature)), 2, "one entry per active secret")
	require.NoError(t, outbox.Verify([]string{cur}, h, body, now))
	require.NoError(t, outbox.Verify([]string{old}, h, body, now), "during a rotation the old secret verifies too")
	require.ErrorIs(t, outbox.Verify([]string{outbox.NewSecret()}, h, body, now), outbox.ErrNoMatch)
	require.ErrorIs(t, outbox.Verify([]string{cur}, h, []byte(`{"a":2}`), now), outbox.ErrNoMatch)
	require.ErrorIs(t, outbox.Verify([]string{cur}, h, body, now.Add(6*time.Minute)), outbox.ErrTimestampTooOld)
	require.ErrorIs(t, outbox.Verify([]string{cur}, h, body, now.Add(-6*time.Minute)), outbox.ErrTimestampFuture)
	require.NotContains(t, sc.String(), cur[6:], "a secret never prints")
}

// TestDerivedSecretVectors checks DeriveSecret against vectors computed
// outside postbox, and that a derived secret verifies only its own
// endpoint's deliveries.
func TestDerivedSecretVectors(t *testing.T) {
	data, err := os.ReadFile("testdata/derived_secrets.json")
	require.NoError(t, err)
	var file struct {
		Vectors []struct{ Master, Endpoint, Secret string }
	}
	require.NoError(t, json.Unmarshal(data, &file))
	require.NotEmpty(t, file.Vectors)
	for _, v := range file.Vectors {
		master, err := outbox.ParseSecret(v.Master)
		require.NoError(t, err)
		require.Equal(t, v.Secret, outbox.DeriveSecret(master, v.Endpoint).Reveal(), v.Endpoint)
	}
	master, _ := outbox.ParseSecret(file.Vectors[0].Master)
	a, b := outbox.DeriveSecret(master, "a"), outbox.DeriveSecret(master, "b")
	now := time.Now()
	h := http.Header{}
	h.Set(outbox.HeaderID, "msg_1")
	h.Set(outbox.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(outbox.HeaderSignature, a.Sign("msg_1", now.Unix(), []byte(`{}`)))
	require.NoError(t, outbox.Verify([]string{a.Reveal()}, h, []byte(`{}`), now))
	require.ErrorIs(t, outbox.Verify([]string{b.Reveal()}, h, []byte(`{}`), now), outbox.ErrNoMatch, "b's secret does not verify a's deliveries")
	require.ErrorIs(t, outbox.Verify([]string{file.Vectors[0].Master}, h, []byte(`{}`), now), outbox.ErrNoMatch, "nor does the master")
}

// TestTableInsertWritesTheConfiguredTable: a relay configured with
// another outbox_table reads that table, and Table.Insert writes it (the
// package-level Insert writes postbox.outbox alone).
func TestTableInsertWritesTheConfiguredTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	require.NoError(t, err)
	defer pool.Close()
	table, err := outbox.ParseTable("app.events_outbox")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, outbox.SchemaSQL(table))
	require.NoError(t, err)

	var id string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err = table.Insert(ctx, tx, outbox.Event{Endpoint: "acme_network", Payload: []byte(`{"click_id":"c1"}`)})
		return err
	}))
	var got string
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id::text FROM app.events_outbox WHERE endpoint = 'acme_network'`).Scan(&got))
	require.Equal(t, id, got)
	var other *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('postbox.outbox')::text`).Scan(&other))
	require.Nil(t, other, "nothing was written to postbox.outbox")
}
