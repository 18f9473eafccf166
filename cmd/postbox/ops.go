package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/doctor"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// The operator commands connect to the database directly, so they answer
// when no relay runs.

// opsEnv is what an operator command needs: configuration and a pool.
type opsEnv struct {
	cfg  *config.Config
	pool *pgxpool.Pool
	json bool
	out  io.Writer
	args []string // the arguments that are not flags, in order
}

// openOps parses the common flags (and fs's own), loads the configuration
// and connects. On failure it returns the exit code to use.
func openOps(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (*opsEnv, func(), int) {
	var cf commonFlags
	fs.SetOutput(stderr)
	fs.StringVar(&cf.config, "config", "", "configuration file (YAML); env "+config.EnvConfig)
	jsonOut := fs.Bool("json", false, "print one JSON document")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, nil, exitUsage
	}
	if cf.config == "" {
		cf.config = os.Getenv(config.EnvConfig)
	}
	cfg, code := loadConfig(cf.config, stderr)
	if cfg == nil {
		return nil, nil, code
	}
	if cfg.DatabaseURL == "" {
		fmt.Fprintln(stderr, "postbox: config: database_url: not set (set it in the file or "+config.EnvDatabaseURL+")")
		return nil, nil, exitUsage
	}
	pool, err := relay.Connect(ctx, cfg.DatabaseURL, 4)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "postbox: database unreachable:", err)
		return nil, nil, exitFailure
	}
	return &opsEnv{cfg: cfg, pool: pool, json: *jsonOut, out: stdout, args: positional}, pool.Close, exitOK
}

// parseInterspersed parses args with fs, flags before and after the other
// arguments (postbox event ID --json), and returns those others. After
// "--" every argument is one of them.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

func (e *opsEnv) printJSON(v any) {
	enc := json.NewEncoder(e.out)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox status", flag.ContinueOnError)
	check := fs.Bool("check", false, "exit 1 while any alert fires (for cron and health checks)")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	s, err := telemetry.LoadSummary(ctx, env.pool, env.cfg.Slot)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	// The alerts as the relays evaluate them: from the percentiles of the
	// last refresh, not every sample of the day sorted again.
	eps, err := telemetry.LoadStoredEndpoints(ctx, env.pool)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if s.InvalidEndpoints, err = telemetry.LoadInvalidEndpoints(ctx, env.pool, env.cfg); err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	s.Alerts = telemetry.Firing(telemetry.Evaluate(s, eps, env.cfg.Alerts))
	if env.json {
		env.printJSON(s)
	} else {
		printStatus(stdout, s)
	}
	if *check && len(s.Alerts) > 0 {
		return exitFailure
	}
	return exitOK
}

