package ingest

import (
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/assert"

	"github.com/postbox-relay/postbox/relay/internal/watermark"
)

// The durable position passes an ingest's commit only once the server's
// WAL is flushed past it, and never passes one commit to reach a later
// one, whether that later one waits for its flush or not.
func TestFlushGateHoldsTheDurablePositionBehindUnflushedCommits(t *testing.T) {
	g := flushGate{durable: watermark.New[pglogrepl.LSN](100)}
	assert.Equal(t, pglogrepl.LSN(100), g.flushedTo(0))

	g.committed(200, 0) // flushed before it returned
	assert.Equal(t, pglogrepl.LSN(200), g.durable.Get())

	g.committed(300, 1000) // durable once the WAL is flushed to 1000
	g.committed(400, 0)    // an empty transaction: after the one before it
	g.committed(500, 1200)
	assert.True(t, g.pending())
	assert.Equal(t, pglogrepl.LSN(200), g.flushedTo(999), "the first commit is not flushed")
	assert.Equal(t, pglogrepl.LSN(400), g.flushedTo(1000), "the first commit is flushed, and the empty one after it follows")
	assert.Equal(t, pglogrepl.LSN(400), g.flushedTo(900), "a lower report takes nothing back")
	assert.Equal(t, pglogrepl.LSN(500), g.flushedTo(1300))
	assert.False(t, g.pending())

	g.committed(600, 1250) // already flushed past it
	assert.Equal(t, pglogrepl.LSN(600), g.durable.Get())
	g.committed(700, 2000)
	g.committed(800, 1900) // cannot overtake the commit before it
	assert.Equal(t, pglogrepl.LSN(600), g.flushedTo(1950))
	assert.Equal(t, pglogrepl.LSN(800), g.flushedTo(2000))
}
