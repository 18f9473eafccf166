package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// TestMain runs the tests on a shared throwaway cluster and, when they
// pass, checks that no goroutine outlived them: every relay a test started
// was stopped at its cleanup, and Stop joins all the relay's goroutines.
func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testBundle is one test's database, configuration and pool.
type testBundle struct {
	dbURL  string
	pool   *pgxpool.Pool
	cfg    *config.File
	secret string
	logs   *syncBuffer
	// logLevel of the captured relay log (debug unless a test needs less).
	logLevel zerolog.Level
	// table, when set, is the endpoints table the relays are given
	// (config.Config.EndpointTable), filled by the test.
	table *config.EndpointTable
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := config.Default()
	cfg.DatabaseURL = dbURL
	cfg.Slot = pgtest.UniqueName("slot")
	cfg.Publication = pgtest.UniqueName("pub")
	cfg.AllowPrivateTargets = true
	cfg.AdminListen = "127.0.0.1:0"
	secret := outbox.NewSecret()
	cfg.Signing.Secrets = []string{secret}
	cfg.ShutdownGrace = config.Duration(3 * time.Second)
	cfg.SweepInterval = config.Duration(200 * time.Millisecond)
	cfg.StatusInterval = config.Duration(time.Second)
	cfg.Lease = config.Duration(3 * time.Second)
	base := config.Duration(50 * time.Millisecond)
	cfg.Defaults.BackoffBase = &base
	require.NoError(t, cfg.Validate())
	tb := &testBundle{dbURL: dbURL, pool: pool, cfg: cfg, secret: secret, logs: &syncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", tb.logs.String())
		}
	})
	return tb
}

// endpoint configures an endpoint with URL u.
func (tb *testBundle) endpoint(t *testing.T, name, u string, mod func(*config.EndpointConfig)) {
	t.Helper()
	if tb.cfg.Endpoints == nil {
		tb.cfg.Endpoints = map[string]config.EndpointConfig{}
	}
	ec := config.EndpointConfig{URL: &u}
	if mod != nil {
		mod(&ec)
	}
	tb.cfg.Endpoints[name] = ec
	require.NoError(t, tb.cfg.Validate())
}

// start starts a relay and waits until it streams; it is stopped at cleanup.
func (tb *testBundle) start(t *testing.T, opts relay.Options) *relay.Relay {
	t.Helper()
	r := tb.startAny(t, opts)
	waitUntil(t, 30*time.Second, "relay streaming", func() bool {
		select {
		case <-r.Stopped():
			t.Fatalf("relay stopped: %v", r.Err())
		default:
		}
		return r.Streaming()
	})
	return r
}

// startStandby starts a relay beside one that streams, and waits until it
// has registered (it delivers from the queue).
func (tb *testBundle) startStandby(t *testing.T, opts relay.Options) *relay.Relay {
	t.Helper()
	r := tb.startAny(t, opts)
	waitUntil(t, 30*time.Second, "relay registered", func() bool {
		var n int
		_ = tb.pool.QueryRow(context.Background(), `SELECT count(*) FROM postbox.instances WHERE id = $1`, r.InstanceID()).Scan(&n)
		return n == 1
	})
	return r
}

func (tb *testBundle) startAny(t *testing.T, opts relay.Options) *relay.Relay {
	t.Helper()
	r := tb.newRelay(t, opts)
	require.NoError(t, r.Start(context.Background()))
	return r
}

