package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/ops"
)

// exportedEndpoint is an endpoint as endpoints export writes it and
// import reads it: the configuration file's keys, and beside them those
// only a row of postbox.endpoints has. It is not a key of the
// configuration file, whose endpoints refuse the table's own keys.
type exportedEndpoint struct {
	config.EndpointConfig `yaml:",inline"`
	Enabled               *bool          `yaml:"enabled,omitempty"`
	EventTypes            []string       `yaml:"event_types,omitempty"`
	Filter                map[string]any `yaml:"filter,omitempty"`
	Secret                string         `yaml:"secret,omitempty"`
	SecretVersion         int            `yaml:"secret_version,omitempty"`
	PreviousSecretUntil   *time.Time     `yaml:"previous_secret_until,omitempty"`
}

// endpointsFile is an export: the configuration file's endpoints section.
type endpointsFile struct {
	Endpoints map[string]exportedEndpoint `yaml:"endpoints"`
}

// exported is a table row as export writes it.
func exported(te config.TableEndpoint) exportedEndpoint {
	e := exportedEndpoint{EndpointConfig: te.Settings, EventTypes: te.EventTypes, Secret: te.Secret}
	if e.RateLimit != nil && e.RateLimit.IsZero() {
		e.RateLimit = nil // a rate_limit that did not parse: no rate is zero
	}
	if !te.Enabled {
		e.Enabled = &te.Enabled
	}
	if te.Filter != nil {
		_ = json.Unmarshal(te.Filter, &e.Filter)
	}
	if te.SecretVersion > 1 {
		e.SecretVersion = te.SecretVersion
	}
	if !te.PreviousSecretUntil.IsZero() {
		t := te.PreviousSecretUntil.UTC()
		e.PreviousSecretUntil = &t
	}
	return e
}

// drop leaves out key, the column whose text did not parse first (the
// columns whose type PostgreSQL checks always parse).
func (e *exportedEndpoint) drop(key string) {
	s := &e.EndpointConfig
	switch key {
	case "rate_limit":
		s.RateLimit = nil
	case "headers":
		s.Headers = nil
	case "success":
		s.Success = nil
	case "redact_path":
		s.RedactPath = nil
	case "filter":
		e.Filter = nil
	case "previous_secret_until":
		e.PreviousSecretUntil = nil
	}
	// The interval columns of a row that does not parse are nil already.
}

// tableKeys are the keys e sets that only a row of postbox.endpoints has.
func (e exportedEndpoint) tableKeys() []string {
	var out []string
	for _, k := range []struct {
		key string
		set bool
	}{
		{"enabled", e.Enabled != nil}, {"event_types", e.EventTypes != nil}, {"filter", e.Filter != nil},
		{"secret", e.Secret != ""}, {"secret_version", e.SecretVersion != 0}, {"previous_secret_until", e.PreviousSecretUntil != nil},
	} {
		if k.set {
			out = append(out, k.key)
		}
	}
	return out
}

