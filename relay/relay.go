package relay

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/admin"
	"github.com/postbox-relay/postbox/relay/internal/claim"
	"github.com/postbox-relay/postbox/relay/internal/console"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/endpointsync"
	"github.com/postbox-relay/postbox/relay/internal/execute"
	"github.com/postbox-relay/postbox/relay/internal/guard"
	"github.com/postbox-relay/postbox/relay/internal/ingest"
	"github.com/postbox-relay/postbox/relay/internal/maintain"
	"github.com/postbox-relay/postbox/relay/internal/portal"
	"github.com/postbox-relay/postbox/relay/internal/protect"
	"github.com/postbox-relay/postbox/relay/internal/record"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Version is postbox's version, set at build time with
// -ldflags "-X github.com/postbox-relay/postbox/relay.Version=…".
var Version = "dev"

// Config is postbox's configuration (see package config).
type Config = config.Config

// Options are the relay's replaceable parts for an application that embeds
// it.
type Options struct {
	Logger zerolog.Logger
	// InstanceID names this instance in leases; a random one by default.
	InstanceID string
	// Pool, when set, is the application's own pool for postbox's queries
	// (configure it with ConfigurePool, and give it PoolSize connections
	// to spare). The relay never closes it. The replication connection
	// still comes from the configuration's database_url.
	Pool *pgxpool.Pool

	// The parts below are the tests' (export_test.go sets them).

	// now is the clock for timestamps; time.Now by default.
	now func() time.Time
	// rand returns floats in [0,1) for backoff jitter; math/rand by default.
	rand func() float64
	// beneathGuard is asked about every address the relay's guard lets
	// through, just before the connect (see guard.Dialer).
	beneathGuard func(netip.AddrPort) error
	// ingestLinger is how long the ingest of a live transaction waits for
	// the transactions that follow, to commit them together
	// (ingest.LingerDefault when zero).
	ingestLinger time.Duration
	// endpointsGateOnly: the applied endpoints change only before an
	// attempt that needs it (endpointsync.Syncer.GateOnly).
	endpointsGateOnly bool
}

// Relay streams the outbox and delivers its events. Start it, Stop it.
type Relay struct {
	cfg     atomic.Pointer[config.Config]
	opts    Options
	log     zerolog.Logger
	owner   string
	metrics *telemetry.Metrics
	client  *deliver.Client
	faults  *service.Faults
	// table is the endpoints of postbox.endpoints as this instance applied
	// them: every configuration the relay loads uses it, so a reload
	// keeps it.
	table *config.EndpointTable

	// svc is set once Start has connected and built the services; the
	// admin listener's checks read it from their own goroutines.
	svc   atomic.Pointer[services]
	admin atomic.Pointer[admin.Server]
	// portalSrv is the portal's own listener (portal_listen), if any.
	portalSrv  atomic.Pointer[http.Server]
	portalH    *portal.Portal // one for both listeners: rate limits are shared
	portalAddr atomic.Value   // string: portal_listen's bound address
	serve      sync.WaitGroup // the admin listener's Serve

	life     sync.Mutex // Start and the first Stop, one at a time
	started  bool
	stopOnce sync.Once
	hardCtx  context.Context // ends when a Stop runs out of time
	hardStop context.CancelFunc
	stopped  chan struct{}
	err      error
	fatal    atomic.Pointer[error] // a fault no waiting cures, for Err
}

// services are the relay's parts, each owning its goroutines. They start in
// the order of the fields and stop in reverse (see shutdown).
type services struct {
	env      *service.Env
	pool     *pgxpool.Pool
	ownPool  bool
	prot     *protect.Protection  // no goroutines: a view of held-back endpoints
	exec     *execute.Executor    // no goroutines: the dispatcher's run it
	disp     *dispatch.Dispatcher // one goroutine per attempt in flight
	recorder *record.Recorder     // the recording loop
	claimer  *claim.Claimer       // the claim loop and the LISTEN loop
	ingest   *ingest.Supervisor   // the stream loop and each session's lease keeper, ingester and reconciler
	// endpoints keeps the table of postbox.endpoints as applied: its
	// LISTEN and poll loops. Started first (the others resolve against
	// it), stopped last.
	endpoints *endpointsync.Syncer
	maint     *maintain.Maintainer // the maintenance services, one duty each
}

