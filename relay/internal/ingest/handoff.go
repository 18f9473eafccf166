package ingest

import (
	"context"
	"sync"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
)

// transaction is the ingest's hand-off to the dispatcher: the database
// transaction that writes the deliveries of the first attempts it
// submitted before their insert (dispatch.Ingest). They are recorded
// once it has finished, under the ids the insert returned.
type transaction struct {
	done chan struct{}
	// live reports whether the transaction may still commit: while it
	// does not, its jobs wait for its outcome before they attempt.
	live func() bool

	mu       sync.Mutex
	err      error
	finished bool
	after    []func()
}

var _ dispatch.Ingest = (*transaction)(nil)

// newTransaction returns an unfinished transaction. live, when not nil,
// reports whether it may still commit: whether this instance still holds
// the lead it streams under. While it does not (the instance was paused,
// or cut off from the database, long enough for another to take over and
// bring the same events), its jobs start no attempt until it has finished.
func newTransaction(live func() bool) *transaction {
	return &transaction{done: make(chan struct{}), live: live}
}

// finish marks the transaction committed (nil) or failed, and runs what
// AfterFinish registered.
func (t *transaction) finish(err error) {
	t.mu.Lock()
	t.err, t.finished = err, true
	after := t.after
	t.after = nil
	close(t.done)
	t.mu.Unlock()
	for _, f := range after {
		f()
	}
}

// AfterFinish runs f once the transaction has finished: at once when it
// has, else from finish, in the finishing goroutine (so f must not block).
func (t *transaction) AfterFinish(f func()) {
	t.mu.Lock()
	if !t.finished {
		t.after = append(t.after, f)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	f()
}

// Done is closed when the transaction has finished.
func (t *transaction) Done() <-chan struct{} { return t.done }

// Uncertain reports whether the transaction has not finished and may
// never commit (see newTransaction).
func (t *transaction) Uncertain() bool {
	return t.live != nil && !t.Finished() && !t.live()
}

// Finished reports whether the transaction has finished.
func (t *transaction) Finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// Err is the transaction's outcome once Done is closed.
func (t *transaction) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Wait blocks until the transaction finished and returns its error.
func (t *transaction) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}
