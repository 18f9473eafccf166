package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// cmdDemo runs the whole path on this machine: a throwaway PostgreSQL,
// local receivers (one healthy, one failing for a while, one gone, and a
// partner kept as a row of postbox.endpoints whose URL changes by SQL
// mid-run), the relay, and an application transaction that writes
// postbacks.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf commonFlags
	fs := newFlagSet("demo", stderr, &cf)
	verbose := fs.Bool("v", false, "show the relay's log")
	keep := fs.Bool("keep", false, "keep PostgreSQL and the relay running after the demo, to try the other commands, until interrupted")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if err := demo(ctx, stdout, stderr, *verbose, *keep); err != nil {
		fmt.Fprintln(stderr, "postbox demo:", err)
		return exitFailure
	}
	return exitOK
}

type demoLine struct {
	mu sync.Mutex
	w  io.Writer
	t0 time.Time
}

func (d *demoLine) printf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.w, "%6.0fms  ", float64(time.Since(d.t0).Microseconds())/1000)
	fmt.Fprintf(d.w, format, args...)
	fmt.Fprintln(d.w)
}

func demo(ctx context.Context, stdout, stderr io.Writer, verbose, keep bool) error {
	out := &demoLine{w: stdout, t0: time.Now()}
	fmt.Fprintln(stdout, "postbox demo: a throwaway PostgreSQL, four local receivers and the relay.")
	fmt.Fprintln(stdout)

	out.printf("starting PostgreSQL (initdb in a temporary directory)…")
	cluster, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		return err
	}
	defer func() {
		_ = cluster.Stop()
		out.printf("PostgreSQL stopped and %s removed", cluster.Dir())
	}()
	dbURL, err := cluster.CreateDatabase(ctx, "demo")
	if err != nil {
		return err
	}
	out.printf("PostgreSQL ready (wal_level=logical)")

	secret := outbox.NewSecret()
	master, err := outbox.ParseSecret(secret)
	if err != nil {
		return err
	}
	// A row of postbox.endpoints signs with its own secret, derived from
	// the master for its name: what the partner is given.
	derived := map[string]outbox.Secret{"partner": outbox.DeriveSecret(master, "affiliate")}
	verify := func(name string, r *http.Request, body []byte) string {
		key, ok := derived[name]
		if !ok {
			key = master
		}
		if err := outbox.VerifyWith([]outbox.Secret{key}, outbox.DefaultTolerance, r.Header, body, time.Now()); err != nil {
			return "signature INVALID: " + err.Error()
		}
		return "signature verified"
	}
	receiver := func(name string, answer func(n int64) int) *httptest.Server {
		var calls atomic.Int64
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			n := calls.Add(1)
			code := answer(n)
			out.printf("%-7s ← %s %-14s webhook-id %.8s…  answers %d  (%s)", name, r.Method, r.URL.Path,
				r.Header.Get("webhook-id"), code, verify(name, r, body))
			w.WriteHeader(code)
		}))
	}
	shop := receiver("shop", func(int64) int { return http.StatusOK })
	defer shop.Close()
	crm := receiver("crm", func(n int64) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	defer crm.Close()
	legacy := receiver("legacy", func(int64) int { return http.StatusUnauthorized })
	defer legacy.Close()
	partner := receiver("partner", func(int64) int { return http.StatusOK })
	defer partner.Close()
	out.printf("receivers: shop (healthy), crm (503 twice, then recovers), legacy (401: its credentials changed), partner (healthy)")

	file := config.Default()
	file.DatabaseURL = dbURL
	file.AllowPrivateTargets = true // the receivers listen on loopback
	file.AdminListen = "127.0.0.1:0"
	// The console's actions (replay, pause, resume) need a token.
	file.AdminToken = demoToken()
	file.SearchKeys = []string{"click_id"}
	file.Signing.Secrets = []string{secret}
	file.ShutdownGrace = config.Duration(5 * time.Second)
	base := config.Duration(300 * time.Millisecond)
	file.Defaults.BackoffBase = &base
	file.Endpoints = demoEndpoints(shop.URL, crm.URL, legacy.URL)
	cfg, err := file.Resolve()
	if err != nil {
		return err
	}
	logw := io.Discard
	if verbose {
		logw = stderr
	}
	r, err := relay.New(cfg, relay.Options{Logger: zerolog.New(logw).With().Timestamp().Logger()})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = r.Stop(stopCtx)
		cancel()
		out.printf("relay stopped")
	}()

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The relay creates the outbox table; wait for it like an application
	// whose migrations ran first would not need to.
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT to_regclass('postbox.outbox') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'postbox')`).Scan(&ok)
		return ok, err
	}); err != nil {
		return fmt.Errorf("relay did not come up: %w", err)
	}
	out.printf("relay streaming (slot postbox, table postbox.outbox)")

	// The application's business transaction: an order, and its postbacks.
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, total numeric NOT NULL)`); err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var orderID int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (total) VALUES (42.50) RETURNING id`).Scan(&orderID); err != nil {
			return err
		}
		payload := fmt.Sprintf(`{"order_id": %d, "total": "42.50", "click_id": "clk_7Hq2"}`, orderID)
		for _, ep := range []string{"shop", "crm", "legacy"} {
			if _, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: ep, Type: "order.created", Payload: []byte(payload)}); err != nil {
				return err
			}
		}
		// An endpoint nobody configured, without a URL: a dead letter.
		_, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: "ghost", Type: "order.created", Payload: []byte(payload)})
		return err
	})
	if err != nil {
		return err
	}
	out.printf("application committed 1 order and 4 postbacks in one transaction")

	settled := func(n int) error {
		if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
			var settled, total int
			err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status IN ('delivered', 'dead_letter')), count(*) FROM postbox.deliveries`).Scan(&settled, &total)
			return total == n && settled == n, err
		}); err != nil {
			return fmt.Errorf("deliveries did not settle: %w", err)
		}
		return nil
	}
	if err := settled(4); err != nil {
		return err
	}

	// A partner kept as a row of postbox.endpoints, as a back office
	// writes it, and its URL changed with SQL mid-run: the next postback
	// follows it, with no reload and no restart.
	postback := func(click string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: "affiliate", Type: "deposit",
				Payload: []byte(fmt.Sprintf(`{"click_id": %q, "amount": "20.00"}`, click))})
			return err
		})
	}
	if _, err := pool.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) VALUES ('affiliate', $1)`, partner.URL+"/postback/v1"); err != nil {
		return err
	}
	out.printf("application inserted endpoint affiliate as a row of postbox.endpoints: url …/postback/v1")
	if err := postback("clk_9Xa1"); err != nil {
		return err
	}
	if err := settled(5); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `UPDATE postbox.endpoints SET url = $1 WHERE name = 'affiliate'`, partner.URL+"/postback/v2"); err != nil {
		return err
	}
	out.printf("application changed affiliate's url by SQL: …/postback/v2 (no reload, no restart)")
	if err := postback("clk_4Kd8"); err != nil {
		return err
	}
	if err := settled(6); err != nil {
		return err
	}
	out.printf("all deliveries settled")
	fmt.Fprintln(stdout)
	if err := demoReport(ctx, stdout, pool); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "Console: http://%s/  (admin token for replay, pause and resume: %s)\n", r.AdminAddr(), file.AdminToken)
	if !keep {
		fmt.Fprintln(stdout, "Run `postbox demo --keep` to keep it up and browse the demo's data there.")
	}
	if keep {
		// The partner's own window: a portal link for the affiliate row,
		// addressed to the listener the demo bound.
		linkCfg := *cfg
		linkCfg.Portal.PublicURL = "http://" + r.AdminAddr()
		link, err := relay.NewPortalLink(ctx, pool, &linkCfg, "affiliate", 7*24*time.Hour)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Partner portal of affiliate (what that partner would be sent): %s\n", link.URL)
		fmt.Fprintf(stdout, "\nPostgreSQL, the receivers and the relay keep running; open the console, or in another shell try:\n\n")
		fmt.Fprintf(stdout, "  export POSTBOX_DATABASE_URL='%s'\n", dbURL)
		fmt.Fprintf(stdout, "  postbox status\n  postbox endpoints\n  postbox dead-letters analyze\n  postbox replay --dead-letters --endpoint legacy --dry-run\n\n")
		fmt.Fprintln(stdout, "Interrupt (Ctrl-C) to stop and clean up.")
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		<-sigs
		signal.Stop(sigs)
	}
	return nil
}

func demoReport(ctx context.Context, w io.Writer, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `
		SELECT d.endpoint, d.status, d.attempt_count, coalesce(d.last_status_code::text, '-'),
		       coalesce(round(d.commit_to_delivery_ms::numeric, 1)::text || ' ms', '-'), coalesce(d.last_error, '')
		FROM postbox.deliveries d ORDER BY d.endpoint`)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tSTATUS\tATTEMPTS\tLAST STATUS\tCOMMIT→DELIVERY\tLAST ERROR")
	for rows.Next() {
		var ep, status, code, c2d, lastErr string
		var attempts int
		if err := rows.Scan(&ep, &status, &attempts, &code, &c2d, &lastErr); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", ep, status, attempts, code, c2d, lastErr)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	// What `postbox status` and `postbox dead-letters analyze` would say.
	s, err := telemetry.LoadSummary(ctx, pool, config.SlotDefault)
	if err != nil {
		return err
	}
	eps, err := telemetry.LoadEndpoints(ctx, pool, "")
	if err != nil {
		return err
	}
	s.Alerts = telemetry.Firing(telemetry.Evaluate(s, eps, config.DefaultAlerts()))
	fmt.Fprintln(w, "$ postbox status")
	printStatus(w, s)
	fmt.Fprintln(w)
	an, err := telemetry.AnalyzeDeadLetters(ctx, pool, "", time.Now().Add(-time.Hour))
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "$ postbox dead-letters analyze")
	printAnalysis(w, an)
	return nil
}

// demoToken is a fresh admin token for the demo's console.
func demoToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("timed out")
			}
			return fmt.Errorf("after %s: %w", limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ptr[T any](v T) *T { return &v }

// demoEndpoints are the demo's endpoints, given its receivers' base URLs.
func demoEndpoints(shop, crm, legacy string) map[string]config.EndpointConfig {
	return map[string]config.EndpointConfig{
		"shop":   {URL: ptr(shop + "/hooks/orders")},
		"crm":    {URL: ptr(crm + "/webhooks")},
		"legacy": {URL: ptr(legacy + "/v1/callback")},
	}
}