// New returns a Relay for cfg, a resolved configuration (config.Load,
// config.Parse or File.Resolve), which the relay only reads.
func New(cfg *config.Config, opts Options) (*Relay, error) {
	if cfg.DatabaseURL == "" {
		return nil, &config.Error{Key: "database_url", Msg: "not set (set it in the file or POSTBOX_DATABASE_URL)"}
	}
	if err := resolved(cfg); err != nil {
		return nil, err
	}
	r := &Relay{
		opts:    opts,
		log:     opts.Logger.With().Str("component", "relay").Logger(),
		owner:   opts.InstanceID,
		metrics: telemetry.NewMetrics(),
		stopped: make(chan struct{}),
	}
	if r.owner == "" {
		r.owner = newInstanceID()
	}
	if r.opts.now == nil {
		r.opts.now = time.Now
	}
	if r.opts.rand == nil {
		r.opts.rand = rand.Float64
	}
	r.faults = service.NewFaults(opts.Logger.With().Str("component", "database").Logger(), r.opts.now)
	r.metrics.SetWalsender(r.walsenderCPU)
	r.table = config.NewEndpointTable()
	cfg = r.withTable(cfg)
	r.cfg.Store(cfg)
	r.labelEndpoints(cfg)
	r.client = deliver.NewClient(deliver.Options{
		UserAgent:   "postbox/" + Version,
		DialContext: guard.Dialer(func() guard.Guard { return execute.Guard(r.cfg.Load()) }, opts.beneathGuard),
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

// Start binds the admin listener, connects (waiting, with backoff, while
// the database is unreachable, for as long as ctx allows), checks the
// server, migrates postbox's schema (or, with migrate: false, checks its
// version), registers this instance, and starts streaming and delivering
// in the background. Every start-up problem comes back from Start: a
// taken admin address, a server without wal_level=logical, a failed
// migration, or ctx ending before the database answered. Once Start has
// returned nil, only Stop ends the relay, or a fault no waiting cures (a
// slot of another database), which Err then returns.
func (r *Relay) Start(ctx context.Context) error {
	r.life.Lock()
	defer r.life.Unlock()
	if r.started {
		return errors.New("relay: already started (or stopped)")
	}
	r.started = true
	if err := r.start(ctx); err != nil {
		r.err = err
		r.stopOnce.Do(func() {})
		r.closeAdmin()
		r.hardStop()
		close(r.stopped)
		return err
	}
	return nil
}

func (r *Relay) start(ctx context.Context) error {
	cfg := r.cfg.Load()
	if cfg.AdminListen != "" {
		con := console.New(console.Options{Pool: r.pool, Config: r.cfg.Load, Loopback: admin.LoopbackAddr(cfg.AdminListen),
			Version: Version, Log: r.opts.Logger, Now: r.opts.now})
		// The portal's pages, exempt from the admin token (they have their
		// own sessions); every other path is the console's.
		pages := http.NewServeMux()
		pages.Handle(portal.Prefix, r.portal())
		pages.Handle("/", con)
		var certs *admin.TLS
		if cfg.AdminTLSCert != "" {
			var err error
			if certs, err = admin.LoadTLS(cfg.AdminTLSCert, cfg.AdminTLSKey); err != nil {
				return fmt.Errorf("admin_tls_cert: %w", err)
			}
		}
		srv, err := admin.Listen(cfg.AdminListen, func() string { return r.cfg.Load().AdminToken }, r.metrics.Registry,
			admin.Checks{Ready: r.ready, Status: r.status}, pages, certs, r.log)
		if err != nil {
			return fmt.Errorf("admin listener on %s: %w", cfg.AdminListen, err)
		}
		r.admin.Store(srv)
		r.serve.Go(srv.Serve)
		r.log.Info().Str("addr", srv.Addr()).Msg("admin listener (console, portal, metrics, healthz, readyz, status)")
	}
	if cfg.PortalListen != "" {
		if err := r.listenPortal(cfg); err != nil {
			return err
		}
	}
	pool, own := r.opts.Pool, false
	if pool == nil {
		var err error
		if pool, err = r.connect(ctx, cfg); err != nil {
			return err
		}
		own = true
	}
	env, err := r.bootWhenReady(ctx, pool, cfg)
	if err != nil {
		if own {
			pool.Close()
		}
		return err
	}
	s := &services{env: env, pool: pool, ownPool: own}
	s.prot = protect.New(env)
	s.exec = execute.New(env, r.client, s.prot)
	// Jobs go round: the dispatcher hands outcomes to the recorder, which
	// tells the claimer of retries and room, which feeds the dispatcher.
	// The dispatcher is connected once the other two exist.
	s.disp = dispatch.New(dispatch.Options{
		Capacity: func(lane string) int {
			cfg := r.cfg.Load()
			return cfg.Endpoint(cfg.NameOf(lane)).MaxInFlight
		},
		Execute:        s.exec.Execute,
		MaxConcurrency: cfg.MaxConcurrency,
	})
	s.claimer = claim.New(env, s.disp, s.prot)
	// A change of an endpoint's row wakes a claim: its held events may
	// be due again.
	s.endpoints = endpointsync.New(env, r.table, s.claimer.Queued)
	if r.opts.endpointsGateOnly {
		s.endpoints.GateOnly()
	}
	s.exec.Gate(s.endpoints.Await)
	s.claimer.HoldFor(s.endpoints.Held)
	s.recorder = record.New(env, s.disp, s.prot, s.claimer)
	s.disp.Connect(s.recorder, s.claimer)
	s.ingest = ingest.New(env, ingest.Deps{Fast: s.disp, Blocked: s.prot.Blocked, Queued: s.claimer.Queued, Kept: s.claimer.Wake, Alone: env.Alone,
		Linger: r.opts.ingestLinger, Fatal: r.fail, Endpoints: s.endpoints})
	s.maint = maintain.New(env, maintain.Deps{Streaming: s.ingest.Streaming, Queued: s.claimer.Queued, Reload: r.Reload,
		WalsenderCPU: s.ingest.WalsenderCPU})

	// Each service's context is the relay's hard one: Stop ends them
	// gracefully, a Stop that runs out of time cancels what is left.
	type starter struct {
		name  string
		start func(context.Context) error
		stop  func()
	}
	order := []starter{
		{"endpoints", s.endpoints.Start, s.endpoints.Stop},
		{"recorder", s.recorder.Start, s.recorder.Stop},
		{"claimer", s.claimer.Start, s.claimer.Stop},
		{"ingest", s.ingest.Start, s.ingest.Stop},
		{"maintenance", s.maint.Start, s.maint.Stop},
	}
	for i, st := range order {
		if err := st.start(r.hardCtx); err != nil {
			for j := i - 1; j >= 0; j-- {
				order[j].stop()
			}
			if own {
				pool.Close()
			}
			return fmt.Errorf("start %s: %w", st.name, err)
		}
	}
	r.svc.Store(s)
	if len(cfg.Secrets) == 0 {
		r.log.Warn().Msg("no signing secrets configured: deliveries are not signed (set signing.secrets or POSTBOX_SIGNING_SECRETS)")
	}
	r.warnEmitGrants(ctx, pool, cfg)
	r.log.Info().Str("instance", r.owner).Str("slot", cfg.Slot).Str("table", cfg.Table.String()).
		Str("version", Version).Int32("pool", pool.Config().MaxConns).Msg("postbox started")
	return nil
}

// boot checks the server, migrates (or checks the schema), and registers
// this instance: claims belong to registered instances, and another
// instance releases those of unknown owners.
func (r *Relay) boot(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) (*service.Env, error) {
	env := service.NewEnv(&r.cfg)
	env.Store = &store.Store{Pool: pool, Table: cfg.Table, Slot: cfg.Slot}
	env.Log, env.Metrics, env.Owner, env.Version = r.opts.Logger, r.metrics, r.owner, Version
	env.Now, env.Rand = r.opts.now, r.opts.rand
	env.Faults = r.faults
	if err := store.Preflight(ctx, pool); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, `SELECT current_database(), current_user`).Scan(&env.DBName, &env.Store.Role); err != nil {
		return nil, fmt.Errorf("read database name: %w", err)
	}
	if cfg.Migrate {
		if err := store.Migrate(ctx, pool, cfg.Table); err != nil {
			if store.Refused(err) {
				return nil, fmt.Errorf("migrate: %w: this role may not change the schema; run postbox migrate as its owner, "+
					"and postbox run with migrate: false (or --no-migrate)", err)
			}
			return nil, fmt.Errorf("migrate: %w", err)
		}
	} else if err := store.CheckSchema(ctx, pool, cfg.Table); err != nil {
		return nil, err
	}
	r.logMissing(ctx, pool, cfg)
	// The leader's upkeep writes them again each minute (a reload, a
	// grant given later): a failure here costs sums, not the relay.
	if err := env.Store.SyncReportFields(ctx, cfg.ReportSum); err != nil {
		r.log.Warn().Err(err).Msg("report_sum: could not write the summed fields")
	}
	if err := env.Store.Heartbeat(ctx, pool, env.Instance(false), cfg.Lease, false); err != nil {
		return nil, fmt.Errorf("register this instance: %w", err)
	}
	// Known before the stream starts: a backlog waiting for this instance
	// is ingested in its first seconds (the heartbeats keep it current).
	if peers, err := env.Store.Peers(ctx, r.owner); err == nil {
		env.SetAlone(peers == 0)
	}
	return env, nil
}

// bootWhenReady boots, retrying with backoff while the database's errors
// are ones that waiting cures (a restart, a failover, a read-only spell),
// until ctx ends. Other errors come back at once.
func (r *Relay) bootWhenReady(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) (*service.Env, error) {
	for attempt := 1; ; attempt++ {
		env, err := r.boot(ctx, pool, cfg)
		r.faults.Observe("start", err)
		if err == nil || !store.Transient(err) || ctx.Err() != nil {
			return env, err
		}
		wait := service.RetryWait(attempt)
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("database not ready")
		if !service.Sleep(ctx, wait) {
			return nil, err
		}
	}
}

// connect opens the pool, retrying with backoff while the database is
// unreachable, until ctx ends.
func (r *Relay) connect(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	pool, err := store.Open(ctx, cfg.DatabaseURL, PoolSize(cfg))
	if err != nil {
		return nil, err // a malformed URL: retrying cannot help
	}
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, PingTimeoutDefault)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return pool, nil
		}
		wait := service.RetryWait(attempt)
		r.log.Warn().Err(err).Dur("retry_in", wait).Msg("database unreachable")
		if !service.Sleep(ctx, wait) {
			pool.Close()
			return nil, fmt.Errorf("database unreachable: %w", err)
		}
	}
}

