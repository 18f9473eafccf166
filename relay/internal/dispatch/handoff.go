package dispatch

import (
	"context"
	"sync"
)

// Ingest tracks an ingest transaction that jobs depend on.
type Ingest struct {
	done chan struct{}
	// live reports whether the transaction may still commit: while it
	// does not, an attempt waits for its outcome (see Dispatcher.run).
	live func() bool

	mu       sync.Mutex
	err      error
	finished bool
	after    []func()
}

// NewIngest returns an unfinished Ingest. live, when not nil, reports
// whether the transaction may still commit: for the ingest of a stream,
// whether this instance still holds the lead it streams under. While it
// does not (the instance was paused, or cut off from the database, long
// enough for another to take over and bring the same events), the jobs
// that depend on the transaction start no attempt until it has finished.
func NewIngest(live func() bool) *Ingest { return &Ingest{done: make(chan struct{}), live: live} }

// Finish marks the transaction committed (nil) or failed, and runs what
// AfterFinish registered.
func (i *Ingest) Finish(err error) {
	i.mu.Lock()
	i.err, i.finished = err, true
	after := i.after
	i.after = nil
	close(i.done)
	i.mu.Unlock()
	for _, f := range after {
		f()
	}
}

// AfterFinish runs f once the transaction has finished: at once when it
// has, else from Finish, in the finishing goroutine (so f must not block).
func (i *Ingest) AfterFinish(f func()) {
	i.mu.Lock()
	if !i.finished {
		i.after = append(i.after, f)
		i.mu.Unlock()
		return
	}
	i.mu.Unlock()
	f()
}

// Done is closed when the transaction has finished.
func (i *Ingest) Done() <-chan struct{} { return i.done }

// uncertain reports whether the transaction has not finished and may
// never commit (see NewIngest).
func (i *Ingest) uncertain() bool {
	return i.live != nil && !i.Finished() && !i.live()
}

// wasted reports whether the transaction finished without writing j's
// delivery or its event under way: it failed (the stream brings the event
// again, to this instance or another), or found the event ingested before.
func (i *Ingest) wasted(j *Job) bool {
	if !i.Finished() {
		return false
	}
	_, r := j.UnderWay()
	return i.Err() != nil || j.ID() == 0 && r == 0
}

// Finished reports whether the transaction has finished.
func (i *Ingest) Finished() bool {
	select {
	case <-i.done:
		return true
	default:
		return false
	}
}

// Err is the transaction's outcome once Done is closed.
func (i *Ingest) Err() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.err
}

// Wait blocks until the transaction finished and returns its error.
func (i *Ingest) Wait(ctx context.Context) error {
	select {
	case <-i.done:
		return i.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}