// newRelay makes a relay that logs to tb.logs and dials loopback only; it
// is stopped at cleanup.
func (tb *testBundle) newRelay(t *testing.T, opts relay.Options) *relay.Relay {
	t.Helper()
	opts.Logger = zerolog.New(tb.logs).Level(tb.logLevel).With().Timestamp().Logger()
	if !opts.HasBeneathGuard() {
		opts = opts.WithBeneathGuard(loopbackOnly(t))
	}
	r, err := relay.New(tb.resolved(t), opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// loopbackOnly is the tripwire every test relay dials through, beneath
// its SSRF guard: tests send traffic to loopback only, so any other address
// the guard let through (a regression) is refused before its connect and
// fails the test. No test can reach a metadata or private address.
func loopbackOnly(t *testing.T) func(netip.AddrPort) error {
	return func(ap netip.AddrPort) error {
		if ap.Addr().Unmap().IsLoopback() {
			return nil
		}
		t.Errorf("the relay's guard let %s through to a dial", ap)
		return errors.New("tripwire: tests dial loopback only")
	}
}

// resolved is the bundle's configuration, resolved.
func (tb *testBundle) resolved(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := tb.cfg.Resolve()
	require.NoError(t, err)
	if tb.table != nil {
		cfg.EndpointTable = tb.table
	}
	return cfg
}

// insert commits events into the outbox in one transaction.
func (tb *testBundle) insert(t *testing.T, evs ...outbox.Event) []string {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(context.Background(), tb.pool, func(tx pgx.Tx) error {
		for _, e := range evs {
			id, err := outbox.Insert(context.Background(), tx, e)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	require.NoError(t, err)
	return ids
}

// deliveries counts deliveries by status.
func (tb *testBundle) deliveries(t *testing.T) map[postboxtype.DeliveryState]int {
	t.Helper()
	rows, err := tb.pool.Query(context.Background(), `SELECT status, count(*) FROM postbox.deliveries GROUP BY status`)
	require.NoError(t, err)
	out := map[postboxtype.DeliveryState]int{}
	for rows.Next() {
		var s postboxtype.DeliveryState
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// delivery is a delivery row as a test looks at it.
type delivery struct {
	Status       postboxtype.DeliveryState
	Attempts     int
	LastError    string
	LastStatus   int
	NextAttempt  time.Time
	DeliveredAt  *time.Time
	C2DMS        *float64
	LastResponse string
}

// attempts returns a delivery's attempt count, or -1 before it exists.
func (tb *testBundle) attempts(t *testing.T, eventID string) int {
	t.Helper()
	n := -1
	_ = tb.pool.QueryRow(context.Background(), `
		SELECT d.attempt_count FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 ORDER BY d.id DESC LIMIT 1`, eventID).Scan(&n)
	return n
}

func (tb *testBundle) delivery(t *testing.T, eventID string) delivery {
	t.Helper()
	var d delivery
	var lastErr, lastResp *string
	var code *int
	err := tb.pool.QueryRow(context.Background(), `
		SELECT d.status, d.attempt_count, d.last_error, d.last_status_code,
		       least(d.next_attempt_at, '9999-01-01'), -- 'infinity' when parked (store.Park)
		       d.delivered_at,
		       d.commit_to_delivery_ms, d.last_response
		FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE e.event_id = $1 ORDER BY d.id DESC LIMIT 1`, eventID).
		Scan(&d.Status, &d.Attempts, &lastErr, &code, &d.NextAttempt, &d.DeliveredAt, &d.C2DMS, &lastResp)
	require.NoError(t, err)
	if lastErr != nil {
		d.LastError = *lastErr
	}
	if lastResp != nil {
		d.LastResponse = *lastResp
	}
	if code != nil {
		d.LastStatus = *code
	}
	return d
}

func (tb *testBundle) waitSettled(t *testing.T, n int, within time.Duration) {
	t.Helper()
	waitUntil(t, within, "deliveries settled", func() bool {
		c := tb.deliveries(t)
		return c[postboxtype.DeliveryDelivered]+c[postboxtype.DeliveryDeadLetter] >= n
	})
}

// receiver is an HTTP server that records what it receives and answers
// with what answer returns for the n-th request (from 1).
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []received
	answer func(n int, r received) int
	// respond, when set, answers instead of answer, with headers.
	respond func(r received) (int, http.Header)
	body    string // the response body
}

type received struct {
	ID     string
	Method string
	Path   string
	Query  string
	Target string // the request target as sent
	Header http.Header
	Body   []byte
	At     time.Time
}

func newReceiver(t *testing.T, answer func(n int, r received) int) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	if rc.answer == nil {
		rc.answer = func(int, received) int { return http.StatusOK }
	}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got := received{ID: r.Header.Get(outbox.HeaderID), Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Target: r.RequestURI,
			Header: r.Header.Clone(), Body: body, At: time.Now()}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, got)
		n := len(rc.reqs)
		respond, respBody := rc.respond, rc.body
		rc.mu.Unlock()
		if respond != nil {
			code, h := respond(got)
			for k, v := range h {
				w.Header()[k] = v
			}
			w.WriteHeader(code)
		} else {
			w.WriteHeader(rc.answer(n, got))
		}
		_, _ = io.WriteString(w, respBody)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// newReceiverWithHeaders is a receiver whose answers carry headers.
func newReceiverWithHeaders(t *testing.T, respond func(r received) (int, http.Header)) *receiver {
	t.Helper()
	rc := newReceiver(t, nil)
	rc.mu.Lock()
	rc.respond = respond
	rc.mu.Unlock()
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.reqs...)
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.reqs)
}

// byID counts the requests per webhook-id.
func (rc *receiver) byID() map[string]int {
	out := map[string]int{}
	for _, r := range rc.requests() {
		out[r.ID]++
	}
	return out
}

// requireEachOnce asserts that n distinct events arrived, each once.
func (rc *receiver) requireEachOnce(t *testing.T, n int) {
	t.Helper()
	byID := rc.byID()
	require.Len(t, byID, n, "every event arrived")
	for id, c := range byID {
		require.Equal(t, 1, c, "event %s delivered once", id)
	}
}

// readOnly makes the test's database read-only (on) or writable again,
// and ends its other sessions so that the relay's new ones take the
// setting up, as a failover or an operator's switch does.
func (tb *testBundle) readOnly(t *testing.T, on bool) {
	t.Helper()
	ctx := context.Background()
	db := tb.pool.Config().ConnConfig.Database
	v := "off"
	if on {
		v = "on"
	}
	conn, err := tb.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// This session may have taken the setting up itself.
	_, err = conn.Exec(ctx, `SET default_transaction_read_only = off`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_read_only = `+v)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	require.NoError(t, err)
	tb.pool.Reset() // its sessions took the old setting when they connected
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
