package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// BenchmarkFanoutCatchup measures a catch-up of events routed by
// subscription, beside the same deliveries addressed one an event: a
// backlog written while the relay is down (100 deliveries a transaction:
// one routed row, or 100 addressed), then the relay started, on a server
// of its own with fsync on. It reports deliveries/s from the relay's start
// to the last delivery's arrival, and when the last event was ingested.
//
//	go test -run '^$' -bench FanoutCatchup -benchtime 1x ./relay/
//
// POSTBOX_BENCH_FANOUT_DELIVERIES sets the deliveries of each run
// (100,000 unless set).
func BenchmarkFanoutCatchup(b *testing.B) {
	deliveries := 100_000
	if v, err := strconv.Atoi(os.Getenv("POSTBOX_BENCH_FANOUT_DELIVERIES")); err == nil && v > 0 {
		deliveries = v
	}
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cluster.Stop() })
	const subscribers = 100
	b.Run("fanout-100", func(b *testing.B) {
		for range b.N {
			fanoutCatchup(b, cluster, subscribers, deliveries/subscribers, true)
		}
	})
	b.Run("single", func(b *testing.B) {
		for range b.N {
			fanoutCatchup(b, cluster, subscribers, deliveries, false)
		}
	})
}

// fanoutCatchup runs one catch-up of rows events: each routed to every
// one of subscribers endpoints (routed), or addressed to one of them in
// turn.
func fanoutCatchup(b *testing.B, cluster *pgtest.Cluster, subscribers, rows int, routed bool) {
	b.StopTimer()
	ctx := context.Background()
	dbURL, err := cluster.CreateDatabase(ctx, "fanout_bench")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cluster.DropDatabase(ctx, dbURL) }()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()

	var got atomic.Int64
	want := int64(rows)
	if routed {
		want *= int64(subscribers)
	}
	done := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if got.Add(1) == want {
			done <- time.Now()
		}
	}))
	defer srv.Close()

	cfg := config.Default()
	cfg.DatabaseURL = dbURL
	cfg.Slot, cfg.Publication = pgtest.UniqueName("slot"), pgtest.UniqueName("pub")
	cfg.AllowPrivateTargets = true
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Signing.Secrets = []string{outbox.NewSecret()}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	resolved, err := cfg.Resolve()
	if err != nil {
		b.Fatal(err)
	}
	resolved.EndpointTable = config.NewEndpointTable()
	for i := range subscribers {
		u := fmt.Sprintf("%s/s%d", srv.URL, i)
		resolved.EndpointTable.Apply(config.TableEndpoint{Name: fmt.Sprintf("s%d", i), Enabled: true, Revision: 1,
			EventTypes: []string{"order.*"}, Settings: config.EndpointConfig{URL: &u}})
	}
	if _, err := pool.Exec(ctx, outbox.SchemaSQL(resolved.Table)); err != nil {
		b.Fatal(err)
	}
	// The relay makes its slot at its first start: start it once, so the
	// backlog below is written behind the slot and streamed.
	start := func() *relay.Relay {
		opts := relay.Options{Logger: zerolog.Nop()}.WithBeneathGuard(func(ap netip.AddrPort) error {
			if ap.Addr().Unmap().IsLoopback() {
				return nil
			}
			return fmt.Errorf("benchmark dials loopback only, not %s", ap)
		})
		r, err := relay.New(resolved, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			b.Fatal(err)
		}
		return r
	}
	stop := func(r *relay.Relay) {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}
	r := start()
	for deadline := time.Now().Add(30 * time.Second); !r.Streaming(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the relay did not stream")
		}
	}
	stop(r)

	endpoint := "NULL"
	if !routed {
		endpoint = "'s' || (i % " + strconv.Itoa(subscribers) + ")"
	}
	// 100 deliveries a transaction either way: one routed row, or 100
	// addressed ones.
	perTx := 100
	if routed {
		perTx = max(100/subscribers, 1)
	}
	for first := 0; first < rows; first += perTx {
		_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, event_type, payload)
			SELECT `+endpoint+`, 'order.paid', jsonb_build_object('i', i, 'click_id', 'clk_' || i, 'payout', '1.00')
			FROM generate_series($1::int, $1::int + $2 - 1) i`, first, min(perTx, rows-first))
		if err != nil {
			b.Fatal(err)
		}
	}

	b.StartTimer()
	began := time.Now()
	r = start()
	defer stop(r)
	// When the last event is ingested: the catch-up's ingest, and its
	// deliveries after it.
	ingested := make(chan time.Duration, 1)
	go func() {
		for time.Since(began) < 10*time.Minute {
			var n int64
			if pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events`).Scan(&n) == nil && n >= want {
				ingested <- time.Since(began)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	var last time.Time
	select {
	case last = <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("%d of %d deliveries in 10 minutes", got.Load(), want)
	}
	b.StopTimer()
	secs := last.Sub(began).Seconds()
	b.ReportMetric(float64(want)/secs, "deliveries/s")
	b.ReportMetric(secs, "s/catchup")
	select {
	case d := <-ingested:
		b.ReportMetric(d.Seconds(), "s/ingest")
	case <-time.After(time.Second):
	}
	time.Sleep(200 * time.Millisecond) // a delivery sent twice would arrive by now
	if n := got.Load(); n != want {
		b.Fatalf("%d deliveries arrived, %d expected", n, want)
	}
}