// PingTimeoutDefault bounds one connection attempt at start.
const PingTimeoutDefault = 10 * time.Second

// PoolSize is how many connections the relay's services hold at most at
// once under cfg: the ingester and reconciliation (one each), the LISTEN,
// the claimer, the recorder, maintenance (two), the admin checks (two),
// the console (two), and a share of max_concurrency for the token buckets
// that rate-limited attempts take from.
func PoolSize(cfg *config.Config) int32 {
	const fixed = 9 + console.ConcurrentPagesDefault
	return fixed + int32(min(max(cfg.MaxConcurrency/32, 2), 8))
}

// ConfigurePool sets the session settings postbox's queries rely on (UTC,
// ISO dates, custom plans, no JIT) on an application's pool configuration,
// for Options.Pool.
func ConfigurePool(pc *pgxpool.Config) { store.Configure(pc) }

// Stop shuts down gracefully, in this order: it stops reading WAL (the
// ingester commits what it was sent and the position is confirmed), stops
// claiming, lets in-flight attempts finish within shutdown_grace (then
// cancels them, returning their deliveries to the queue), records every
// result, stops maintenance, releases its claims and closes its
// connections. When ctx ends first, what remains is cut short. Stop
// returns when every goroutine the relay started has returned.
func (r *Relay) Stop(ctx context.Context) error {
	first := false
	r.stopOnce.Do(func() { first = true })
	if !first {
		select {
		case <-r.stopped:
		case <-ctx.Done():
			r.hardStop()
			<-r.stopped
		}
		return r.err
	}
	r.life.Lock()
	defer r.life.Unlock()
	r.started = true // a Start after Stop refuses
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-ctx.Done():
			r.hardStop()
		case <-done:
		}
	})
	if s := r.svc.Load(); s != nil {
		r.shutdown(s)
	}
	r.closeAdmin()
	r.client.CloseIdle()
	close(done)
	watch.Wait()
	r.hardStop()
	if f := r.fatal.Load(); f != nil && r.err == nil {
		r.err = *f
	}
	close(r.stopped)
	return r.err
}