// columns are the values an exported endpoint gives its row's columns;
// import makes the row exactly these (the rest take their defaults).
func (e exportedEndpoint) columns() (map[string]ops.Value, error) {
	s := e.EndpointConfig
	if s.Secrets != nil || s.SecretsFile != nil {
		return nil, errors.New("secrets, secrets_file: no secret is written into the database: declare it under signing.named in the configuration and name it with secret")
	}
	set := map[string]ops.Value{}
	text := func(col, v string) { set[col] = ops.Value{Text: v} }
	jsonText := func(col string, v any) {
		b, _ := json.Marshal(v)
		text(col, string(b))
	}
	for col, v := range map[string]*string{"url": s.URL, "method": s.Method, "body": s.Body} {
		if v != nil {
			text(col, *v)
		}
	}
	for col, v := range map[string]*config.Duration{"timeout": s.Timeout, "backoff_base": s.BackoffBase, "backoff_cap": s.BackoffCap,
		"cooldown": s.Cooldown, "max_cooldown": s.MaxCooldown} {
		if v != nil {
			text(col, ops.IntervalText(v.D()))
		}
	}
	for col, v := range map[string]*int{"max_attempts": s.MaxAttempts, "failure_threshold": s.FailureThreshold, "max_in_flight": s.MaxInFlight} {
		if v != nil {
			text(col, strconv.Itoa(*v))
		}
	}
	if s.RateLimit != nil {
		text("rate_limit", s.RateLimit.String())
	}
	if s.Headers != nil {
		jsonText("headers", s.Headers)
	}
	if s.Success != nil {
		sc := map[string]any{}
		if s.Success.Status != nil {
			sc["status"] = s.Success.Status
		}
		if s.Success.BodyContains != "" {
			sc["body_contains"] = s.Success.BodyContains
		}
		if s.Success.BodyMismatch != "" {
			sc["body_mismatch"] = s.Success.BodyMismatch
		}
		jsonText("success", sc)
	}
	if s.RetryOn != nil {
		text("retry_on", intArray(s.RetryOn))
	}
	for col, v := range map[string]*bool{"ordered": s.Ordered, "allow_row_url": s.AllowRowURL} {
		if v != nil {
			text(col, strconv.FormatBool(*v))
		}
	}
	if s.RedactPath != nil {
		v, _ := s.RedactPath.MarshalYAML()
		jsonText("redact_path", v)
	}
	if s.RowURLHosts != nil {
		text("row_url_hosts", textArray(s.RowURLHosts))
	}
	if e.Enabled != nil {
		text("enabled", strconv.FormatBool(*e.Enabled))
	}
	if e.EventTypes != nil {
		text("event_types", textArray(e.EventTypes))
	}
	if e.Filter != nil {
		jsonText("filter", e.Filter)
	}
	if e.Secret != "" {
		text("secret", e.Secret)
	}
	if e.SecretVersion != 0 {
		text("secret_version", strconv.Itoa(e.SecretVersion))
	}
	if e.PreviousSecretUntil != nil {
		text("previous_secret_until", e.PreviousSecretUntil.UTC().Format(time.RFC3339Nano))
	}
	return set, nil
}

// marshalEndpoints writes an export: each endpoint's keys in the table's
// column order, those a row leaves NULL left out (the configuration's
// struct would write them as null or as an empty list, which for
// row_url_hosts means something else).
func marshalEndpoints(f endpointsFile) ([]byte, error) {
	names := make([]string, 0, len(f.Endpoints))
	for n := range f.Endpoints {
		names = append(names, n)
	}
	sort.Strings(names)
	eps := &yaml.Node{Kind: yaml.MappingNode}
	for _, n := range names {
		node, err := f.Endpoints[n].node()
		if err != nil {
			return nil, err
		}
		eps.Content = append(eps.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: n}, node)
	}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Value: "endpoints"}, eps}}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return b.Bytes(), enc.Close()
}

// node is e as a YAML mapping of the keys it sets.
func (e exportedEndpoint) node() (*yaml.Node, error) {
	s := e.EndpointConfig
	var success any
	if s.Success != nil {
		sc := map[string]any{}
		if s.Success.Status != nil {
			sc["status"] = s.Success.Status
		}
		if s.Success.BodyContains != "" {
			sc["body_contains"] = s.Success.BodyContains
		}
		if s.Success.BodyMismatch != "" {
			sc["body_mismatch"] = s.Success.BodyMismatch
		}
		success = sc
	}
	keys := []struct {
		key string
		v   any
		set bool
	}{
		{"url", s.URL, s.URL != nil}, {"method", s.Method, s.Method != nil}, {"body", s.Body, s.Body != nil},
		{"headers", s.Headers, s.Headers != nil}, {"timeout", s.Timeout, s.Timeout != nil},
		{"max_attempts", s.MaxAttempts, s.MaxAttempts != nil}, {"backoff_base", s.BackoffBase, s.BackoffBase != nil},
		{"backoff_cap", s.BackoffCap, s.BackoffCap != nil}, {"failure_threshold", s.FailureThreshold, s.FailureThreshold != nil},
		{"cooldown", s.Cooldown, s.Cooldown != nil}, {"max_cooldown", s.MaxCooldown, s.MaxCooldown != nil},
		{"rate_limit", s.RateLimit, s.RateLimit != nil}, {"max_in_flight", s.MaxInFlight, s.MaxInFlight != nil},
		{"success", success, s.Success != nil}, {"retry_on", s.RetryOn, s.RetryOn != nil},
		{"ordered", s.Ordered, s.Ordered != nil}, {"redact_path", s.RedactPath, s.RedactPath != nil},
		{"allow_row_url", s.AllowRowURL, s.AllowRowURL != nil}, {"row_url_hosts", s.RowURLHosts, s.RowURLHosts != nil},
		{"enabled", e.Enabled, e.Enabled != nil}, {"event_types", e.EventTypes, e.EventTypes != nil},
		{"filter", e.Filter, e.Filter != nil}, {"secret", e.Secret, e.Secret != ""},
		{"secret_version", e.SecretVersion, e.SecretVersion != 0},
		{"previous_secret_until", e.PreviousSecretUntil, e.PreviousSecretUntil != nil},
	}
	out := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range keys {
		if !k.set {
			continue
		}
		var v yaml.Node
		if err := v.Encode(k.v); err != nil {
			return nil, fmt.Errorf("%s: %w", k.key, err)
		}
		out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k.key}, &v)
	}
	return out, nil
}

