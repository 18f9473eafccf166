package store

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestIngestInsertPlansProbeTheKey: the ingest's insert of many events,
// planned generically on an ingest connection, reads the unique key once
// per event to skip those already ingested (absent) and matches a batch's
// rows to each other by hash; its delete of outbox rows reads no table
// whole. Guessing that the filter leaves one row,
// the planner once looped over the whole batch for each, which cost a
// 2,000-event batch 150 ms.
func TestIngestInsertPlansProbeTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, Migrate(ctx, pool, table))
	s := &Store{Pool: pool, Table: table, Slot: "test"}
	batch := func(n int, done bool) []NewEvent {
		evs := make([]NewEvent, n)
		for i := range evs {
			evs[i] = NewEvent{OutboxRow: OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "ep", Payload: []byte(`{}`)}}, Status: postboxtype.DeliveryInFlight}
			if done && i%2 == 0 {
				evs[i].Status, evs[i].Delivered = postboxtype.DeliveryDelivered, &state.Result{Status: postboxtype.DeliveryDelivered, StatusCode: 200}
			}
		}
		return evs
	}
	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	t.Cleanup(ic.Release)
	for range 5 {
		_, err := ic.Insert(ctx, batch(1000, false), false)
		require.NoError(t, err)
		require.NoError(t, ic.Commit(ctx, 0, false))
	}
	_, err = ic.conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	for _, done := range []bool{false, true} {
		sql := ic.insert.many
		if done {
			sql = ic.insert.manyDone
		}
		rows, err := ic.conn.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+sql, insertEventsArgs("me", batch(500, done), done)...)
		require.NoError(t, err)
		var plan strings.Builder
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			plan.WriteString(l + "\n")
		}
		require.NoError(t, rows.Err())
		require.Contains(t, plan.String(), "Index Only Scan using events_event_endpoint on events x (actual time", plan.String())
		require.Contains(t, plan.String(), "loops=500)", plan.String())
		require.NotContains(t, plan.String(), "Nested Loop", plan.String())
		require.NotContains(t, plan.String(), "Seq Scan", plan.String())
	}
	// A copied batch's plan (copyPlanSQL) probes the key once per event too.
	ids, endpoints := make([]string, 500), make([]string, 500)
	for i, ev := range batch(500, false) {
		ids[i], endpoints[i] = ev.EventID, ev.Endpoint
	}
	rows, err := ic.conn.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+copyPlanSQL, ids, endpoints)
	require.NoError(t, err)
	copyPlan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	joined := strings.Join(copyPlan, "\n")
	require.Contains(t, joined, "Index Only Scan using events_event_endpoint on events x (actual time", joined)
	require.Contains(t, joined, "loops=500)", joined)
	require.NotContains(t, joined, "Seq Scan", joined)
	// The ingested outbox rows' delete reads the primary key, however
	// few rows the table held when it was planned: producers fill it
	// between vacuums, and reading it whole cost four times as much.
	_, err = pool.Exec(ctx, "INSERT INTO "+s.Table.Ident()+" (endpoint) SELECT 'ep' FROM generate_series(1, 2000)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DELETE FROM "+s.Table.Ident())
	require.NoError(t, err)
	// Statistics as autovacuum left them under full insert load: a few
	// live rows over the pages the dead ones fill.
	_, err = pool.Exec(ctx, "UPDATE pg_class SET reltuples = 10, relpages = 18 WHERE oid = $1::regclass", s.Table.Ident())
	require.NoError(t, err)
	_, err = ic.conn.Exec(ctx, "PREPARE del(int8[]) AS DELETE FROM "+s.Table.Ident()+" WHERE id = ANY($1)")
	require.NoError(t, err)
	rows, err = ic.conn.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE del('{1,2}')")
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotContains(t, strings.Join(plan, "\n"), "Seq Scan", plan)
	_, err = ic.conn.Exec(ctx, "DEALLOCATE del")
	require.NoError(t, err)
}