// fail stops the relay for a fault no waiting cures (a slot of another
// database): Err returns it, and postbox run exits with it.
func (r *Relay) fail(err error) {
	if !r.fatal.CompareAndSwap(nil, &err) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Load().ShutdownGrace+ReleaseTimeoutDefault)
		defer cancel()
		_ = r.Stop(ctx)
	}()
}

// logMissing logs each privilege the role lacks that postbox run uses,
// with its GRANT: run starts all the same (a grant given meanwhile
// takes effect without a restart), and the statements that need it fail
// until then.
func (r *Relay) logMissing(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) {
	missing, err := store.MissingPrivileges(ctx, pool, cfg.Table)
	if err != nil {
		r.log.Warn().Err(err).Msg("could not read the role's privileges")
		return
	}
	for _, m := range missing {
		r.log.Error().Str("lacks", m.What).Str("needed_by", m.Why).Str("fix", m.Grant).Msg("PRIVILEGE MISSING: the role lacks " + m.What + "; " + m.Grant)
	}
}

// shutdown stops the services in reverse order of their start.
func (r *Relay) shutdown(s *services) {
	r.log.Info().Msg("shutting down: stopping the stream")
	s.ingest.Stop()
	s.claimer.Stop()
	grace := r.cfg.Load().ShutdownGrace
	r.log.Info().Int("in_flight", s.disp.InFlight()).Dur("grace", grace).Msg("waiting for in-flight attempts")
	graceCtx, cancelGrace := context.WithTimeout(r.hardCtx, grace)
	s.disp.Stop(graceCtx)
	cancelGrace()
	s.recorder.Stop()
	s.maint.Stop()
	s.endpoints.Stop()
	relCtx, cancelRel := context.WithTimeout(context.Background(), ReleaseTimeoutDefault)
	if n, err := s.env.Store.ReleaseOwned(relCtx, r.owner, s.env.Config().Lane); err != nil {
		r.log.Warn().Err(err).Msg("could not release claimed deliveries; they return to the queue when this instance's lease expires")
	} else {
		if n > 0 {
			r.log.Info().Int64("deliveries", n).Msg("released claimed deliveries to the queue")
		}
		if err := s.env.Store.Deregister(relCtx, r.owner); err != nil {
			r.log.Warn().Err(err).Msg("could not deregister this instance")
		}
	}
	cancelRel()
	if s.ownPool {
		s.pool.Close()
	}
	r.log.Info().Stringer("confirmed_lsn", s.ingest.Durable().Get()).Msg("postbox stopped")
}

