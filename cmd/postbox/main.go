// Command postbox delivers webhooks and affiliate postbacks from a
// PostgreSQL outbox table. See `postbox help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	osproc "github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/ops"
)

// Exit codes.
const (
	exitOK        = 0
	exitFailure   = 1 // a runtime failure, a failed check, or an alert firing
	exitUsage     = 2 // bad flags or configuration
	exitInterrupt = 130
)

var usage = `postbox delivers webhooks and affiliate postbacks from a PostgreSQL outbox.

Usage: postbox <command> [flags]

Commands:
  run           stream the outbox and deliver until SIGTERM (--no-migrate: check the
                schema's version, never change it, for a role without DDL rights)
  migrate       create or upgrade the outbox table and postbox's schema
  status        the health summary and firing alerts (--check: exit 1 while any fires)
  endpoints     each endpoint's definition (file or postbox.endpoints: enabled, revision,
                invalid, conflict), then per endpoint: breaker state, pause, p50/p95/p99
                over 24 h, samples, failures (--endpoint)
  endpoints pause NAME [--for D]
                hold an endpoint's deliveries on every instance until resumed (or for D);
                its events wait in the queue, nothing is dropped
  endpoints resume NAME
                end an endpoint's pause (an operator's or the receiver's)
  endpoints add NAME [flags]
                create an endpoint in postbox.endpoints: a flag per key of the file's
                endpoints (--url, --timeout 15s, --header K=V, --event-types, --filter,
                --secret-version, …; 'postbox endpoints add -h'); checked as the relay
                reads it, an invalid one is refused with the reason
  endpoints set NAME [flags]
                change the keys given (--unset KEY: back to its default)
  endpoints disable NAME, endpoints enable NAME
                hold an endpoint's events (like a pause), or release them
  endpoints rm NAME
                delete an endpoint of postbox.endpoints
  endpoints export FILE, endpoints import FILE
                the table's endpoints as YAML (the file's endpoints: keys and the table's
                own), and back: import upserts in one transaction
  endpoints history NAME
                the endpoint's change log: when, who, what (header values as ***)
                (--limit)
  dead-letters  recent dead letters, newest first (--endpoint, --since, --limit: 100
                unless set); "analyze" explains them
  replay        deliver events again, keeping their ids (--dead-letters, --endpoint,
                --since/--until, --from-lsn, --event-id, --limit, --dry-run, --rate);
                --url URL or --endpoint-url sends them elsewhere than their rows' urls
  events        search events, newest commit first: --endpoint, --type, --status (of the
                latest delivery), --since/--until, --payload KEY=VALUE (a search_keys
                field; repeat), --limit (a page, at most 1000), --after CURSOR (the next
                page, as a full page prints)
  event ID      one event's story: commit (LSN, time), ingest, every delivery and
                attempt, replays; --json prints the story, or a list of stories when
                the id went to several endpoints
  report        the daily reconciliation report: per day of --tz (UTC unless set) and
                event type, events committed, delivered, dead-lettered, pending and the
                report_sum sums; --endpoint NAME or --all, --from/--to (days, both
                included; the last 7 unless set), --csv; --deliveries DAY prints that
                day's deliveries of --endpoint as CSV, one line per event
  doctor        check the database for postbox and explain what to fix (exit 1 on errors);
                --app-role NAME: warn of each privilege that role has beyond INSERT on the outbox
                (and the endpoints grants docs/integration.md gives)
  portal link --endpoint NAME [--ttl 30d] [--tz ZONE]
                print a link to that partner's portal (its deliveries, health, report)
  portal revoke --endpoint NAME
                end every portal link and session of that partner at once
  secret new    print a fresh signing secret (whsec_…)
  secret show --endpoint NAME
                print the secret(s) that endpoint's partner verifies with
  demo          run postbox against a throwaway PostgreSQL and local receivers (--keep, -v)
  bench         measure latency, catch-up, load and faults against a throwaway
                PostgreSQL (--scenario; 'postbox bench -h' lists them all)
  version       print the version

--config FILE (or POSTBOX_CONFIG): every command but ` + noConfigCommands + `;
  a command that reads the database takes its URL from the file or from
  POSTBOX_DATABASE_URL.
--json (one JSON document): ` + jsonCommands + `.
status, endpoints, dead-letters, replay, events, event and report read the database
directly, so they work while no relay runs.
Run 'postbox <command> -h' for a command's flags.
`

// noConfigCommands are the commands without --config, and jsonCommands
// those with --json, as the usage names them (TestUsageMatchesFlagSets
// checks them against the commands' flag sets).
const (
	noConfigCommands = "secret new, bench and version"
	jsonCommands     = "status, endpoints (each subcommand too),\n  dead-letters (analyze too), replay, events, event, report, doctor, portal link, portal revoke and bench"
)

func main() {
	// Whatever reaches standard error, a fatal error included, passes the
	// log policy's redaction: never a secret or a URL's user:pass@.
	os.Exit(run(os.Args[1:], os.Stdout, relay.LogWriter(os.Stderr, true)))
}

