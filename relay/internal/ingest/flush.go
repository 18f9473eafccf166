package ingest

import (
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/postbox-relay/postbox/relay/internal/watermark"
)

// flushGate advances the durable position behind the ingest's commits,
// each only once the server has flushed it to its WAL.
//
// The ingest commits without waiting for that flush
// (store.IngestConn.CommitUnflushed): a producer's commit that arrives
// during the relay's flush waits for it (docs/benchmarks.md). A commit not yet
// flushed is visible, so its deliveries go ahead, but a crash of the
// server would undo it; so the stream may confirm the transactions it
// ingested to the slot only once the server's WAL is flushed past the
// commit. How far that is, the stream learns for nothing: the walsender
// decodes only flushed WAL, so every position it reports is flushed
// (wal.Acker). On a server whose own synchronous_commit is off, this is
// what keeps the slot from being confirmed past an ingest a crash undoes.
type flushGate struct {
	durable *watermark.Watermark[pglogrepl.LSN]

	mu      sync.Mutex
	flushed pglogrepl.LSN // the server's WAL is flushed at least this far
	waiting []unflushed   // commits not yet known flushed, oldest first
}

// unflushed is an ingest commit of the transactions up to end, durable
// once the server's WAL is flushed to by.
type unflushed struct{ end, by pglogrepl.LSN }

// committed says the transactions up to end are ingested, by a commit
// that is durable once the server's WAL is flushed to by (0: it is
// durable already). end becomes durable after every commit before it.
func (g *flushGate) committed(end, by pglogrepl.LSN) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) == 0 && by <= g.flushed {
		g.durable.Advance(end)
		return
	}
	g.waiting = append(g.waiting, unflushed{end: end, by: by})
}

// flushedTo says the server's WAL is flushed at least to lsn, and returns
// the durable position.
func (g *flushGate) flushedTo(lsn pglogrepl.LSN) pglogrepl.LSN {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.flushed = max(g.flushed, lsn)
	n := 0
	for n < len(g.waiting) && g.waiting[n].by <= g.flushed {
		g.durable.Advance(g.waiting[n].end)
		n++
	}
	if n > 0 {
		g.waiting = append(g.waiting[:0], g.waiting[n:]...)
	}
	return g.durable.Get()
}

// pending reports whether a commit waits for its flush.
func (g *flushGate) pending() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting) > 0
}