// ReleaseTimeoutDefault bounds handing this instance's claims back at stop.
const ReleaseTimeoutDefault = 5 * time.Second

// AdminShutdownDefault bounds the admin listener's shutdown.
const AdminShutdownDefault = 2 * time.Second

func (r *Relay) closeAdmin() {
	if srv := r.admin.Load(); srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), AdminShutdownDefault)
		_ = srv.Shutdown(ctx)
		cancel()
	}
	if srv := r.portalSrv.Load(); srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), AdminShutdownDefault)
		_ = srv.Shutdown(ctx)
		cancel()
	}
	r.serve.Wait()
}

// Stopped is closed when the relay has stopped (or failed to start).
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

// Reload swaps in a new resolved configuration: endpoints, secrets and
// policies apply to the next attempt. Database, slot and table cannot
// change.
func (r *Relay) Reload(cfg *config.Config) error {
	if err := resolved(cfg); err != nil {
		return err
	}
	old := r.cfg.Load()
	if cfg.DatabaseURL != old.DatabaseURL || cfg.Slot != old.Slot || cfg.Publication != old.Publication || cfg.Table != old.Table {
		return errors.New("relay: database_url, slot, publication and outbox_table need a restart")
	}
	if cfg.AdminListen != old.AdminListen {
		// The listener stays where it is bound; a token meant for a new
		// address must not quietly guard the old one, nor the old token
		// stay valid: the whole reload is refused.
		return fmt.Errorf("relay: admin_listen changed from %q to %q, which needs a restart; the reload is refused and the configuration in force is unchanged", old.AdminListen, cfg.AdminListen)
	}
	if err := r.reloadAdminTLS(cfg); err != nil {
		return err
	}
	cfg = r.withTable(cfg)
	r.cfg.Store(cfg)
	r.labelEndpoints(cfg)
	if s := r.svc.Load(); s != nil {
		s.endpoints.Reconfigured()
	}
	return nil
}