func printStatus(w io.Writer, s telemetry.Summary) {
	fmt.Fprintf(w, "postbox status at %s\n\n", s.At.UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "queue\tpending %d\tawaiting_retry %d\tin_flight %d\tdead_letter %d\n", s.Pending, s.AwaitingRetry, s.InFlight, s.DeadLetter)
	fmt.Fprintf(tw, "last hour\tdelivered %d\tfailed %d\tdead letters %d\tavg response %s\n", s.DeliveredLastHour, s.FailedLastHour, s.DeadLettersLastHour, ms(s.AvgDeliveryMSLastHour))
	fmt.Fprintf(tw, "commit→delivery\tp50 %s\tp99 %s\t(last hour)\n", ms(s.CommitToDeliveryP50MS), ms(s.CommitToDeliveryP99MS))
	oldest := "none"
	if s.OldestPending != nil {
		oldest = fmt.Sprintf("%s (%s ago)", s.OldestPending.UTC().Format(time.RFC3339), time.Duration(*s.OldestPendingAgeSeconds*float64(time.Second)).Round(time.Second))
	}
	fmt.Fprintf(tw, "oldest_pending\t%s\n", oldest)
	if s.Slot.Exists {
		active := "inactive"
		if s.Slot.Active {
			active = "active"
		}
		fmt.Fprintf(tw, "slot %s\t%s\twal_status %s\tlag %s\n", s.Slot.Name, active, s.Slot.WALStatus, telemetry.FormatBytes(s.Slot.RetainedBytes))
	} else {
		fmt.Fprintf(tw, "slot %s\tdoes not exist (no relay has run)\n", s.Slot.Name)
	}
	var inst []string
	for _, in := range s.Instances {
		d := in.Hostname + " pid " + fmt.Sprint(in.PID)
		if in.Streaming {
			d += " (streaming)"
		}
		if in.Fault != "" {
			d += " FAULT: " + in.Fault
		}
		inst = append(inst, d)
	}
	if len(inst) == 0 {
		inst = []string{"none running"}
	}
	fmt.Fprintf(tw, "instances\t%s\n", strings.Join(inst, ", "))
	writable := "writable"
	if s.Database.ReadOnly {
		writable = "READ-ONLY"
	}
	fmt.Fprintf(tw, "database\t%s\tconnections %d of %d\n", writable, s.Database.Connections, s.Database.MaxConnections)
	_ = tw.Flush()
	if len(s.Breakers) > 0 {
		fmt.Fprintln(w, "\nheld back:")
		for _, b := range s.Breakers {
			switch {
			case b.PausedUntil != nil && !b.PausedUntil.Before(postboxtype.PauseIndefinite):
				fmt.Fprintf(w, "  %s  paused until resumed (postbox endpoints resume %s)\n", printable(b.Endpoint), shellQuote(b.Endpoint))
			case b.PausedUntil != nil:
				fmt.Fprintf(w, "  %s  paused until %s\n", printable(b.Endpoint), b.PausedUntil.UTC().Format(time.RFC3339))
			case b.State == postboxtype.BreakerOpen:
				fmt.Fprintf(w, "  %s  breaker open since %s, probes at %s; %d consecutive failures, last: %s\n", printable(b.Endpoint),
					b.OpenedAt.UTC().Format(time.RFC3339), b.ReopensAt.UTC().Format(time.RFC3339), b.ConsecutiveFailures, printable(b.LastError))
			default:
				fmt.Fprintf(w, "  %s  breaker %s\n", printable(b.Endpoint), b.State)
			}
		}
	}
	fmt.Fprintln(w)
	if len(s.Alerts) == 0 {
		fmt.Fprintln(w, "no alerts")
		return
	}
	fmt.Fprintln(w, "ALERTS:")
	for _, a := range s.Alerts {
		fmt.Fprintf(w, "  %-20s %s\n", a.Name, a.Detail)
	}
}

