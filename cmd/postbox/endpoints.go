package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/ops"
)

// The endpoints of postbox.endpoints, written and read with SQL by the
// commands below; the relay applies each change from the stream.

// endpointFlags are the flags of endpoints add and set: one per key of
// the configuration's endpoints, named as the key (--header for each of
// headers, --success-status and --success-body-contains for success's).
type endpointFlags struct {
	fs      *flag.FlagSet
	headers keyValues
	unset   listFlag
}

// keyValues collects repeated K=V flags.
type keyValues []string

func (k *keyValues) String() string { return strings.Join(*k, ",") }
func (k *keyValues) Set(v string) error {
	if name, _, ok := strings.Cut(v, "="); !ok || strings.TrimSpace(name) == "" {
		return errors.New("want NAME=VALUE")
	}
	*k = append(*k, v)
	return nil
}

// listFlag collects repeated values (commas allowed).
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// endpointTextFlags are the flags whose value is the column's as given.
var endpointTextFlags = []struct{ flag, col, usage string }{
	{"url", "url", "the target, or a template with macros ({payload.click_id})"},
	{"method", "method", "GET, POST, PUT or PATCH"},
	{"body", "body", "a body template for POST, PUT and PATCH"},
	{"rate-limit", "rate_limit", "deliveries per second, minute or hour (100/m)"},
	{"secret", "secret", "sign with the secret the configuration declares under this name (signing.named)"},
}

var endpointDurationFlags = []struct{ flag, col, usage string }{
	{"timeout", "timeout", "one attempt's timeout (15s)"},
	{"backoff-base", "backoff_base", "the first retry's delay bound (30s)"},
	{"backoff-cap", "backoff_cap", "the largest retry delay (1h)"},
	{"cooldown", "cooldown", "how long an open breaker waits before a probe (5m)"},
	{"max-cooldown", "max_cooldown", "the longest cooldown (1h)"},
}

var endpointIntFlags = []struct{ flag, col, usage string }{
	{"max-attempts", "max_attempts", "attempts before a dead letter"},
	{"failure-threshold", "failure_threshold", "consecutive failures that open the breaker"},
	{"max-in-flight", "max_in_flight", "attempts in flight at once, per instance"},
	{"secret-version", "secret_version", "the derived secret's version: raise it to rotate the partner's secret"},
}

func newEndpointFlags(name string) *endpointFlags {
	ef := &endpointFlags{fs: flag.NewFlagSet("postbox endpoints "+name, flag.ContinueOnError)}
	fs := ef.fs
	for _, f := range endpointTextFlags {
		fs.String(f.flag, "", f.usage)
	}
	for _, f := range endpointDurationFlags {
		fs.String(f.flag, "", f.usage)
	}
	for _, f := range endpointIntFlags {
		fs.String(f.flag, "", f.usage)
	}
	fs.Var(&ef.headers, "header", "a header sent with every attempt, NAME=VALUE (repeat; the headers given replace the row's)")
	fs.String("success-status", "", "the statuses that count as delivered (200,204)")
	fs.String("success-body-contains", "", "text the response body must contain to count as delivered")
	fs.String("retry-on", "", "statuses retried beside postbox's (409,423)")
	fs.Bool("ordered", false, "deliver in commit order, one at a time (--ordered=false to turn off)")
	fs.String("redact-path", "", "URL path segments recorded as ***: true, false, or positions (4 or 1,3)")
	fs.Bool("allow-row-url", false, "let rows send to their own url (--allow-row-url=false to turn off)")
	fs.String("row-url-hosts", "", "the only hosts a row's url may name (pb.example.com,*.example.org)")
	fs.String("event-types", "", "the event types subscribed to (conversion,invoice.*)")
	fs.String("filter", "", `a JSON object the payload must contain ({"brand": "casino-de"})`)
	fs.String("previous-secret-until", "", "the previous secret version signs too until this time (RFC 3339, or a duration from now: 7d)")
	fs.Var(&ef.unset, "unset", "set this key back to its default (repeat, or separate with commas)")
	what := "create an endpoint of postbox.endpoints; the keys not given inherit the file's defaults (never its headers or secrets)"
	if name == "set" {
		what = "change the keys given of an endpoint of postbox.endpoints, and only those"
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: postbox endpoints %s NAME [flags]\n\n%s; the row is checked as the relay reads it,\nand refused with the reason when invalid. Flags are named as the configuration's keys.\n\n", name, what)
		fs.PrintDefaults()
	}
	return ef
}

