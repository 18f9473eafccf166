package wal

import (
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"

	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTakeBeforeGivesUpAtItsDeadline: TakeBefore returns what is queued
// at once, what arrives before its deadline, nothing after it, and false
// once the queue is closed and empty.
func TestTakeBeforeGivesUpAtItsDeadline(t *testing.T) {
	q := NewQueue[struct{}](10, 1<<20)
	require.True(t, q.put(Chunk[struct{}]{Rows: []store.OutboxRow{{Event: state.Event{EventID: "a"}}}}, false))
	got, ok := q.TakeBefore(time.Now().Add(time.Hour))
	require.True(t, ok)
	require.Len(t, got, 1)

	_, ok = q.TakeBefore(time.Now().Add(20 * time.Millisecond))
	require.False(t, ok, "nothing queued by the deadline")

	go func() {
		time.Sleep(10 * time.Millisecond)
		q.put(Chunk[struct{}]{Rows: []store.OutboxRow{{Event: state.Event{EventID: "b"}}}}, false)
	}()
	got, ok = q.TakeBefore(time.Now().Add(10 * time.Second))
	require.True(t, ok, "a chunk queued before the deadline")
	require.Equal(t, "b", got[0].Rows[0].EventID)

	q.Close()
	_, ok = q.TakeBefore(time.Now().Add(10 * time.Second))
	require.False(t, ok, "closed and empty")
	_, ok = q.Take(context.Background())
	require.False(t, ok)
}

// TestForcedPutGoesPastTheBounds: a chunk the stream prepared is queued
// even when the queue is full (the session ending while it waited), so
// its consumer finishes what was started for it.
func TestForcedPutGoesPastTheBounds(t *testing.T) {
	q := NewQueue[struct{}](1, 1<<20)
	require.True(t, q.put(Chunk[struct{}]{Rows: []store.OutboxRow{{Event: state.Event{EventID: "a"}}}}, false))
	require.False(t, q.put(Chunk[struct{}]{Rows: []store.OutboxRow{{Event: state.Event{EventID: "b"}}}}, false), "full")
	require.Equal(t, 1, q.queuedRows())
	require.True(t, q.put(Chunk[struct{}]{Rows: []store.OutboxRow{{Event: state.Event{EventID: "b"}}}}, true))
	got, ok := q.Take(context.Background())
	require.True(t, ok)
	require.Len(t, got, 2)
	require.Zero(t, q.queuedRows())
}

// TestRoutedRowsCountAsTheirEvents: a chunk of rows routed by subscription
// fills the queue as the events they become, not as its rows.
func TestRoutedRowsCountAsTheirEvents(t *testing.T) {
	q := NewQueue[struct{}](250, 1<<20)
	routed := Chunk[struct{}]{Rows: make([]store.OutboxRow, 2), Events: 200}
	require.True(t, q.put(routed, false))
	require.Equal(t, 200, q.queuedRows())
	require.False(t, q.put(routed, false), "400 events are past the bound of 250, though 4 rows are not")
	require.True(t, q.put(Chunk[struct{}]{Rows: make([]store.OutboxRow, 50)}, false), "a chunk without Events counts its rows")
	require.Equal(t, 250, q.queuedRows())
}