// command is one subcommand.
type command struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = []command{
	{"run", cmdRun},
	{"migrate", cmdMigrate},
	{"status", cmdStatus},
	{"endpoints", cmdEndpoints},
	{"dead-letters", cmdDeadLetters},
	{"replay", cmdReplay},
	{"events", cmdEvents},
	{"event", cmdEvent},
	{"report", cmdReport},
	{"doctor", cmdDoctor},
	{"portal", cmdPortal},
	{"secret", cmdSecret},
	{"demo", cmdDemo},
	{"bench", cmdBench},
	{"version", cmdVersion},
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(context.Background(), args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "postbox: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// commonFlags are the flags every command takes.
type commonFlags struct {
	config string
}

func newFlagSet(name string, stderr io.Writer, cf *commonFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("postbox "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cf.config, "config", os.Getenv(config.EnvConfig), "configuration file (YAML); env "+config.EnvConfig)
	return fs
}

// loadConfig reads the configuration, printing a config error naming the
// key and returning exitUsage.
func loadConfig(path string, stderr io.Writer) (*config.Config, int) {
	cfg, err := config.Load(path, nil)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return nil, exitUsage
	}
	return cfg, exitOK
}

// newLogger returns the process logger. Every line passes the log field
// policy (package logsafe): payloads, query strings and secrets never
// reach the log unless log_payloads is set (and secrets not even then).
func newLogger(cfg *config.Config, w io.Writer) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(relay.LogWriter(w, cfg.LogPayloads)).Level(lvl).With().Timestamp().Logger()
}

func cmdSecret(_ context.Context, args []string, stdout, stderr io.Writer) int {
	const usage = "usage: postbox secret new | postbox secret show --endpoint NAME [--config FILE]"
	switch {
	case len(args) == 1 && args[0] == "new":
		fmt.Fprintln(stdout, outbox.NewSecret())
		return exitOK
	case len(args) >= 1 && args[0] == "show":
		return secretShow(args[1:], stdout, stderr)
	}
	fmt.Fprintln(stderr, usage)
	return exitUsage
}

// secretShow prints the secrets an endpoint's partner verifies with, one a
// line, the newest first: during a rotation the partner accepts each.
func secretShow(args []string, stdout, stderr io.Writer) int {
	var cf commonFlags
	fs := newFlagSet("secret show", stderr, &cf)
	endpoint := fs.String("endpoint", "", "the endpoint whose partner needs its secret(s)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *endpoint == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: postbox secret show --endpoint NAME [--config FILE]")
		return exitUsage
	}
	cfg, code := loadConfig(cf.config, stderr)
	if cfg == nil {
		return code
	}
	ep := cfg.Endpoint(*endpoint)
	te, inTable := tableEndpoint(cfg, *endpoint, stderr)
	if inTable {
		ep = ops.Resolve(cfg, te)
		if ep.Invalid != "" {
			fmt.Fprintf(stderr, "postbox: endpoint %s of postbox.endpoints is invalid (%s): nothing is signed for it until it is corrected\n",
				printable(*endpoint), printable(ep.Invalid))
			return exitFailure
		}
	}
	if !ep.Configured {
		// Still printed: rows naming an endpoint that is not configured
		// (with their own url) are signed with it. A misspelt name is
		// caught here.
		fmt.Fprintf(stderr, "warning: no endpoint %s is configured: these are the secrets rows naming it are signed with; check the name\n", printable(*endpoint))
	}
	secrets := cfg.SigningSecrets(ep)
	if len(secrets) == 0 {
		fmt.Fprintln(stderr, "postbox: no signing secrets are configured: deliveries are not signed (set signing.secrets)")
		return exitFailure
	}
	switch {
	case inTable && te.Secret != "":
		fmt.Fprintf(stderr, "endpoint %s of postbox.endpoints signs with the secrets signing.named declares as %s\n", printable(*endpoint), printable(te.Secret))
	case inTable:
		fmt.Fprintf(stderr, "endpoint %s of postbox.endpoints signs with its secret derived for version %d", printable(*endpoint), ep.SecretVersion)
		if len(secrets) > len(cfg.Secrets) {
			fmt.Fprintf(stderr, ", and version %d's (the previous, listed after it) until %s: the partner may verify with either",
				ep.SecretVersion-1, ep.PreviousSecretUntil.UTC().Format(time.RFC3339))
		}
		fmt.Fprintln(stderr)
	case ep.OwnSecrets:
		fmt.Fprintf(stderr, "endpoint %s has secrets of its own\n", printable(*endpoint))
	case cfg.Derived:
		fmt.Fprintf(stderr, "endpoint %s signs with secrets derived for it alone (signing.per_endpoint: derived)\n", printable(*endpoint))
	default:
		fmt.Fprintf(stderr, "warning: endpoint %s signs with the shared secrets, which every partner without its own holds: "+
			"each of them could forge deliveries to the others. Set signing.per_endpoint: derived.\n", printable(*endpoint))
	}
	for _, s := range secrets {
		fmt.Fprintln(stdout, s.Reveal())
	}
	return exitOK
}