func cmdEndpoints(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "pause":
			return cmdPause(ctx, args[1:], stdout, stderr)
		case "resume":
			return cmdResume(ctx, args[1:], stdout, stderr)
		case "add", "set":
			return cmdEndpointWrite(ctx, args[0], args[1:], stdout, stderr)
		case "disable", "enable":
			return cmdEndpointEnable(ctx, args[0], args[1:], stdout, stderr)
		case "rm":
			return cmdEndpointRm(ctx, args[1:], stdout, stderr)
		case "export":
			return cmdEndpointExport(ctx, args[1:], stdout, stderr)
		case "import":
			return cmdEndpointImport(ctx, args[1:], stdout, stderr)
		case "history":
			return cmdEndpointHistory(ctx, args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("postbox endpoints", flag.ContinueOnError)
	only := fs.String("endpoint", "", "only this endpoint")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	if len(env.args) > 0 {
		fmt.Fprintf(stderr, "postbox: endpoints: unexpected %q (the subcommands are %s)\n", printable(env.args[0]), endpointsSubcommands)
		return exitUsage
	}
	eps, err := telemetry.LoadEndpoints(ctx, env.pool, *only)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	defs, err := definitions(ctx, env, *only)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		if eps == nil {
			eps = []telemetry.EndpointStats{}
		}
		if defs == nil {
			defs = []definition{}
		}
		env.printJSON(map[string]any{"window": telemetry.Window.String(), "endpoints": eps, "definitions": defs})
		return exitOK
	}
	// How each endpoint is defined first, then how each has fared.
	printDefinitions(stdout, defs)
	fmt.Fprintln(stdout)
	if len(eps) == 0 {
		fmt.Fprintln(stdout, "no endpoints have had deliveries yet")
		return exitOK
	}
	fmt.Fprintf(stdout, "latency of attempts over the last %s\n\n", telemetry.Window)
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tSTATE\tP50\tP95\tP99\tSAMPLES\tFAIL STREAK\tPENDING\tRETRY\tDEAD\tLAST ERROR")
	for _, e := range eps {
		st := string(e.State)
		if e.PausedUntil != nil {
			st = "paused " + pausedUntil(*e.PausedUntil)
			if e.State != postboxtype.BreakerClosed {
				st = string(e.State) + ", " + st
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", printable(e.Endpoint), st, ms(e.P50MS), ms(e.P95MS), ms(e.P99MS),
			e.SampleCount, e.ConsecutiveFailures, e.Pending, e.AwaitingRetry, e.DeadLetter, printable(e.LastError))
	}
	_ = tw.Flush()
	return exitOK
}

// pausedUntil says until when a pause lasts.
func pausedUntil(t time.Time) string {
	if !t.Before(postboxtype.PauseIndefinite) {
		return "until resumed"
	}
	return "until " + t.UTC().Format(time.RFC3339)
}

// knownEndpoint reports whether name is configured, or has deliveries or
// health of its own (rows that carry their own url name endpoints the
// configuration does not list).
func knownEndpoint(ctx context.Context, env *opsEnv, name string) (telemetry.EndpointStats, bool, error) {
	eps, err := telemetry.LoadEndpointsRefreshed(ctx, env.pool, name)
	if err != nil {
		return telemetry.EndpointStats{}, false, err
	}
	for _, e := range eps {
		if e.Endpoint == name {
			return e, true, nil
		}
	}
	_, configured := env.cfg.Endpoints[name]
	return telemetry.EndpointStats{Endpoint: name}, configured, nil
}

// endpointArg returns the one endpoint name a pause or resume takes.
func endpointArg(env *opsEnv, verb string, stderr io.Writer) (string, bool) {
	if len(env.args) != 1 || env.args[0] == "" {
		fmt.Fprintf(stderr, "usage: postbox endpoints %s NAME\n", verb)
		return "", false
	}
	return env.args[0], true
}

func cmdPause(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints pause", flag.ContinueOnError)
	forText := fs.String("for", "", "pause for this long (90m, 2h, 7d); without it, until resumed")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	name, ok := endpointArg(env, "pause", stderr)
	if !ok {
		return exitUsage
	}
	var until time.Time
	if *forText != "" {
		d, err := parseDuration(*forText)
		if err != nil || d <= 0 {
			fmt.Fprintln(stderr, "postbox: --for: want a positive duration such as 90m, 2h or 7d")
			return exitUsage
		}
		until = time.Now().Add(d)
	}
	_, known, err := knownEndpoint(ctx, env, name)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if !known {
		fmt.Fprintf(stderr, "postbox: no endpoint %s is configured or has had deliveries\n", shellQuote(name))
		return exitUsage
	}
	if err := ops.Pause(ctx, env.pool, name, until); err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if until.IsZero() {
		until = postboxtype.PauseIndefinite
	}
	if env.json {
		env.printJSON(map[string]any{"endpoint": name, "paused_until": until.UTC()})
		return exitOK
	}
	fmt.Fprintf(stdout, "paused %s %s on every instance: its events wait in the queue, nothing is dropped\n", printable(name), pausedUntil(until))
	fmt.Fprintf(stdout, "resume with: postbox endpoints resume %s\n", shellQuote(name))
	return exitOK
}

func cmdResume(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints resume", flag.ContinueOnError)
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	name, ok := endpointArg(env, "resume", stderr)
	if !ok {
		return exitUsage
	}
	e, known, err := knownEndpoint(ctx, env, name)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if !known {
		fmt.Fprintf(stderr, "postbox: no endpoint %s is configured or has had deliveries\n", shellQuote(name))
		return exitUsage
	}
	if err := ops.Resume(ctx, env.pool, name); err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		env.printJSON(map[string]any{"endpoint": name, "was_paused": e.PausedUntil != nil, "queued": e.Pending + e.AwaitingRetry})
		return exitOK
	}
	if e.PausedUntil == nil {
		fmt.Fprintf(stdout, "%s was not paused\n", printable(name))
		return exitOK
	}
	switch n := e.Pending + e.AwaitingRetry; n {
	case 1:
		fmt.Fprintf(stdout, "resumed %s: its 1 queued delivery goes out now\n", printable(name))
	default:
		fmt.Fprintf(stdout, "resumed %s: its %d queued deliveries go out now\n", printable(name), n)
	}
	return exitOK
}

