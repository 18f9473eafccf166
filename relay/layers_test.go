package relay_test

import (
	osexec "os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/postbox-relay/postbox"

// tiers are the layers of docs/architecture.md, bottom first. A package
// imports packages of its own tier or of the tiers below it, never above.
var tiers = [][]string{
	// Words and leaves: what every layer may use.
	{"relay/postboxtype", "relay/macro", "outbox", "internal/proc", "relay/pgtest",
		"relay/internal/guard", "relay/internal/logsafe", "relay/internal/watermark", "relay/internal/admin",
		"relay/internal/webstatic", "relay/internal/seed"},
	// Configuration as written, and the states the machinery shares.
	{"relay/config", "relay/internal/state"},
	// Mechanisms: the database, a request, a policy, the dispatcher.
	{"relay/internal/store", "relay/internal/deliver", "relay/internal/policy", "relay/internal/dispatch", "relay/internal/endpoints"},
	// The WAL and the public reads over the database.
	{"relay/internal/wal", "relay/ops", "relay/telemetry", "relay/doctor", "relay/report"},
	// The services, over their shared base (service).
	{"relay/internal/service", "relay/internal/protect", "relay/internal/execute", "relay/internal/endpointsync", "relay/internal/claim",
		"relay/internal/record", "relay/internal/ingest", "relay/internal/maintain", "relay/internal/console",
		"relay/internal/portal"},
	// The composition root.
	{"relay"},
	// The commands and the examples.
	{"cmd/postbox", "cmd/postbox/internal/bench", "examples/producer", "examples/receiver", "examples/affiliate"},
}

// only names packages whose imports of the module are limited to these
// (nil: none at all).
var only = map[string][]string{
	"relay/postboxtype":        nil,
	"relay/macro":              nil,
	"outbox":                   nil,
	"internal/proc":            nil,
	"relay/pgtest":             nil,
	"relay/internal/guard":     nil,
	"relay/internal/logsafe":   nil,
	"relay/internal/watermark": nil,
	"relay/internal/webstatic": nil,
	"relay/internal/seed":      nil,
	"relay/report":             nil,
	"relay/internal/state":     {"relay/postboxtype"},
	"relay/config":             {"outbox", "relay/macro"},
	"relay/internal/store":     {"outbox", "internal/proc", "relay/postboxtype", "relay/internal/state"},
	"relay/internal/wal":       {"outbox", "internal/proc", "relay/internal/store", "relay/internal/state"},
	"relay/internal/dispatch":  {"relay/postboxtype", "relay/internal/state"},
	"relay/internal/policy":    {"relay/postboxtype", "relay/config", "relay/internal/guard"},
}

// stdlibOnly are the leaves that import nothing but the standard library,
// so an application may use them without pulling in a dependency.
var stdlibOnly = []string{"relay/postboxtype", "relay/macro"}

// TestLayers: no package imports one of a layer above its own, and the
// packages that must stay leaves do (go list's import graph).
func TestLayers(t *testing.T) {
	t.Parallel()

	out, err := osexec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, module+"/...").Output()
	require.NoError(t, err, "go list")
	tier := map[string]int{}
	for i, ps := range tiers {
		for _, p := range ps {
			tier[p] = i
		}
	}
	rel := func(p string) (string, bool) {
		if p == module {
			return "", false // the module's root holds no package
		}
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		path, imports, _ := strings.Cut(strings.TrimSpace(line), ":")
		p, _ := rel(path)
		from, ok := tier[p]
		require.True(t, ok, "%s is in no layer: add it to tiers and docs/architecture.md", p)
		allowed, limited := only[p]
		for _, imp := range strings.Fields(imports) {
			if slices.Contains(stdlibOnly, p) {
				first, _, _ := strings.Cut(imp, "/")
				require.NotContains(t, first, ".", "%s imports %s: it imports only the standard library", p, imp)
			}
			q, ok := rel(imp)
			if !ok {
				continue
			}
			require.LessOrEqual(t, tier[q], from, "%s imports %s, of a layer above its own", p, q)
			if limited {
				require.Contains(t, allowed, q, "%s imports %s; of the module it imports only %v", p, q, allowed)
			}
		}
	}
}
