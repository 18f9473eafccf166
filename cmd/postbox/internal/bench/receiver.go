package bench

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/outbox"
)

// maxBody bounds what the receiver reads of a delivery (the relay's own
// max_body default).
const maxBody = 1 << 20

// receiver is the bench's endpoints: /ep-N answer 204 and record when each
// event first arrived, /hang blocks until hang is closed, /fail answers
// 500. Every request's signature is checked with outbox.Verify; a delivery
// that fails is counted and still recorded, so lost and bad signatures stay
// separate figures.
type receiver struct {
	*httptest.Server
	secrets []string
	hang    chan struct{}

	mu     sync.Mutex
	first  map[string]time.Time
	dups   int
	bad    int   // this scenario's failed verifications
	badAll int   // the run's
	badErr error // the first failure's reason

	failed atomic.Int64 // requests to /fail
}

func newReceiver(secret string) *receiver {
	rv := &receiver{secrets: []string{secret}, first: map[string]time.Time{}, hang: make(chan struct{})}
	rv.Server = httptest.NewServer(http.HandlerFunc(rv.serve))
	return rv
}

func (rv *receiver) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err == nil {
		err = outbox.Verify(rv.secrets, r.Header, body, now)
	}
	if err != nil {
		rv.mu.Lock()
		rv.bad++
		rv.badAll++
		if rv.badErr == nil {
			rv.badErr = err
		}
		rv.mu.Unlock()
	}
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
	id := r.Header.Get(outbox.HeaderID)
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

// reset starts a scenario: no arrivals, no failed verifications, no
// requests to /fail.
func (rv *receiver) reset() {
	rv.mu.Lock()
	rv.first, rv.dups, rv.bad = map[string]time.Time{}, 0, 0
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

// scenarioBad is the number of failed verifications since reset.
func (rv *receiver) scenarioBad() int {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return rv.bad
}

// badSignatures is the run's number of failed verifications and the first
// one's reason.
func (rv *receiver) badSignatures() (int, error) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return rv.badAll, rv.badErr
}
