package relay

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/admin"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Version is postbox's version, set at build time with
// -ldflags "-X github.com/postbox-relay/postbox/relay.Version=…".
var Version = "dev"

// Config is postbox's configuration (see package config).
type Config = config.Config

// Options are the relay's replaceable parts, for tests and embedding.
type Options struct {
	Logger zerolog.Logger
	// InstanceID names this instance in leases; a random one by default.
	InstanceID string
	// Now is the clock for timestamps; time.Now by default.
	Now func() time.Time
	// Rand returns floats in [0,1) for backoff jitter; math/rand by default.
	Rand func() float64
	// HTTP configures the delivery client (its dialer, clock).
	HTTP deliver.Options
}

// Relay streams the outbox and delivers its events. Start it, Stop it.
type Relay struct {
	cfg   atomic.Pointer[config.Config]
	log   zerolog.Logger
	owner string
	now   func() time.Time
	rand  func() float64

	client   *deliver.Client
	disp     *dispatch.Dispatcher
	guard    *guard
	limit    *limiter
	metrics  *telemetry.Metrics
	adminSrv atomic.Pointer[admin.Server]
	pool     *pgxpool.Pool
	store    *store.Store
	dbName   string

	durable   atomic.Uint64 // pglogrepl.LSN ingested so far
	streaming atomic.Bool
	backlog   atomic.Bool // the queue table may hold due deliveries
	claimWake chan struct{}
	due       dueTimes

	outMu      sync.Mutex
	outcomes   []dispatch.Outcome
	outWake    chan struct{}
	reconciled atomic.Bool
	reconMu    sync.Mutex

	startOnce sync.Once
	stopOnce  sync.Once
	stopCh    chan struct{}
	hardCtx   context.Context
	hardStop  context.CancelFunc
	stopped   chan struct{}
	err       error
}

