// Package watermark is a value that only its owner moves and that others
// wait on: WaitFor(v) returns a channel closed once the value reaches v.
// No polling and no sleeps; a mutex and a list of waiters.
package watermark

import (
	"cmp"
	"sync"
)

// Watermark holds an ordered value. The zero Watermark holds the zero value.
type Watermark[T cmp.Ordered] struct {
	mu      sync.Mutex
	v       T
	waiters []waiter[T]
}

type waiter[T cmp.Ordered] struct {
	at T
	ch chan struct{}
}

// New returns a Watermark holding v.
func New[T cmp.Ordered](v T) *Watermark[T] { return &Watermark[T]{v: v} }

// Get returns the current value.
func (w *Watermark[T]) Get() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v
}

// Advance raises the value to v; a lower v changes nothing. It reports
// whether the value moved.
func (w *Watermark[T]) Advance(v T) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v <= w.v {
		return false
	}
	w.setLocked(v)
	return true
}

// Reset sets the value to v, also below the current one (a new session
// starting from an older position). Waiters above v keep waiting.
func (w *Watermark[T]) Reset(v T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setLocked(v)
}

func (w *Watermark[T]) setLocked(v T) {
	w.v = v
	kept := w.waiters[:0]
	for _, wt := range w.waiters {
		if wt.at <= v {
			close(wt.ch)
		} else {
			kept = append(kept, wt)
		}
	}
	clear(w.waiters[len(kept):])
	w.waiters = kept
}

// WaitFor returns a channel that is closed once the value is at least v
// (at once when it is already).
func (w *Watermark[T]) WaitFor(v T) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if v <= w.v {
		close(ch)
		return ch
	}
	w.waiters = append(w.waiters, waiter[T]{at: v, ch: ch})
	return ch
}