// values reads the flags given into the columns they set.
func (ef *endpointFlags) values(now time.Time) (map[string]ops.Value, error) {
	set := map[string]ops.Value{}
	given := map[string]string{}
	ef.fs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })
	text := func(col, v string) { set[col] = ops.Value{Text: v} }
	for _, f := range endpointTextFlags {
		if v, ok := given[f.flag]; ok {
			text(f.col, v)
		}
	}
	for _, f := range endpointDurationFlags {
		if v, ok := given[f.flag]; ok {
			d, err := config.ParseDuration(v)
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", f.flag, err)
			}
			text(f.col, ops.IntervalText(d))
		}
	}
	for _, f := range endpointIntFlags {
		if v, ok := given[f.flag]; ok {
			if _, err := strconv.Atoi(v); err != nil {
				return nil, fmt.Errorf("--%s: want a whole number, got %q", f.flag, v)
			}
			text(f.col, v)
		}
	}
	if _, ok := given["header"]; ok {
		h := map[string]string{}
		for _, kv := range ef.headers {
			k, v, _ := strings.Cut(kv, "=")
			h[strings.TrimSpace(k)] = v
		}
		b, _ := json.Marshal(h)
		text("headers", string(b))
	}
	success := map[string]any{}
	if v, ok := given["success-status"]; ok {
		codes, err := ints(v)
		if err != nil {
			return nil, fmt.Errorf("--success-status: %w", err)
		}
		success["status"] = codes
	}
	if v, ok := given["success-body-contains"]; ok {
		success["body_contains"] = v
	}
	if len(success) > 0 {
		b, _ := json.Marshal(success)
		// set changes the part of success given, keeping the other.
		set["success"] = ops.Value{Text: string(b), Merge: true}
	}
	if v, ok := given["retry-on"]; ok {
		codes, err := ints(v)
		if err != nil {
			return nil, fmt.Errorf("--retry-on: %w", err)
		}
		text("retry_on", intArray(codes))
	}
	for _, b := range []struct{ flag, col string }{{"ordered", "ordered"}, {"allow-row-url", "allow_row_url"}} {
		if v, ok := given[b.flag]; ok {
			text(b.col, v)
		}
	}
	if v, ok := given["redact-path"]; ok {
		rp, err := redactPathJSON(v)
		if err != nil {
			return nil, fmt.Errorf("--redact-path: %w", err)
		}
		text("redact_path", rp)
	}
	for _, l := range []struct{ flag, col string }{{"row-url-hosts", "row_url_hosts"}, {"event-types", "event_types"}} {
		if v, ok := given[l.flag]; ok {
			var items listFlag
			_ = items.Set(v)
			text(l.col, textArray(items))
		}
	}
	if v, ok := given["filter"]; ok {
		var obj map[string]any
		if err := json.Unmarshal([]byte(v), &obj); err != nil {
			return nil, fmt.Errorf("--filter: want a JSON object: %w", err)
		}
		text("filter", v)
	}
	if v, ok := given["previous-secret-until"]; ok {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			d, derr := parseDuration(v)
			if derr != nil || d < 0 {
				return nil, errors.New("--previous-secret-until: want an RFC 3339 time, or a duration from now such as 7d")
			}
			t = now.Add(d)
		}
		text("previous_secret_until", t.UTC().Format(time.RFC3339Nano))
	}
	for _, key := range ef.unset {
		col := strings.ReplaceAll(key, "-", "_")
		if !slices.ContainsFunc(ops.EndpointColumns, func(c struct{ Name, Type string }) bool { return c.Name == col }) {
			return nil, fmt.Errorf("--unset: %s is not a key of an endpoint row", key)
		}
		if _, ok := set[col]; ok {
			return nil, fmt.Errorf("--unset %s: the key is set by another flag too", key)
		}
		set[col] = ops.Value{Default: true}
	}
	return set, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("want whole numbers separated by commas, got %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// intArray and textArray write PostgreSQL array literals.
func intArray(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return "{" + strings.Join(s, ",") + "}"
}

func textArray(items []string) string {
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(it) + `"`
	}
	return "{" + strings.Join(s, ",") + "}"
}