// New returns a Relay for cfg (validated by config.Load or Validate). The
// relay keeps its own copy: validating resolves fields in place, and the
// caller may hand the same configuration to another relay, running.
func New(cfg *config.Config, opts Options) (*Relay, error) {
	own := *cfg
	cfg = &own
	if cfg.DatabaseURL == "" {
		return nil, &config.Error{Key: "database_url", Msg: "not set (set it in the file or POSTBOX_DATABASE_URL)"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		log:       opts.Logger.With().Str("component", "relay").Logger(),
		owner:     opts.InstanceID,
		now:       opts.Now,
		rand:      opts.Rand,
		claimWake: make(chan struct{}, 1),
		guard:     newGuard(),
		metrics:   telemetry.NewMetrics(),
		outWake:   make(chan struct{}, 1),
		stopCh:    make(chan struct{}),
		stopped:   make(chan struct{}),
	}
	if r.owner == "" {
		r.owner = newInstanceID()
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.rand == nil {
		r.rand = rand.Float64
	}
	r.cfg.Store(cfg)
	r.labelEndpoints(cfg)
	copts := opts.HTTP
	copts.UserAgent = "postbox/" + Version
	if copts.DialContext == nil {
		copts.DialContext = deliver.GuardedDialer(func() deliver.Guard { return r.cfg.Load().Guard() })
	}
	r.client = deliver.NewClient(copts)
	r.disp = dispatch.New(dispatch.Options{
		Capacity:       func(ep string) int { return r.cfg.Load().Endpoint(ep).MaxInFlight },
		Execute:        r.execute,
		OnOutcome:      r.onOutcome,
		MaxConcurrency: cfg.MaxConcurrency,
		OnFree: func() {
			if r.backlog.Load() {
				r.wakeClaimer()
			}
		},
	})
	r.hardCtx, r.hardStop = context.WithCancel(context.Background())
	return r, nil
}

func newInstanceID() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = cryptorand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

func (r *Relay) instance() store.Instance {
	host, _ := os.Hostname()
	return store.Instance{ID: r.owner, Hostname: host, PID: os.Getpid(), Version: Version, Streaming: r.streaming.Load()}
}

// InstanceID is the name this instance holds leases under.
func (r *Relay) InstanceID() string { return r.owner }

// Streaming reports whether this instance is streaming the slot now.
func (r *Relay) Streaming() bool { return r.streaming.Load() }

// Start begins streaming and delivering in the background. It returns at
// once; a fatal start-up problem (a preflight failure, say) ends the relay,
// which Stopped and Err report. An unreachable database is retried.
func (r *Relay) Start(ctx context.Context) error {
	started := false
	r.startOnce.Do(func() {
		started = true
		go func() {
			defer close(r.stopped)
			r.err = r.run()
			if r.err != nil {
				r.log.Error().Err(r.err).Msg("relay stopped")
			}
		}()
	})
	if !started {
		return errors.New("relay: already started")
	}
	return nil
}

// Stop shuts down gracefully: it stops reading WAL, lets in-flight
// attempts finish until ctx ends (then cancels them, returning their
// deliveries to the queue), records every result, confirms the LSN and
// closes its connections.
func (r *Relay) Stop(ctx context.Context) error {
	r.stopOnce.Do(func() { close(r.stopCh) })
	select {
	case <-r.stopped:
		return r.err
	case <-ctx.Done():
		r.hardStop()
		<-r.stopped
		return r.err
	}
}

// Stopped is closed when the relay has stopped.
func (r *Relay) Stopped() <-chan struct{} { return r.stopped }

// Err is why the relay stopped (nil after a clean Stop).
func (r *Relay) Err() error {
	select {
	case <-r.stopped:
		return r.err
	default:
		return nil
	}
}

// Reload swaps in a new configuration: endpoints, secrets and policies
// apply to the next attempt. Database, slot and table cannot change.
func (r *Relay) Reload(cfg *config.Config) error {
	own := *cfg // as in New: the relay's own copy
	cfg = &own
	if err := cfg.Validate(); err != nil {
		return err
	}
	old := r.cfg.Load()
	if cfg.DatabaseURL != old.DatabaseURL || cfg.Slot != old.Slot || cfg.Publication != old.Publication || cfg.OutboxTable != old.OutboxTable {
		return errors.New("relay: database_url, slot, publication and outbox_table need a restart")
	}
	r.cfg.Store(cfg)
	r.labelEndpoints(cfg)
	return nil
}

func (r *Relay) labelEndpoints(cfg *config.Config) {
	names := make([]string, 0, len(cfg.ConfiguredEndpoints()))
	for name := range cfg.ConfiguredEndpoints() {
		names = append(names, name)
	}
	r.metrics.SetLabeled(names, cfg.MetricsEndpointLabels)
}

// Metrics are the relay's Prometheus metrics.
func (r *Relay) Metrics() *telemetry.Metrics { return r.metrics }

// AdminAddr is the address the admin listener is bound to ("" when none,
// or before Start has bound it).
func (r *Relay) AdminAddr() string {
	if a := r.adminSrv.Load(); a != nil {
		return a.Addr()
	}
	return ""
}

// run is the relay's life: connect, check, migrate, then stream, claim,
// deliver and record until Stop, then shut down in order.
func (r *Relay) run() error {
	cfg := r.cfg.Load()
	lifeCtx, cancelLife := context.WithCancel(r.hardCtx)
	defer cancelLife()
	go func() {
		select {
		case <-r.stopCh:
		case <-lifeCtx.Done():
		}
		cancelLife()
	}()
	if cfg.AdminListen != "" {
		srv, err := admin.Listen(cfg.AdminListen, cfg.AdminToken, r.metrics.Registry,
			admin.Checks{Ready: r.ready, Status: r.status}, r.log)
		if err != nil {
			return fmt.Errorf("admin listener on %s: %w", cfg.AdminListen, err)
		}
		r.adminSrv.Store(srv)
		go srv.Serve()
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
		}()
		r.log.Info().Str("addr", srv.Addr()).Msg("admin listener (metrics, healthz, readyz, status)")
	}
	pool, err := r.connect(lifeCtx, cfg)
	if err != nil {
		if lifeCtx.Err() != nil {
			return nil // stopped before the database came up
		}
		return err
	}
	defer pool.Close()
	r.pool = pool
	r.store = &store.Store{Pool: pool, Table: cfg.Table(), Slot: cfg.Slot}
	r.limit = newLimiter(r.store)
	if err := store.Preflight(lifeCtx, pool); err != nil {
		return err
	}
	if err := pool.QueryRow(lifeCtx, `SELECT current_database()`).Scan(&r.dbName); err != nil {
		return fmt.Errorf("read database name: %w", err)
	}
	if err := store.Migrate(lifeCtx, pool, cfg.Table()); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	// Register before claiming anything: claims belong to registered
	// instances, and another instance releases those of unknown owners.
	for {
		err := r.store.Heartbeat(lifeCtx, r.instance(), cfg.Lease.D())
		if err == nil {
			break
		}
		if lifeCtx.Err() != nil {
			return nil
		}
		r.log.Warn().Err(err).Msg("registering this instance failed; retrying")
		select {
		case <-lifeCtx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	if len(cfg.Secrets()) == 0 {
		r.log.Warn().Msg("no signing secrets configured: deliveries are not signed (set signing.secrets or POSTBOX_SIGNING_SECRETS)")
	}
	r.log.Info().Str("instance", r.owner).Str("slot", cfg.Slot).Str("table", cfg.Table().String()).
		Str("version", Version).Msg("postbox started")

	// Workers that stop last get contexts that outlive the stream's.
	streamCtx, stopStream := context.WithCancel(r.hardCtx)
	claimCtx, stopClaims := context.WithCancel(r.hardCtx)
	stopRecords := make(chan struct{})
	maintCtx, stopMaint := context.WithCancel(r.hardCtx)
	var streamDone, claimDone, recordDone, maintDone sync.WaitGroup
	maintDone.Go(func() { r.telemetryLoop(maintCtx) })
	maintDone.Go(func() { r.watchSecrets(maintCtx) })
	streamDone.Go(func() { r.streamLoop(streamCtx) })
	claimDone.Go(func() { r.claimLoop(claimCtx) })
	claimDone.Go(func() { r.listenLoop(claimCtx) })
	recordDone.Go(func() { r.recordLoop(stopRecords) })
	maintDone.Go(func() { r.maintainLoop(maintCtx) })
	r.wakeClaimer() // deliveries left queued by an earlier run

	<-lifeCtx.Done()
	r.log.Info().Msg("shutting down: stopping the stream")
	stopStream()
	streamDone.Wait()
	stopClaims()
	claimDone.Wait()
	grace := cfg.ShutdownGrace.D()
	r.log.Info().Int("in_flight", r.disp.InFlight()).Dur("grace", grace).Msg("waiting for in-flight attempts")
	graceCtx, cancelGrace := context.WithTimeout(r.hardCtx, grace)
	r.disp.Stop(graceCtx)
	cancelGrace()
	close(stopRecords)
	recordDone.Wait()
	stopMaint()
	maintDone.Wait()
	relCtx, cancelRel := context.WithTimeout(context.Background(), 5*time.Second)
	if n, err := r.store.ReleaseOwned(relCtx, r.owner); err != nil {
		r.log.Warn().Err(err).Msg("could not release claimed deliveries; they return to the queue when this instance's lease expires")
	} else {
		if n > 0 {
			r.log.Info().Int64("deliveries", n).Msg("released claimed deliveries to the queue")
		}
		if err := r.store.Deregister(relCtx, r.owner); err != nil {
			r.log.Warn().Err(err).Msg("could not deregister this instance")
		}
	}
	cancelRel()
	r.log.Info().Stringer("confirmed_lsn", pglogrepl.LSN(r.durable.Load())).Msg("postbox stopped")
	return nil
}

// connect opens the pool, retrying with backoff while the database is
// unreachable; it gives up only when ctx ends.
func (r *Relay) connect(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	pool, err := store.Open(ctx, cfg.DatabaseURL, 16)
	if err != nil {
		return nil, err // a malformed URL: retrying cannot help
	}
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return pool, nil
		}
		wait := retryWait(attempt)
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("database unreachable")
		select {
		case <-ctx.Done():
			pool.Close()
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// retryWait is the wait before reconnect attempt n: 0.5 s doubling to 30 s,
// with jitter.
func retryWait(n int) time.Duration {
	d := 500 * time.Millisecond << min(n-1, 6)
	d = min(d, 30*time.Second)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func (r *Relay) wakeClaimer() {
	select {
	case r.claimWake <- struct{}{}:
	default:
	}
}

// Durable is the LSN up to which outbox transactions are ingested.
func (r *Relay) Durable() pglogrepl.LSN { return pglogrepl.LSN(r.durable.Load()) }

func (r *Relay) advanceDurable(lsn pglogrepl.LSN) {
	for {
		cur := r.durable.Load()
		if uint64(lsn) <= cur || r.durable.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

var _ wal.Acker = (*ingester)(nil)

// watchSecrets reloads the configuration when a secrets file changes (a
// Kubernetes secret rotated in place), so a rotation needs no restart and
// no signal.
func (r *Relay) watchSecrets(ctx context.Context) {
	type stamp struct {
		mod  time.Time
		size int64
	}
	read := func() map[string]stamp {
		out := map[string]stamp{}
		for _, f := range r.cfg.Load().SecretFiles() {
			if fi, err := os.Stat(f); err == nil {
				out[f] = stamp{fi.ModTime(), fi.Size()}
			}
		}
		return out
	}
	seen := read()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := read()
		changed := len(now) != len(seen)
		for f, s := range now {
			if seen[f] != s {
				changed = true
			}
		}
		if !changed {
			continue
		}
		seen = now
		next := *r.cfg.Load()
		if err := r.Reload(&next); err != nil {
			r.log.Error().Err(err).Msg("a secrets file changed but does not load; keeping the secrets in use")
			continue
		}
		r.log.Info().Msg("signing secrets reloaded: a secrets file changed")
	}
}