// readEndpointsFile reads an export, or a configuration file: its
// endpoints section, each key checked as the file's are; the other
// top-level keys are named and left alone.
func readEndpointsFile(data []byte) (endpointsFile, []string, error) {
	var top map[string]yaml.Node
	if err := yaml.Unmarshal(data, &top); err != nil {
		return endpointsFile{}, nil, err
	}
	var ignored []string
	for k := range top {
		if k != "endpoints" {
			ignored = append(ignored, k)
		}
	}
	sort.Strings(ignored)
	n, ok := top["endpoints"]
	if !ok {
		return endpointsFile{}, ignored, errors.New("no endpoints: section")
	}
	if n.Kind != yaml.MappingNode {
		return endpointsFile{}, ignored, errors.New("endpoints: want a mapping of names to endpoints")
	}
	// Each endpoint is decoded alone: yaml's check of a mapping's keys is
	// quadratic, which an import of 100,000 endpoints would feel.
	f := endpointsFile{Endpoints: make(map[string]exportedEndpoint, len(n.Content)/2)}
	for i := 0; i+1 < len(n.Content); i += 2 {
		name := n.Content[i].Value
		if _, dup := f.Endpoints[name]; dup {
			return f, ignored, fmt.Errorf("endpoints.%s: defined twice", name)
		}
		b, err := yaml.Marshal(n.Content[i+1])
		if err != nil {
			return f, ignored, fmt.Errorf("endpoints.%s: %w", name, err)
		}
		var e exportedEndpoint
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&e); err != nil && !errors.Is(err, io.EOF) {
			return f, ignored, fmt.Errorf("endpoints.%s: %s", name, yamlMessage(err))
		}
		f.Endpoints[name] = e
	}
	return f, ignored, nil
}

// yamlMessage is a decoding error without what only the decoder knows:
// the line of the endpoint decoded alone, and this program's type names.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = yamlNoise.ReplaceAllString(m, "")
	}
	return strings.Join(msgs, "; ")
}

var yamlNoise = regexp.MustCompile(`^line \d+: | in type \S+$`)

func cmdEndpointExport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints export", flag.ContinueOnError)
	fileKeys := fs.Bool("file-keys", false, "write only the keys the configuration file takes, for its endpoints: section (the table's own keys a row sets are named on standard error)")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	if len(env.args) != 1 {
		fmt.Fprintln(stderr, "usage: postbox endpoints export FILE (- for standard output)")
		return exitUsage
	}
	tes, err := ops.TableEndpoints(ctx, env.pool, "")
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	f := endpointsFile{Endpoints: map[string]exportedEndpoint{}}
	for _, te := range tes {
		e := exported(te)
		if te.Invalid != "" {
			// A value that does not parse cannot be written as its key:
			// the key is left out, and said.
			col, _, _ := strings.Cut(te.Invalid, ":")
			e.drop(col)
			fmt.Fprintf(stderr, "warning: %s is invalid (%s): exported without %s\n", printable(te.Name), printable(te.Invalid), col)
		}
		if *fileKeys {
			if dropped := e.tableKeys(); len(dropped) > 0 {
				fmt.Fprintf(stderr, "warning: %s: left out %s, which the configuration file does not take\n", printable(te.Name), strings.Join(dropped, ", "))
			}
			e = exportedEndpoint{EndpointConfig: e.EndpointConfig}
		}
		f.Endpoints[te.Name] = e
	}
	out, err := marshalEndpoints(f)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	path := env.args[0]
	if path == "-" {
		_, _ = stdout.Write(out)
		return exitOK
	}
	// Headers may hold credentials: the file is the operator's alone.
	if err := os.WriteFile(path, out, 0o600); err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		env.printJSON(map[string]any{"file": path, "exported": len(tes)})
		return exitOK
	}
	fmt.Fprintf(stdout, "exported %s to %s\n", plural(int64(len(tes)), "endpoint"), path)
	return exitOK
}

