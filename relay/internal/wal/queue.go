package wal

import (
	"context"
	"sync"
	"time"
)

// Queue hands transactions from the stream to their consumer. It holds at
// most a bounded number of rows and bytes (a single chunk always fits), so
// memory stays bounded however large a transaction is, and a busy consumer
// gets everything that arrived meanwhile in one batch while the stream
// keeps reading: group commit without a timer.
type Queue[P any] struct {
	mu       sync.Mutex
	chunks   []Chunk[P]
	rows     int
	bytes    int
	maxRows  int
	maxBytes int
	closed   bool
	ready    chan struct{} // something to take
	space    chan struct{} // room was freed
}

// NewQueue returns a Queue holding up to maxRows rows and maxBytes bytes.
func NewQueue[P any](maxRows, maxBytes int) *Queue[P] {
	return &Queue[P]{maxRows: maxRows, maxBytes: maxBytes,
		ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

// put adds c unless the queue is full; with force, whether full or not.
func (q *Queue[P]) put(c Chunk[P], force bool) bool {
	q.mu.Lock()
	rows := max(c.Events, len(c.Rows)) // a routed row counts as its events
	if !force && len(q.chunks) > 0 && (q.rows+rows > q.maxRows || q.bytes+c.Bytes > q.maxBytes) {
		q.mu.Unlock()
		return false
	}
	q.chunks = append(q.chunks, c)
	q.rows += rows
	q.bytes += c.Bytes
	q.mu.Unlock()
	signal(q.ready)
	return true
}

// queuedRows is how many rows are queued, a routed row as its events.
func (q *Queue[P]) queuedRows() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.rows
}

// Close marks the end of the stream: Take returns what is left, then false.
func (q *Queue[P]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	signal(q.ready)
}

// Take waits for chunks and returns all that are queued, in order. It
// returns false once the queue is closed and empty (or ctx ends).
func (q *Queue[P]) Take(ctx context.Context) ([]Chunk[P], bool) {
	return q.take(ctx.Done(), nil)
}

// TakeBefore is Take that gives up at deadline: it returns false when
// nothing is queued by then, or the queue is closed and empty.
func (q *Queue[P]) TakeBefore(deadline time.Time) ([]Chunk[P], bool) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	return q.take(nil, t.C)
}

func (q *Queue[P]) take(done <-chan struct{}, expired <-chan time.Time) ([]Chunk[P], bool) {
	for {
		q.mu.Lock()
		if len(q.chunks) > 0 {
			out := q.chunks
			q.chunks, q.rows, q.bytes = nil, 0, 0
			q.mu.Unlock()
			signal(q.space)
			return out, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return nil, false
		}
		select {
		case <-q.ready:
		case <-done:
			return nil, false
		case <-expired:
			return nil, false
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