// tableEndpoint reads name's row of postbox.endpoints when the file does
// not define name (the file's wins) and the database is reachable; a
// failure to read is said, and the file's view is kept.
func tableEndpoint(cfg *config.Config, name string, stderr io.Writer) (config.TableEndpoint, bool) {
	if _, inFile := cfg.Endpoints[name]; inFile || cfg.DatabaseURL == "" {
		return config.TableEndpoint{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := relay.Connect(ctx, cfg.DatabaseURL, 1)
	var tes []config.TableEndpoint
	if err == nil {
		defer pool.Close()
		tes, err = ops.TableEndpoints(ctx, pool, name)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warning: could not read postbox.endpoints (%v): an endpoint defined there is not shown as such\n", err)
		return config.TableEndpoint{}, false
	}
	if len(tes) == 0 {
		return config.TableEndpoint{}, false
	}
	return tes[0], true
}

func cmdVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintln(stdout, "postbox", relay.Version)
	return exitOK
}

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf commonFlags
	fs := newFlagSet("migrate", stderr, &cf)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	cfg, code := loadConfig(cf.config, stderr)
	if cfg == nil {
		return code
	}
	if cfg.DatabaseURL == "" {
		fmt.Fprintln(stderr, "postbox: config: database_url: not set (set it in the file or "+config.EnvDatabaseURL+")")
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	pool, err := relay.Connect(ctx, cfg.DatabaseURL, 2)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	defer pool.Close()
	v, err := relay.Migrate(ctx, pool, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	fmt.Fprintf(stdout, "schema postbox at version %d; outbox table %s and publication %s ready\n", v, cfg.Table, cfg.Publication)
	return exitOK
}

func cmdRun(ctx context.Context, args []string, _ io.Writer, stderr io.Writer) int {
	var cf commonFlags
	fs := newFlagSet("run", stderr, &cf)
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file (for performance work)")
	memProfile := fs.String("memprofile", "", "write an allocation profile to this file on exit (for performance work)")
	noMigrate := fs.Bool("no-migrate", false, "never change the schema: check it is at this version and exit if not (migrate: false); for a role without DDL rights")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
			if err != nil {
				fmt.Fprintln(stderr, "postbox: memprofile:", err)
			}
		}()
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitUsage
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitUsage
		}
		defer pprof.StopCPUProfile()
	}
	cfg, code := loadConfig(cf.config, stderr)
	if cfg == nil {
		return code
	}
	if *noMigrate {
		cfg.Migrate = false
	}
	log := newLogger(cfg, stderr)
	for _, f := range cfg.ExposedFiles(cf.config) {
		log.Warn().Str("file", f.Path).Str("mode", fmt.Sprintf("%04o", f.Mode)).
			Msg("a file holding secrets is readable by group or others: chmod 600 " + f.Path)
	}
	schedule(cfg.CPUBatch, log)
	heap := startHeapFloor(HeapFloorDefault)
	defer heap.Stop()
	r, err := relay.New(cfg, relay.Options{Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		var ce *config.Error
		if errors.As(err, &ce) {
			return exitUsage
		}
		return exitFailure
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	// Start waits for an unreachable database; a signal meanwhile ends it.
	startCtx, stopStart := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	err = r.Start(startCtx)
	stopStart()
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	for {
		select {
		case <-r.Stopped():
			if err := r.Err(); err != nil {
				fmt.Fprintln(stderr, "postbox:", err)
				return exitFailure
			}
			return exitOK
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				reload(r, cf.config, log)
				continue
			}
			log.Info().Str("signal", sig.String()).Msg("stopping; a second signal exits at once")
			go func() {
				for s := range sigs {
					if s == syscall.SIGHUP {
						continue
					}
					log.Warn().Str("signal", s.String()).Msg("second signal: exiting now; leases return unfinished deliveries to the queue")
					os.Exit(exitInterrupt)
				}
			}()
			stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace+15*time.Second)
			err := r.Stop(stopCtx)
			cancel()
			if err != nil {
				fmt.Fprintln(stderr, "postbox:", err)
				return exitFailure
			}
			return exitOK
		}
	}
}

// reload re-reads the configuration on SIGHUP.
func reload(r *relay.Relay, path string, log zerolog.Logger) {
	cfg, err := config.Load(path, nil)
	if err == nil {
		err = r.Reload(cfg)
	}
	if err != nil {
		log.Error().Err(err).Msg("configuration not reloaded")
		return
	}
	schedule(cfg.CPUBatch, log)
	log.Info().Msg("configuration reloaded")
}

// schedule applies cpu_scheduling to this process's threads. Batch
// threads, woken when a row arrives, wait for a free CPU instead of
// preempting what runs there, most often the walsender that sent the row:
// on saturated CPUs that keeps the stream on time (docs/operations.md,
// "postbox's threads as batch"). Where it cannot be had, the threads keep
// what they had.
func schedule(batch bool, log zerolog.Logger) {
	err := osproc.SetBatch(batch)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		log.Debug().Msg("cpu_scheduling needs Linux; the threads keep the system's default")
	case err != nil:
		log.Warn().Err(err).Bool("batch", batch).Msg("could not apply cpu_scheduling; the threads keep what they had")
	}
}
