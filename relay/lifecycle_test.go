package relay_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
)

// Not parallel: parallel tests are paused while it runs, so every
// goroutine that appears between its snapshot and its check is the
// relay's.
func TestStopJoinsEveryGoroutine(t *testing.T) {
	tb := setup(t)
	rc := newReceiver(t, func(n int, _ received) int {
		if n%3 == 0 {
			return http.StatusServiceUnavailable // some retries, some results waiting for their ingest
		}
		return http.StatusOK
	})
	tb.endpoint(t, "ep", rc.URL, nil)
	before := goleak.IgnoreCurrent()

	opts := relay.Options{Logger: zerolog.New(tb.logs).Level(zerolog.DebugLevel)}
	r, err := relay.New(tb.resolved(t), opts)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	waitUntil(t, 30*time.Second, "streaming", r.Streaming)
	for range 5 {
		evs := make([]outbox.Event, 20)
		for i := range evs {
			evs[i] = outbox.Event{Endpoint: "ep", Payload: []byte(`{}`)}
		}
		tb.insert(t, evs...)
	}
	waitUntil(t, 30*time.Second, "deliveries", func() bool { return rc.count() >= 100 })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(ctx))
	select {
	case <-r.Stopped():
	default:
		t.Fatal("Stop returned before Stopped closed")
	}
	rc.CloseClientConnections()
	// The test's own pool too: pgconn starts a background reader on a
	// connection whose write is slow (a loaded machine), and it waits in
	// a read until the connection closes.
	tb.pool.Close()
	goleak.VerifyNone(t, before)
}

func TestStartReturnsATakenAdminAddress(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	tb.cfg.AdminListen = ln.Addr().String()
	r, err := relay.New(tb.resolved(t), relay.Options{Logger: zerolog.Nop()})
	require.NoError(t, err)
	err = r.Start(context.Background())
	require.ErrorContains(t, err, "admin listener on "+ln.Addr().String())
	require.ErrorContains(t, err, "address already in use")
	select {
	case <-r.Stopped():
	default:
		t.Fatal("a relay that failed to start is not stopped")
	}
	require.Equal(t, err, r.Err())
	require.Equal(t, err, r.Stop(context.Background()), "Stop after a failed Start returns its error")
}

func TestStartWaitsForAnUnreachableDatabaseNotReady(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	file := config.Default()
	file.DatabaseURL = "postgres://postbox@" + dead + "/none?connect_timeout=1"
	file.AdminListen = "127.0.0.1:0"
	cfg, err := file.Resolve()
	require.NoError(t, err)
	r, err := relay.New(cfg, relay.Options{Logger: zerolog.New(tb.logs)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- r.Start(ctx) }()
	waitUntil(t, 10*time.Second, "the admin listener", func() bool { return r.AdminAddr() != "" })
	resp, err := http.Get("http://" + r.AdminAddr() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "not ready while the database is unreachable")
	waitUntil(t, 10*time.Second, "a retry logged", func() bool { return strings.Contains(tb.logs.String(), "database unreachable") })

	cancel()
	select {
	case err := <-started:
		require.ErrorContains(t, err, "database unreachable")
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return when its context ended")
	}
}

// An application hands the relay its own pool: the relay uses it, sizes
// nothing, and leaves it open at Stop.
func TestApplicationsOwnPool(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "ep", rc.URL, nil)
	pc, err := pgxpool.ParseConfig(tb.dbURL)
	require.NoError(t, err)
	relay.ConfigurePool(pc)
	pc.MaxConns = relay.PoolSize(tb.resolved(t))
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	defer pool.Close()

	r, err := relay.New(tb.resolved(t), relay.Options{Logger: zerolog.New(tb.logs), Pool: pool})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	waitUntil(t, 30*time.Second, "streaming", r.Streaming)
	tb.insert(t, outbox.Event{Endpoint: "ep", Payload: []byte(`{}`)})
	tb.waitSettled(t, 1, 20*time.Second)
	var app string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting('application_name')`).Scan(&app))
	require.Equal(t, "postbox", app, "ConfigurePool's session settings")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(ctx))
	require.NoError(t, pool.Ping(context.Background()), "the application's pool stays open")
}
