package dispatch

import "context"

// Ingest is the ingest transaction that writes a fast-path job's
// delivery: its first attempt may start before it commits, and its
// outcome is recorded only once it has finished. The ingest owns it
// (ingest's transaction); the dispatcher and the recorder only wait on it.
type Ingest interface {
	// Done is closed when the transaction has finished.
	Done() <-chan struct{}
	// Finished reports whether it has.
	Finished() bool
	// Err is its outcome once Done is closed: nil when it committed.
	Err() error
	// Wait blocks until it has finished and returns Err.
	Wait(ctx context.Context) error
	// AfterFinish runs f once it has finished: at once when it has, else
	// in the finishing goroutine (so f must not block).
	AfterFinish(f func())
	// Uncertain reports whether it has not finished and may never commit:
	// this instance may have lost the lead it streams under, and another
	// may be bringing the same events. Its jobs then start no attempt
	// until it has finished.
	Uncertain() bool
}

// wasted reports whether j's ingest finished without writing j's delivery
// or its event under way: it failed (the stream brings the event again,
// to this instance or another), or found the event ingested before.
func wasted(tx Ingest, j *Job) bool {
	if !tx.Finished() {
		return false
	}
	_, r := j.UnderWay()
	return tx.Err() != nil || j.ID() == 0 && r == 0
}