// printable and shellQuote are telemetry's: the console, the dead-letter
// advice and the commands quote alike.
func printable(s string) string  { return telemetry.Printable(s) }
func shellQuote(s string) string { return telemetry.ShellQuote(s) }

// deadLetterLimitDefault is how many dead letters postbox dead-letters
// lists unless --limit says otherwise.
const deadLetterLimitDefault = 100

func cmdDeadLetters(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	analyze := len(args) > 0 && args[0] == "analyze"
	if analyze {
		args = args[1:]
	}
	fs := flag.NewFlagSet("postbox dead-letters", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "only this endpoint")
	sinceText := fs.String("since", "24h", "how far back: a duration (24h, 7d) or a time (RFC 3339)")
	limit := fs.Int("limit", deadLetterLimitDefault, "list at most this many, the newest (analyze counts them all)")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	for _, a := range env.args {
		if a != "analyze" {
			fmt.Fprintf(stderr, "postbox: dead-letters: unexpected %q (the one subcommand is analyze)\n", printable(a))
			return exitUsage
		}
		analyze = true
	}
	since, err := parseSince(*sinceText, time.Now())
	if err != nil {
		fmt.Fprintln(stderr, "postbox: --since:", err)
		return exitUsage
	}
	if analyze {
		an, err := telemetry.AnalyzeDeadLetters(ctx, env.pool, *endpoint, since)
		if err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitFailure
		}
		if env.json {
			if an == nil {
				an = []telemetry.Analysis{}
			}
			env.printJSON(map[string]any{"since": since.UTC(), "endpoints": an})
			return exitOK
		}
		if len(an) == 0 {
			fmt.Fprintf(stdout, "no dead letters since %s\n", since.UTC().Format(time.RFC3339))
			return exitOK
		}
		printAnalysis(stdout, an)
		return exitOK
	}
	dls, err := telemetry.ListDeadLetters(ctx, env.pool, *endpoint, since, *limit)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		if dls == nil {
			dls = []postboxtype.DeadLetter{}
		}
		env.printJSON(map[string]any{"since": since.UTC(), "dead_letters": dls})
		return exitOK
	}
	if len(dls) == 0 {
		fmt.Fprintf(stdout, "no dead letters since %s\n", since.UTC().Format(time.RFC3339))
		return exitOK
	}
	if len(dls) == *limit {
		// Said, so that a list cut at the limit never reads as all of them.
		fmt.Fprintf(stderr, "the newest %d dead letters since %s; there may be more (--limit, or dead-letters analyze for the counts)\n",
			*limit, since.UTC().Format(time.RFC3339))
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEAD AT\tENDPOINT\tEVENT ID\tATTEMPTS\tSTATUS\tLAST ERROR")
	for _, d := range dls {
		code := "-"
		if d.LastStatusCode != nil {
			code = fmt.Sprint(*d.LastStatusCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", d.DeadAt.UTC().Format(time.RFC3339), d.Endpoint, d.EventID, d.AttemptCount, code, d.LastError)
	}
	_ = tw.Flush()
	return exitOK
}

// eventIDs collects repeated --event-id flags (commas allowed).
type eventIDs []string

func (e *eventIDs) String() string { return strings.Join(*e, ",") }
func (e *eventIDs) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*e = append(*e, id)
		}
	}
	return nil
}

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox replay", flag.ContinueOnError)
	var f postboxtype.ReplayFilter
	var ids eventIDs
	fs.BoolVar(&f.DeadLetters, "dead-letters", false, "only events whose latest delivery is a dead letter")
	fs.StringVar(&f.Endpoint, "endpoint", "", "only this endpoint's events")
	sinceText := fs.String("since", "", "events committed since: a duration (2h) or a time (RFC 3339)")
	untilText := fs.String("until", "", "events committed before: a duration ago or a time")
	fromLSN := fs.String("from-lsn", "", "events committed at or after this WAL position (e.g. 0/16B3748)")
	fs.Var(&ids, "event-id", "this event (repeat, or separate with commas)")
	fs.IntVar(&f.Limit, "limit", 0, "enqueue at most this many events")
	dryRun := fs.Bool("dry-run", false, "print what would be enqueued and change nothing")
	rate := fs.Float64("rate", 0, "spread the replay out at this many events a second (0: all at once)")
	fs.StringVar(&f.URL, "url", "", "send the replayed deliveries to this url (a template with macros allowed) instead of their rows' urls; needs --endpoint or --event-id")
	fs.BoolVar(&f.EndpointURL, "endpoint-url", false, "send the replayed deliveries to their endpoint's current url, leaving their rows' urls out")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	var ok bool
	if f.Since, f.Until, ok = parseWindow(*sinceText, *untilText, stderr); !ok {
		return exitUsage
	}
	if *fromLSN != "" {
		lsn, err := pglogrepl.ParseLSN(*fromLSN)
		if err != nil {
			fmt.Fprintln(stderr, "postbox: --from-lsn: want a WAL position such as 0/16B3748")
			return exitUsage
		}
		f.FromLSN = uint64(lsn)
	}
	f.EventIDs = ids
	if !f.DeadLetters && f.Endpoint == "" && f.Since.IsZero() && f.Until.IsZero() && f.FromLSN == 0 && len(ids) == 0 {
		fmt.Fprintln(stderr, "postbox: replay needs a selection: --dead-letters, --endpoint, --since/--until, --from-lsn or --event-id")
		return exitUsage
	}
	if *rate < 0 {
		fmt.Fprintln(stderr, "postbox: --rate must not be negative")
		return exitUsage
	}
	switch {
	case f.URL != "" && f.EndpointURL:
		fmt.Fprintln(stderr, "postbox: --url and --endpoint-url: choose one")
		return exitUsage
	case f.URL != "" && f.Endpoint == "" && len(ids) == 0:
		fmt.Fprintln(stderr, "postbox: --url needs --endpoint or --event-id: one url for every endpoint's events is never meant")
		return exitUsage
	}
	if err := ops.CheckRetarget(f); err != nil {
		fmt.Fprintln(stderr, "postbox: --url:", strings.TrimPrefix(err.Error(), "replay: url: "))
		return exitUsage
	}
	items, enqueued, err := ops.Replay(ctx, env.pool, env.cfg, f, *dryRun, *rate)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	queued, messagesOff := 0, 0
	for _, it := range items {
		if it.Queued {
			queued++
		}
		if it.MessagesOff {
			messagesOff++
		}
	}
	if messagesOff > 0 {
		fmt.Fprintf(stderr, "postbox: left out %s written with outbox.Emit: outbox_messages is off in this configuration (set outbox_messages: true, then replay them)\n",
			plural(int64(messagesOff), "event"))
	}
	if env.json {
		if items == nil {
			items = []postboxtype.ReplayItem{}
		}
		env.printJSON(map[string]any{"dry_run": *dryRun, "selected": len(items), "already_queued": queued,
			"enqueued": enqueued, "events": items})
		return exitOK
	}
	if *dryRun {
		fmt.Fprintf(stdout, "dry run: would enqueue %d of %s (%d already queued); nothing changed\n", len(items)-queued-messagesOff, plural(int64(len(items)), "selected event"), queued)
		printRetarget(stdout, f)
		fmt.Fprintln(stdout)
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT ID\tENDPOINT\tTYPE\tCOMMITTED\tLSN\tLAST STATUS")
		for i, it := range items {
			if i == 50 {
				fmt.Fprintf(tw, "… and %d more\n", len(items)-50)
				break
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", it.EventID, it.Endpoint, it.EventType, it.Committed.UTC().Format(time.RFC3339), it.CommitLSN, it.LastStatus)
		}
		_ = tw.Flush()
		return exitOK
	}
	fmt.Fprintf(stdout, "enqueued %s for delivery keeping each event id (%d selected, %d already queued)\n", plural(int64(enqueued), "event"), len(items), queued)
	if enqueued > 0 {
		printRetarget(stdout, f)
	}
	if *rate > 0 && enqueued > 0 {
		fmt.Fprintf(stdout, "spread out at %g a second: the last falls due in %s\n", *rate, (time.Duration(float64(enqueued-1) / *rate * float64(time.Second))).Round(time.Second))
	}
	return exitOK
}