// withTable is cfg with the relay's endpoint table: a copy, as the
// caller's configuration is only read (and two relays of one process,
// given one configuration, each keep their own).
func (r *Relay) withTable(cfg *config.Config) *config.Config {
	c := *cfg
	c.EndpointTable = r.table
	return &c
}

// reloadAdminTLS reads the admin listener's certificate files again (a
// rotation rewrites them in place). The listener was made plain or TLS at
// start: a reload that turns TLS on or off is refused, as is a pair that
// does not load, and the certificate in use stays.
func (r *Relay) reloadAdminTLS(cfg *config.Config) error {
	srv := r.admin.Load()
	if srv == nil {
		return nil
	}
	if (cfg.AdminTLSCert != "") != (srv.TLS() != nil) {
		return fmt.Errorf("relay: admin_tls_cert was turned on or off, which needs a restart; the reload is refused and the configuration in force is unchanged")
	}
	if srv.TLS() == nil {
		return nil
	}
	if err := srv.TLS().Reload(cfg.AdminTLSCert, cfg.AdminTLSKey); err != nil {
		return fmt.Errorf("relay: admin_tls_cert: %w; the reload is refused and the configuration and certificate in force are unchanged", err)
	}
	return nil
}

// resolved refuses a configuration that was not made by resolving a file.
func resolved(cfg *config.Config) error {
	if cfg == nil || cfg.Slot == "" || cfg.Table == (outbox.Table{}) || cfg.Endpoints == nil {
		return errors.New("relay: the configuration is not resolved (make it with config.Load, config.Parse or File.Resolve)")
	}
	return nil
}

func (r *Relay) labelEndpoints(cfg *config.Config) {
	names := make([]string, 0, len(cfg.Endpoints))
	for name := range cfg.Endpoints {
		names = append(names, name)
	}
	r.metrics.SetLabeled(names, cfg.MetricsEndpointLabels)
}

// InstanceID is the name this instance holds leases under.
func (r *Relay) InstanceID() string { return r.owner }

// Streaming reports whether this instance is streaming the slot now.
func (r *Relay) Streaming() bool {
	s := r.svc.Load()
	return s != nil && s.ingest.Streaming()
}

// walsenderCPU is the CPU of the walsender streaming this instance's
// session, where it runs on this machine (telemetry.Metrics.SetWalsender).
func (r *Relay) walsenderCPU() (telemetry.WalsenderCPU, bool) {
	s := r.svc.Load()
	if s == nil {
		return telemetry.WalsenderCPU{}, false
	}
	_, c, ok := s.ingest.WalsenderCPU()
	return telemetry.WalsenderCPU{Ran: c.Ran, Waited: c.Waited, Nice: c.Nice}, ok
}

// Metrics are the relay's Prometheus metrics.
func (r *Relay) Metrics() *telemetry.Metrics { return r.metrics }

// AdminAddr is the address the admin listener is bound to ("" when none,
// or before Start has bound it).
func (r *Relay) AdminAddr() string {
	if a := r.admin.Load(); a != nil {
		return a.Addr()
	}
	return ""
}