func cmdEndpointImport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints import", flag.ContinueOnError)
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	if len(env.args) != 1 {
		fmt.Fprintln(stderr, "usage: postbox endpoints import FILE")
		return exitUsage
	}
	data, err := os.ReadFile(env.args[0])
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitUsage
	}
	f, ignored, err := readEndpointsFile(data)
	if err != nil {
		fmt.Fprintf(stderr, "postbox: endpoints import: %s: %v\n", env.args[0], err)
		return exitUsage
	}
	if len(ignored) > 0 {
		fmt.Fprintf(stderr, "endpoints import reads the endpoints: section alone; left as they are: %s\n", strings.Join(ignored, ", "))
	}
	names := make([]string, 0, len(f.Endpoints))
	for n := range f.Endpoints {
		names = append(names, n)
	}
	sort.Strings(names)
	writes := make([]ops.EndpointWrite, 0, len(names))
	for _, n := range names {
		set, err := f.Endpoints[n].columns()
		if err != nil {
			fmt.Fprintf(stderr, "postbox: endpoints import: endpoints.%s.%v\n", n, err)
			return exitUsage
		}
		writes = append(writes, ops.EndpointWrite{Name: n, Set: set})
	}
	res, err := ops.WriteEndpoints(ctx, env.pool, env.cfg, "", ops.WriteUpsert, writes)
	if err != nil {
		fmt.Fprintln(stderr, "postbox: endpoints import: nothing imported (one transaction)")
		return writeFailed(stderr, "import", err, false)
	}
	if env.json {
		printWritten(env, stdout, stderr, res)
		return exitOK
	}
	// Each endpoint created or changed, then the counts: an import of
	// thousands mostly unchanged names only what it did.
	counts := map[string]int{}
	var did []ops.WriteResult
	for _, r := range res {
		counts[r.Op]++
		if r.Op != "unchanged" || r.Conflict {
			did = append(did, r)
		}
	}
	printWritten(env, stdout, stderr, did)
	fmt.Fprintf(stdout, "imported %s: %d created, %d changed, %d unchanged\n", plural(int64(len(res)), "endpoint"),
		counts["created"], counts["changed"], counts["unchanged"])
	return exitOK
}

// historyLimitDefault is how many changes endpoints history shows unless
// --limit says otherwise.
const historyLimitDefault = 50

func cmdEndpointHistory(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox endpoints history", flag.ContinueOnError)
	limit := fs.Int("limit", historyLimitDefault, "show at most this many changes, the newest (0: all)")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	name, ok := endpointName(env, "history NAME [--limit N]", stderr)
	if !ok {
		return exitUsage
	}
	changes, err := ops.EndpointHistory(ctx, env.pool, name, *limit)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		if changes == nil {
			changes = []ops.EndpointChange{}
		}
		env.printJSON(map[string]any{"endpoint": name, "changes": changes})
		return exitOK
	}
	if len(changes) == 0 {
		fmt.Fprintf(stdout, "no changes of %s are logged\n", printable(name))
		return exitOK
	}
	for _, c := range changes {
		fmt.Fprintf(stdout, "%s  %s  revision %d  by %s\n", c.At.UTC().Format(time.RFC3339), c.Op, c.Revision, printable(c.Actor))
		for _, k := range c.Changes {
			if c.Op == "delete" {
				break // the row as it was is in --json
			}
			fmt.Fprintf(stdout, "  %s: %s → %s\n", k.Key, shownValue(k.Old), shownValue(k.New))
		}
	}
	return exitOK
}

// shownValue is a change log value as history prints it: a string as
// itself.
func shownValue(v json.RawMessage) string {
	if v == nil {
		return "(none)"
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return printable(string(v))
	}
	return printable(s)
}
