package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestCopiedIngestWritesWhatTheStatementWrites: a batch from
// CopyEventsMin events on, ingested alone, is copied into the tables;
// the same batch inserted by the statement (an ingest beside another,
// SetConcurrent) writes the same events, deliveries and first attempts,
// column for column. Events ingested before and repeats within the batch
// are skipped alike, the returned deliveries name the batch's indexes,
// and delivery ids follow the batch's order. With search_keys the copy
// extracts them as the statement does.
func TestCopiedIngestWritesWhatTheStatementWrites(t *testing.T) {
	t.Parallel()
	s := setup(t)
	t.Run("no search keys", func(t *testing.T) { checkCopiedAsInserted(t, s, nil, "") })
	t.Run("search keys", func(t *testing.T) { checkCopiedAsInserted(t, s, []string{"n", "s", "missing"}, "k") })
}

func checkCopiedAsInserted(t *testing.T, s *store.Store, keys []string, prefix string) {
	ctx := context.Background()
	n := max(store.CopyEventsMin+8, 40)
	at := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	batch := func(tag string, known []string) []store.NewEvent {
		evs := make([]store.NewEvent, 0, n+1)
		for i := range n {
			ev := store.NewEvent{
				OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: fmt.Sprintf("%s-%d", tag, i%3), EventType: "t", Payload: []byte(fmt.Sprintf(`{"n": %d, "s": "\"é%d", "o": {"n": 1}}`, i, i))}, OutboxID: int64(1000 + i)},
				Status:    postboxtype.DeliveryInFlight,
			}
			if i < len(known) {
				ev.EventID = known[i]
			}
			switch i % 7 { // routed by subscription: why, or "" (none matched); NULL otherwise
			case 3:
				ev.Fanout, ev.Matched = true, "t.* + filter"
			case 6:
				ev.Fanout = true
			}
			switch i % 5 {
			case 0:
				ev.Status = postboxtype.DeliveryPending
				ev.URL, ev.Headers, ev.CreatedAt = "http://127.0.0.1/"+tag, []byte(`{"X-A": "b"}`), at
			case 1:
				ev.Status, ev.Delivered = postboxtype.DeliveryDelivered, &state.Result{Status: postboxtype.DeliveryDelivered, StatusCode: 204,
					ResponseMS: 1.25, Response: "ok", At: at, CommitToDeliveryMS: 3.5, Target: "http://127.0.0.1/x"}
			case 2:
				ev.Status, ev.LastError = postboxtype.DeliveryDeadLetter, "invalid_row: no endpoint"
				ev.Payload, ev.PayloadDropped = []byte("null"), 70000
			case 3:
				ev.Lane, ev.CommitLSN, ev.CommittedAt = tag+"-lane", pglogrepl.LSN(0x16B3748+i), at
				ev.Status, ev.Delivered = postboxtype.DeliveryDelivered, &state.Result{Status: postboxtype.DeliveryDelivered, ResponseMS: 2, At: at, CommitToDeliveryMS: -1}
			case 4:
				ev.Message = true // written with outbox.Emit
			}
			evs = append(evs, ev)
		}
		return append(evs, evs[7]) // a repeat within the batch
	}
	ingest := func(evs []store.NewEvent, concurrent bool) []store.Ingested {
		t.Helper()
		ic, err := s.AcquireIngest(ctx, "me")
		require.NoError(t, err)
		defer ic.Release()
		if concurrent {
			ic.SetConcurrent()
		}
		ic.SetSearchKeys(keys)
		got, err := ic.Insert(ctx, evs, false)
		require.NoError(t, err)
		require.NoError(t, ic.Commit(ctx, 0, false))
		return got
	}
	known := []string{outbox.NewEventID(), outbox.NewEventID()}
	copiedTag, insertedTag := prefix+"copied", prefix+"inserted"
	for _, tag := range []string{copiedTag, insertedTag} {
		evs := batch(tag, nil)[:2]
		for i := range evs {
			evs[i].EventID = known[i]
		}
		ingest(evs, false)
	}
	copied, inserted := batch(copiedTag, known), batch(insertedTag, known)
	gotCopied, gotInserted := ingest(copied, false), ingest(inserted, true)
	require.Len(t, gotCopied, n-len(known), "the known events and the repeat are skipped")
	require.Equal(t, len(gotInserted), len(gotCopied))
	for k, g := range gotCopied {
		require.Equal(t, gotInserted[k].Index, g.Index)
		if k > 0 {
			require.Greater(t, g.DeliveryID, gotCopied[k-1].DeliveryID, "delivery ids follow the batch")
		}
		var payload string
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT e.payload::text FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
			WHERE d.id = $1 AND e.id = $2`, g.DeliveryID, g.EventPK).Scan(&payload))
		require.JSONEq(t, string(copied[g.Index].Payload), payload)
	}

	// Everything but ids, names and the ingest's own time, in the batch's order.
	rowsOf := func(tag string) []string {
		t.Helper()
		rows, err := s.Pool.Query(ctx, `
			SELECT concat_ws(' | ', replace(e.endpoint, $1, ''), replace(e.url, $1, ''), e.event_type, e.payload::text, e.headers::text,
			         e.created_at = e.ingested_at, nullif(e.created_at, e.ingested_at), e.outbox_id, e.commit_lsn, e.committed_at, e.payload_dropped, e.search::text, e.message, coalesce(e.matched, 'NULL'),
			         replace(d.endpoint, $1, ''), replace(d.lane, $1, ''), d.status, d.lease_owner, d.kept, d.last_error, d.attempt_count,
			         d.delivered_at, d.last_status_code, d.last_response_ms, d.last_response, d.commit_to_delivery_ms,
			         d.updated_at = e.ingested_at, d.next_attempt_at = e.ingested_at, d.created_at = e.ingested_at, d.replay_of,
			         d.attempt_target, d.attempted_by,
			         replace(a.endpoint, $1, ''), a.attempt, a.started_at, a.duration_ms, a.status_code, a.outcome, a.error_class,
			         a.error, a.response, a.target, a.instance)
			FROM postbox.events e JOIN postbox.deliveries d ON d.event_pk = e.id
			LEFT JOIN postbox.all_attempts a ON a.delivery_id = d.id
			WHERE e.endpoint LIKE $1 || '-%' AND e.outbox_id IS NOT NULL AND e.event_id <> ALL($2::uuid[])
			ORDER BY e.outbox_id`, tag, known)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			out = append(out, l)
		}
		require.NoError(t, rows.Err())
		return out
	}
	for _, tag := range []string{insertedTag, copiedTag} {
		var disordered int
		require.NoError(t, s.Pool.QueryRow(ctx, `
			SELECT count(*) FROM (
			  SELECT (event_id, endpoint) < lag((event_id, endpoint)) OVER (ORDER BY id) AS back
			  FROM postbox.events WHERE endpoint LIKE $1 || '-%' AND event_id <> ALL($2::uuid[])) AS x
			WHERE back`, tag, known).Scan(&disordered))
		require.Zero(t, disordered, "%s: events are numbered in the order they are written, the unique key's", tag)
	}
	want := rowsOf(insertedTag)
	require.Len(t, want, n-len(known))
	var messages int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events WHERE endpoint LIKE $1 || '-%' AND message`, copiedTag).Scan(&messages))
	require.NotZero(t, messages, "the copy writes events.message")
	require.Equal(t, want, rowsOf(copiedTag))
	if keys != nil {
		require.Contains(t, strings.Join(want, "\n"), `"s": "\"é`, "the search keys are extracted")
	}
	require.True(t, strings.Contains(strings.Join(want, "\n"), "delivered"), "the batch has deliveries written delivered")
}