// redactPathJSON reads true, false or positions (4, or 1,3) as the column
// holds them.
func redactPathJSON(v string) (string, error) {
	if b, err := strconv.ParseBool(v); err == nil {
		return strconv.FormatBool(b), nil
	}
	ns, err := ints(v)
	if err != nil || len(ns) == 0 {
		return "", errors.New("want true, false, or segment positions such as 4 or 1,3")
	}
	b, _ := json.Marshal(ns)
	return string(b), nil
}

// endpointName is the one NAME a command takes (usage: the command's
// synopsis after "postbox endpoints").
func endpointName(env *opsEnv, usage string, stderr io.Writer) (string, bool) {
	if len(env.args) != 1 || env.args[0] == "" {
		fmt.Fprintf(stderr, "usage: postbox endpoints %s\n", usage)
		return "", false
	}
	return env.args[0], true
}

// writeFailed prints why a write was refused and returns its exit code:
// a value refused (invalid, a constraint, a missing or existing row) is
// the user's to fix (exitUsage).
func writeFailed(stderr io.Writer, verb string, err error, inFile bool) int {
	var inv *ops.InvalidError
	var refused *ops.RefusedError
	switch {
	case errors.As(err, &inv):
		fmt.Fprintf(stderr, "postbox: endpoints %s: not written: %s is invalid: %s\n", verb, printable(inv.Name), printable(inv.Reason))
		return exitUsage
	case errors.Is(err, ops.ErrNoEndpoint) && inFile:
		fmt.Fprintf(stderr, "postbox: endpoints %s: %v: it is defined in the configuration file; change it there\n", verb, err)
		return exitUsage
	case errors.Is(err, ops.ErrNoEndpoint):
		fmt.Fprintf(stderr, "postbox: endpoints %s: %v (endpoints add creates it)\n", verb, err)
		return exitUsage
	case errors.Is(err, ops.ErrEndpointExists):
		fmt.Fprintf(stderr, "postbox: endpoints %s: %v (endpoints set changes it)\n", verb, err)
		return exitUsage
	case errors.As(err, &refused):
		fmt.Fprintf(stderr, "postbox: endpoints %s: not written: %v\n", verb, err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "postbox: endpoints %s: %v\n", verb, err)
	return exitFailure
}

// conflictNote is what postbox says of a name both the file and the
// table define.
const conflictNote = "conflict: the file's settings are used"

func printWritten(env *opsEnv, stdout, stderr io.Writer, res []ops.WriteResult) {
	for _, r := range res {
		if r.Conflict {
			fmt.Fprintf(stderr, "warning: %s is defined in the configuration file too: %s\n", printable(r.Name), conflictNote)
		}
	}
	if env.json {
		if res == nil {
			res = []ops.WriteResult{}
		}
		env.printJSON(map[string]any{"endpoints": res})
		return
	}
	for _, r := range res {
		switch {
		case r.Op == "unchanged":
			fmt.Fprintf(stdout, "%s unchanged\n", printable(r.Name))
		case r.Held != "":
			fmt.Fprintf(stdout, "%s %s (revision %d), %s: its events wait\n", r.Op, printable(r.Name), r.Revision, r.Held)
		default:
			fmt.Fprintf(stdout, "%s %s (revision %d)\n", r.Op, printable(r.Name), r.Revision)
		}
	}
}

// cmdEndpointWrite is endpoints add and set.
func cmdEndpointWrite(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) int {
	ef := newEndpointFlags(verb)
	env, closeEnv, code := openOps(ctx, ef.fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	name, ok := endpointName(env, verb+" NAME [flags]", stderr)
	if !ok {
		return exitUsage
	}
	set, err := ef.values(time.Now())
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitUsage
	}
	op := ops.WriteInsert
	if verb == "set" {
		op = ops.WriteUpdate
		if len(set) == 0 {
			fmt.Fprintln(stderr, "postbox: endpoints set: give the keys to change (postbox endpoints set -h)")
			return exitUsage
		}
	}
	res, err := ops.WriteEndpoints(ctx, env.pool, env.cfg, "", op, []ops.EndpointWrite{{Name: name, Set: set}})
	if err != nil {
		_, inFile := env.cfg.Endpoints[name]
		return writeFailed(stderr, verb, err, inFile)
	}
	printWritten(env, stdout, stderr, res)
	return exitOK
}

// cmdEndpointEnable is endpoints enable and disable.
func cmdEndpointEnable(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints "+verb, flag.ContinueOnError)
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	name, ok := endpointName(env, verb+" NAME", stderr)
	if !ok {
		return exitUsage
	}
	set := map[string]ops.Value{"enabled": {Text: strconv.FormatBool(verb == "enable")}}
	res, err := ops.WriteEndpoints(ctx, env.pool, env.cfg, "", ops.WriteUpdate, []ops.EndpointWrite{{Name: name, Set: set, NoCheck: verb == "disable"}})
	if err != nil {
		_, inFile := env.cfg.Endpoints[name]
		return writeFailed(stderr, verb, err, inFile)
	}
	printWritten(env, stdout, stderr, res)
	return exitOK
}

func cmdEndpointRm(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints rm", flag.ContinueOnError)
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	name, ok := endpointName(env, "rm NAME", stderr)
	if !ok {
		return exitUsage
	}
	deleted, err := ops.DeleteEndpoint(ctx, env.pool, "", name)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if !deleted {
		fmt.Fprintf(stderr, "postbox: endpoints rm: no endpoint %s in postbox.endpoints\n", shellQuote(name))
		return exitUsage
	}
	if env.json {
		env.printJSON(map[string]any{"endpoints": []ops.WriteResult{{Name: name, Op: "deleted"}}})
		return exitOK
	}
	fmt.Fprintf(stdout, "deleted %s: its events are dead letters (unknown_endpoint) until it exists again, then replayable\n", printable(name))
	return exitOK
}

// definition is an endpoint as the file or the table defines it, for the
// list: where it comes from, and whether its events are held.
type definition struct {
	Endpoint string `json:"endpoint"`
	Source   string `json:"source"` // file or table
	Enabled  bool   `json:"enabled"`
	Revision int64  `json:"revision,omitempty"`
	Invalid  string `json:"invalid,omitempty"`
	Conflict string `json:"conflict,omitempty"`
}

// definitions lists the file's endpoints and the table's rows (only, when
// only is not ""), sorted by name, the file's first for a name in both.
func definitions(ctx context.Context, env *opsEnv, only string) ([]definition, error) {
	var out []definition
	for name := range env.cfg.Endpoints {
		if only == "" || only == name {
			out = append(out, definition{Endpoint: name, Source: config.SourceFile, Enabled: true})
		}
	}
	tes, err := ops.TableEndpoints(ctx, env.pool, only)
	if err != nil {
		return nil, err
	}
	resolved := ops.ResolveAll(env.cfg, tes)
	for i, te := range tes {
		ep := resolved[i]
		d := definition{Endpoint: te.Name, Source: config.SourceTable, Enabled: te.Enabled, Revision: te.Revision, Invalid: ep.Invalid}
		if _, ok := env.cfg.Endpoints[te.Name]; ok {
			d.Conflict = conflictNote
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b definition) int {
		if c := strings.Compare(a.Endpoint, b.Endpoint); c != 0 {
			return c
		}
		return strings.Compare(a.Source, b.Source)
	})
	return out, nil
}

func printDefinitions(w io.Writer, defs []definition) {
	if len(defs) == 0 {
		fmt.Fprintln(w, "no endpoints are defined (in the configuration file or postbox.endpoints)")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tSOURCE\tENABLED\tREVISION\tSTATUS")
	for _, d := range defs {
		status := "ok"
		switch {
		case d.Conflict != "":
			status = d.Conflict
		case d.Invalid != "":
			status = "invalid: " + d.Invalid + " (its events wait)"
		case !d.Enabled:
			status = "disabled (its events wait)"
		}
		rev := "-"
		if d.Source == config.SourceTable {
			rev = strconv.FormatInt(d.Revision, 10)
		}
		enabled := "yes"
		if !d.Enabled {
			enabled = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(d.Endpoint), d.Source, enabled, rev, printable(status))
	}
	_ = tw.Flush()
}

// endpointsSubcommands are the words after endpoints that name a command.
const endpointsSubcommands = "pause, resume, add, set, disable, enable, rm, export, import and history"
