package wal

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// ackAll is an Acker with nothing in flight.
type ackAll struct{}

func (ackAll) Durable(flushed pglogrepl.LSN) pglogrepl.LSN { return flushed }
func (ackAll) Drained() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// TestStreamsEndpointChanges: the session streams postbox.endpoints'
// inserts, updates and deletes beside the outbox's rows, in commit order,
// each handed over as decoded and kept in its chunk: an update leaves out
// a column it did not change that is TOASTed, a rename names the old row,
// a delete carries the deleted row's revision.
func TestStreamsEndpointChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	table, err := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, table))
	slot, pub := pgtest.UniqueName("slot"), pgtest.UniqueName("pub")
	require.NoError(t, EnsurePublication(ctx, pool, pub, table))
	require.NoError(t, EnsureEndpointsPublication(ctx, pool, pub))
	require.NoError(t, EnsureEndpointsPublication(ctx, pool, pub), "again: it exists")
	_, err = CreateSlot(ctx, dbURL, slot)
	require.NoError(t, err)

	var mu sync.Mutex
	var decoded []EndpointChange
	var commits []pglogrepl.LSN
	stream := NewStream(Options[struct{}]{ConnString: dbURL, Slot: slot, Publication: pub, Table: table, Logger: zerolog.Nop(),
		EndpointsPublication: EndpointsPublication(pub),
		EndpointChange:       func(c EndpointChange) { mu.Lock(); decoded = append(decoded, c); mu.Unlock() },
		Decoded:              func(lsn pglogrepl.LSN) { mu.Lock(); commits = append(commits, lsn); mu.Unlock() },
	})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	queue := NewQueue[struct{}](100, 1<<20)
	done := make(chan error, 1)
	plan := func(Session) (pglogrepl.LSN, pglogrepl.LSN, error) { return 0, 0, nil }
	go func() { done <- stream.Run(runCtx, plan, queue, ackAll{}, nil) }()
	chunks := make(chan Chunk[struct{}], 100)
	go func() {
		for {
			cs, ok := queue.Take(context.Background())
			if !ok {
				close(chunks)
				return
			}
			for _, c := range cs {
				chunks <- c
			}
		}
	}()

	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	// A body TOASTed out of line: an update that leaves it is sent without it.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO postbox.endpoints (name, url, body) VALUES ('e1', 'http://a.example/1', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i))`)
	require.NoError(t, err)
	_, err = outbox.Insert(ctx, tx, outbox.Event{Endpoint: "e1", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	exec(`UPDATE postbox.endpoints SET url = 'http://a.example/2' WHERE name = 'e1'`)
	exec(`UPDATE postbox.endpoints SET name = 'e2' WHERE name = 'e1'`)
	exec(`DELETE FROM postbox.endpoints WHERE name = 'e2'`)
	var last int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT revision FROM postbox.endpoint_changes WHERE op = 'update' ORDER BY id DESC LIMIT 1`).Scan(&last))

	var got []Chunk[struct{}]
	deadline := time.After(30 * time.Second)
	for len(got) < 4 {
		select {
		case c := <-chunks:
			if len(c.EndpointChanges) > 0 {
				got = append(got, c)
			}
		case <-deadline:
			t.Fatalf("got %d chunks with endpoint changes", len(got))
		}
	}
	cancel()
	require.NoError(t, <-done)

	ins := got[0].EndpointChanges[0]
	require.True(t, ins.Inserted)
	require.Equal(t, "e1", ins.Name)
	require.Equal(t, "http://a.example/1", *ins.Row["url"])
	require.Len(t, *ins.Row["body"], 400*32)
	require.Contains(t, ins.Row, "headers")
	require.Nil(t, ins.Row["headers"], "NULL")
	require.Len(t, got[0].Rows, 1, "the event after it, in the same chunk")
	require.Equal(t, got[0].CommitLSN, ins.Commit)

	upd := got[1].EndpointChanges[0]
	require.False(t, upd.Inserted || upd.Deleted)
	require.Equal(t, "http://a.example/2", *upd.Row["url"])
	require.NotContains(t, upd.Row, "body", "TOASTed and unchanged: left out")
	require.Greater(t, upd.Revision, ins.Revision)

	ren := got[2].EndpointChanges[0]
	require.Equal(t, "e2", ren.Name)
	require.Equal(t, "e1", ren.OldName)

	del := got[3].EndpointChanges[0]
	require.True(t, del.Deleted)
	require.Equal(t, "e2", del.Name)
	require.Equal(t, last, del.Revision, "the deleted row's revision")
	require.Nil(t, del.Row)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []EndpointChange{ins, upd, ren, del}, decoded, "handed over as decoded, in order")
	for _, c := range got {
		require.Contains(t, commits, c.CommitLSN)
	}
}
