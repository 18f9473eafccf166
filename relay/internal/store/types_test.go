package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestCreatedAtTravelsAsTime: reconciliation reads an outbox row's
// created_at as a time (a row whose created_at is not one is invalid), and
// ingest stores the time it is given, or the ingest time when it has none.
func TestCreatedAtTravelsAsTime(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Pool.Exec(ctx, `INSERT INTO `+s.Table.Ident()+` (endpoint, created_at) VALUES
		('ep', '2026-03-01 12:34:56.5+01'), ('ep', 'infinity')`)
	require.NoError(t, err)

	rows, err := s.UningestedOutbox(ctx, 0, 10, "", 1<<20)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	want := time.Date(2026, 3, 1, 11, 34, 56, 500_000_000, time.UTC)
	require.True(t, rows[0].CreatedAt.Equal(want), "got %s", rows[0].CreatedAt)
	require.Empty(t, rows[0].Invalid)
	require.True(t, rows[1].CreatedAt.IsZero())
	require.Equal(t, "invalid_row: column created_at in "+s.Table.String()+" is not a time: infinity", rows[1].Invalid)

	ic, err := s.AcquireIngest(ctx, "me")
	require.NoError(t, err)
	defer ic.Release()
	known, unknown := outbox.NewEventID(), outbox.NewEventID()
	_, err = ic.Insert(ctx, []store.NewEvent{
		{OutboxRow: store.OutboxRow{Event: state.Event{EventID: known, Endpoint: "ep", Payload: []byte(`{}`), CreatedAt: want}}, Status: postboxtype.DeliveryPending},
		{OutboxRow: store.OutboxRow{Event: state.Event{EventID: unknown, Endpoint: "ep", Payload: []byte(`{}`)}}, Status: postboxtype.DeliveryPending},
	}, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
	var got time.Time
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT created_at FROM postbox.events WHERE event_id = $1`, known).Scan(&got))
	require.True(t, got.Equal(want), "got %s", got)
	var ingestTime bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT created_at = ingested_at FROM postbox.events WHERE event_id = $1`, unknown).Scan(&ingestTime))
	require.True(t, ingestTime, "no created_at: the ingest time")
}

// TestStatesScanAsTypes: the states stored as text come back as the
// state package's types.
func TestStatesScanAsTypes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	queue(t, s, "ep", 1)
	claimed, err := s.Claim(ctx, "me", 1, nil, nil, 1, nil)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	open := func(cur store.Health, rs []state.Result) store.Health {
		require.Equal(t, postboxtype.BreakerClosed, cur.State, "an endpoint without a row is closed")
		require.Len(t, rs, 1)
		cur.State, cur.OpenedAt, cur.Cooldown = postboxtype.BreakerOpen, rs[0].At, time.Minute
		return cur
	}
	changes, err := s.RecordResults(ctx, "me", []state.Result{{
		DeliveryID: claimed[0].DeliveryID, Endpoint: "ep", Status: postboxtype.DeliveryDeadLetter, Attempted: true,
		Signal: state.SignalFailure, StatusCode: 500, LastError: "http 500", At: time.Now(), CommitToDeliveryMS: -1,
	}}, open, nil)
	require.NoError(t, err)
	require.Len(t, changes, 1)

	unhealthy, err := s.UnhealthyEndpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, postboxtype.BreakerOpen, unhealthy["ep"].State)

	items, _, err := s.Replay(ctx, postboxtype.ReplayFilter{Endpoint: "ep"}, true, 0)
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.Equal(t, postboxtype.DeliveryDeadLetter, items[0].LastStatus)
	require.False(t, items[0].Queued)

	_, n, err := s.Replay(ctx, postboxtype.ReplayFilter{Endpoint: "ep"}, false, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	items, _, err = s.Replay(ctx, postboxtype.ReplayFilter{Endpoint: "ep"}, true, 0)
	require.NoError(t, err)
	require.Equal(t, postboxtype.DeliveryPending, items[0].LastStatus)
	require.True(t, items[0].Queued, "a waiting delivery is not replayed again")
}