// printRetarget says where a replay's deliveries go when not to their
// rows' urls.
func printRetarget(w io.Writer, f postboxtype.ReplayFilter) {
	switch {
	case f.URL != "":
		fmt.Fprintln(w, "sent to the url given, not their rows' urls (each delivery keeps it; the events keep theirs)")
	case f.EndpointURL:
		fmt.Fprintln(w, "sent to their endpoint's url as it is at each attempt, not their rows' urls")
	}
}

// parseSince reads "24h", "7d", "90m" (ago) or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := parseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errors.New("want a duration such as 24h or 7d, or an RFC 3339 time")
}

// parseDuration reads a Go duration (90m, 2h) or a number of days (7d).
func parseDuration(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		if _, err := fmt.Sscanf(d, "%d", &n); err == nil && n >= 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	return time.ParseDuration(s)
}

func ms(v *float64) string {
	if v == nil {
		return "-"
	}
	if *v < 1 {
		return fmt.Sprintf("%.2f ms", *v)
	}
	if *v < 10 {
		return fmt.Sprintf("%.1f ms", *v)
	}
	return fmt.Sprintf("%.0f ms", *v)
}

func cmdDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox doctor", flag.ContinueOnError)
	appRole := fs.String("app-role", "", "also warn of each privilege this role (the application's) has beyond INSERT on the outbox")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	checks, err := doctor.Run(ctx, env.pool, env.cfg, time.Now)
	if err == nil && *appRole != "" {
		var app []doctor.Check
		app, err = doctor.AppRole(ctx, env.pool, env.cfg, *appRole)
		checks = append(checks, app...)
	}
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		env.printJSON(map[string]any{"ok": !doctor.Failed(checks), "checks": checks})
	} else {
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		for _, c := range checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(string(c.Severity)), c.Name, c.Detail)
			if c.Fix != "" {
				fmt.Fprintf(tw, "\t\t→ %s\n", c.Fix)
			}
		}
		_ = tw.Flush()
	}
	if doctor.Failed(checks) {
		return exitFailure
	}
	return exitOK
}

