package dispatch_test

import (
	"context"
	"sync"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
)

// testIngest is an ingest transaction as the tests finish it by hand: the
// ingest's own (ingest's transaction) is finished by its commit.
type testIngest struct {
	done     chan struct{}
	live     func() bool
	mu       sync.Mutex
	err      error
	finished bool
	after    []func()
}

var _ dispatch.Ingest = (*testIngest)(nil)

func newTestIngest(live func() bool) *testIngest {
	return &testIngest{done: make(chan struct{}), live: live}
}

func (t *testIngest) Finish(err error) {
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

func (t *testIngest) AfterFinish(f func()) {
	t.mu.Lock()
	if !t.finished {
		t.after = append(t.after, f)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	f()
}

func (t *testIngest) Done() <-chan struct{} { return t.done }
func (t *testIngest) Uncertain() bool       { return t.live != nil && !t.Finished() && !t.live() }

func (t *testIngest) Finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func (t *testIngest) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

func (t *testIngest) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recordFunc records outcomes with a function (dispatch.Recorder).
type recordFunc func(dispatch.Outcome)

func (f recordFunc) Record(o dispatch.Outcome) { f(o) }

// connected returns a dispatcher whose outcomes go to record.
func connected(opts dispatch.Options, record func(dispatch.Outcome)) *dispatch.Dispatcher {
	d := dispatch.New(opts)
	d.Connect(recordFunc(record), nil)
	return d
}
