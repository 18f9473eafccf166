package bench

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// receiver is the bench's endpoints: /ep-N answer 204 and record when each
// event first arrived, /hang blocks until hang is closed, /fail answers 500.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	first  map[string]time.Time
	dups   int
	failed atomic.Int64  // requests to /fail
	hang   chan struct{} // /hang blocks until closed
}

func newReceiver() *receiver {
	rv := &receiver{first: map[string]time.Time{}, hang: make(chan struct{})}
	rv.Server = httptest.NewServer(http.HandlerFunc(rv.serve))
	return rv
}

func (rv *receiver) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	switch r.URL.Path {
	case "/hang":
		select {
		case <-rv.hang:
		case <-r.Context().Done():
		}
		return
	case "/fail":
		rv.failed.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	id := r.Header.Get("webhook-id")
	rv.mu.Lock()
	if _, ok := rv.first[id]; ok {
		rv.dups++
	} else {
		rv.first[id] = now
	}
	rv.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (rv *receiver) distinct() int {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return len(rv.first)
}

// reset starts a scenario: no arrivals, no requests to /fail.
func (rv *receiver) reset() {
	rv.mu.Lock()
	rv.first, rv.dups = map[string]time.Time{}, 0
	rv.mu.Unlock()
	rv.failed.Store(0)
}

func (rv *receiver) snapshot() (map[string]time.Time, int) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	m := make(map[string]time.Time, len(rv.first))
	for k, v := range rv.first {
		m[k] = v
	}
	return m, rv.dups
}