func printAnalysis(w io.Writer, an []telemetry.Analysis) {
	for _, a := range an {
		code := "-"
		if a.PrimaryStatusCode != nil {
			code = fmt.Sprint(*a.PrimaryStatusCode)
		}
		fmt.Fprintf(w, "%s: %s, %s to %s, %.1f attempts on average\n", a.Endpoint, plural(a.DeadCount, "dead letter"),
			a.FirstDead.UTC().Format(time.RFC3339), a.LastDead.UTC().Format(time.RFC3339), a.AvgAttempts)
		fmt.Fprintf(w, "  most common: %s (status %s); at most %d in one hour\n", a.PrimaryError, code, a.MaxInOneHour)
		fmt.Fprintf(w, "  pattern: %s\n  advice:  %s\n\n", a.Pattern, a.Advice)
	}
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// parseWindow parses --since and --until (a duration ago, or a time; either
// may be empty), printing a usage error naming the flag when one does not
// parse.
func parseWindow(sinceText, untilText string, stderr io.Writer) (since, until time.Time, ok bool) {
	now := time.Now()
	for _, w := range []struct {
		flag, text string
		dst        *time.Time
	}{{"--since", sinceText, &since}, {"--until", untilText, &until}} {
		if w.text == "" {
			continue
		}
		t, err := parseSince(w.text, now)
		if err != nil {
			fmt.Fprintln(stderr, "postbox: "+w.flag+":", err)
			return since, until, false
		}
		*w.dst = t
	}
	return since, until, true
}
