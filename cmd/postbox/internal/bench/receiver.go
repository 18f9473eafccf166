package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/outbox"
)

// maxBody bounds what the receiver reads of a delivery (the relay's own
// max_body default).
const maxBody = 1 << 20

// ledger is one scenario's account of event ids: those whose INSERT a
// producer saw commit, and when each id first reached the receiver.
type ledger struct {
	mu        sync.Mutex
	committed map[string]time.Time // when each commit was acknowledged
	first     map[string]time.Time
	dups      int
	dupAt     []time.Time // when each duplicate arrived
	dupIDs    []string    // which id each duplicate was
	arrivals  int         // every delivery, first or not
	missing   int         // committed and not yet arrived, kept for cheap waiting
	// uncertain is the ids of inserts that errored or timed out: they
	// may have committed all the same (the answer lost), and are looked
	// up in the database (env.resolve) before the scenario is judged.
	uncertain []string
}

func newLedger() *ledger {
	return &ledger{committed: map[string]time.Time{}, first: map[string]time.Time{}}
}

// commit records ids whose INSERT committed. Call it only after the commit
// returned OK.
func (l *ledger) commit(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for _, id := range ids {
		if _, ok := l.committed[id]; ok {
			continue
		}
		l.committed[id] = now
		if _, ok := l.first[id]; !ok {
			l.missing++
		}
	}
}

// doubt records the id of an insert that errored or timed out.
func (l *ledger) doubt(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.uncertain = append(l.uncertain, id)
}

// doubted takes the ids recorded by doubt since the last call.
func (l *ledger) doubted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := l.uncertain
	l.uncertain = nil
	return ids
}

// arrive records a delivery of id at time at.
func (l *ledger) arrive(id string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.arrivals++
	if _, ok := l.first[id]; ok {
		l.dups++
		l.dupAt = append(l.dupAt, at)
		l.dupIDs = append(l.dupIDs, id)
		return
	}
	l.first[id] = at
	if _, ok := l.committed[id]; ok {
		l.missing--
	}
}

// arrived is how many deliveries arrived so far, repeats included.
// openSince returns the ids committed at or after t that have not
// arrived yet: events a relay may hold in flight (an attempt started, or
// about to be) whose arrival no record shows.
func (l *ledger) openSince(t time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for id, at := range l.committed {
		if _, arrived := l.first[id]; !arrived && !at.Before(t) {
			ids = append(ids, id)
		}
	}
	return ids
}

// firstSince returns the ids that first arrived at or after t.
func (l *ledger) firstSince(t time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for id, at := range l.first {
		if !at.Before(t) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (l *ledger) arrived() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.arrivals
}

// pending is how many committed ids have not arrived yet.
func (l *ledger) pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.missing
}

// received is how many distinct ids arrived.
func (l *ledger) received() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.first)
}

// tally is a ledger's figures.
type tally struct {
	sent           int                  // ids committed
	received       int                  // distinct ids arrived
	lost           int                  // committed, never arrived
	dups           int                  // deliveries of an id after its first
	unacknowledged int                  // arrived, commit never acknowledged
	first          map[string]time.Time // first arrival of each id
	lostIDs        []string             // the lost ids
	dupAt          []time.Time          // when each duplicate arrived
	dupIDs         []string             // and which id it was
}

// tally checks every committed id against the arrivals.
func (l *ledger) tally() tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := tally{sent: len(l.committed), received: len(l.first), dups: l.dups, first: make(map[string]time.Time, len(l.first)),
		dupAt: append([]time.Time(nil), l.dupAt...), dupIDs: append([]string(nil), l.dupIDs...)}
	for id := range l.committed {
		if _, ok := l.first[id]; !ok {
			t.lost++
			t.lostIDs = append(t.lostIDs, id)
		}
	}
	for id, at := range l.first {
		t.first[id] = at
		if _, ok := l.committed[id]; !ok {
			t.unacknowledged++
		}
	}
	return t
}

// receiver is the bench's endpoints: /ep-N answer 204, /hang blocks until
// hang is closed, /fail answers 500, /flap/… flap (see flapPhase). Every request's signature is checked
// with outbox.Verify; a delivery that fails is counted and still recorded,
// so lost and bad signatures stay separate figures.
type receiver struct {
	*httptest.Server
	secrets []string
	hang    chan struct{}

	mu     sync.Mutex
	ledger *ledger
	bad    int   // this scenario's failed verifications
	badAll int   // the run's
	badErr error // the first failure's reason

	failed atomic.Int64 // requests to /fail
	start  time.Time    // the flapping endpoints' cycle starts here
	// follow answers the requests to /follow/ (setFollow).
	follow func(http.ResponseWriter, *http.Request, time.Time)
}

// The endpoints under /flap/ cycle through healthy, answering 500 and
// hanging for flapHang, flapPeriod each.
const (
	flapPeriod = 5 * time.Second
	flapHang   = 4 * time.Second
)

const (
	flapHealthy = iota
	flapFailing
	flapHanging
)

// flapPhase is what a flapping endpoint does at d into its cycle.
func flapPhase(d time.Duration) int { return int(d/flapPeriod) % 3 }

func newReceiver(secret string) *receiver {
	rv := &receiver{secrets: []string{secret}, hang: make(chan struct{}), ledger: newLedger(), start: time.Now()}
	rv.Server = httptest.NewUnstartedServer(http.HandlerFunc(rv.serve))
	// Each connection's process is found once (socketPID).
	rv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, &connPID{})
	}
	rv.Start()
	return rv
}

// addSecrets has the receiver accept signatures by secrets too.
func (rv *receiver) addSecrets(secrets ...string) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	rv.secrets = append(slices.Clip(rv.secrets), secrets...)
}

// setFollow has f answer the requests to /follow/ (the partners
// scenario's), or no one when nil.
func (rv *receiver) setFollow(f func(http.ResponseWriter, *http.Request, time.Time)) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	rv.follow = f
}

// port is the port the receiver listens on.
func (rv *receiver) port() int { return rv.Listener.Addr().(*net.TCPAddr).Port }

func (rv *receiver) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	rv.mu.Lock()
	secrets, follow := rv.secrets, rv.follow
	rv.mu.Unlock()
	if err == nil {
		err = outbox.Verify(secrets, r.Header, body, now)
	}
	rv.mu.Lock()
	if err != nil {
		rv.bad++
		rv.badAll++
		if rv.badErr == nil {
			rv.badErr = err
		}
	}
	led := rv.ledger
	rv.mu.Unlock()
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
	if strings.HasPrefix(r.URL.Path, "/follow/") && follow != nil {
		follow(w, r, now)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/slow/") {
		// The scale scenario's receiver: a request takes ScaleDelay.
		select {
		case <-time.After(ScaleDelay):
		case <-r.Context().Done():
			return
		}
	}
	if strings.HasPrefix(r.URL.Path, "/flap/") {
		switch flapPhase(now.Sub(rv.start)) {
		case flapFailing:
			w.WriteHeader(http.StatusInternalServerError)
			return
		case flapHanging:
			// Longer than the endpoint's timeout, but bounded: the relay
			// gives up first, and Close never waits long.
			select {
			case <-rv.hang:
			case <-r.Context().Done():
			case <-time.After(flapHang):
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	led.arrive(r.Header.Get(outbox.HeaderID), now)
	w.WriteHeader(http.StatusNoContent)
}

// reset starts a scenario: a new ledger, no failed verifications or
// requests to /fail. It returns the new ledger.
func (rv *receiver) reset() *ledger {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	rv.ledger, rv.bad = newLedger(), 0
	rv.failed.Store(0)
	return rv.ledger
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
