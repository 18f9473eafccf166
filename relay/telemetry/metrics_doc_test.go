package telemetry_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestEveryMetricIsDocumented: each postbox_* metric the registry holds
// has a row in docs/operations.md's table of metrics, and each row names
// a metric that exists.
func TestEveryMetricIsDocumented(t *testing.T) {
	t.Parallel()
	m := telemetry.NewMetrics()
	descs := make(chan *prometheus.Desc)
	go func() {
		m.Registry.Describe(descs)
		close(descs)
	}()
	registered := map[string]bool{}
	nameRe := regexp.MustCompile(`fqName: "(postbox_[a-z_]+)"`)
	for d := range descs {
		if mm := nameRe.FindStringSubmatch(d.String()); mm != nil {
			registered[mm[1]] = true
		}
	}
	require.Greater(t, len(registered), 15, "the registry's metrics were read")

	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	section := string(doc)
	start := strings.Index(section, "\n## Metrics\n")
	require.GreaterOrEqual(t, start, 0, "docs/operations.md has a section Metrics")
	section = section[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	documented := map[string]bool{}
	for _, mm := range regexp.MustCompile("(?m)^\\| `(postbox_[a-z_]+)").FindAllStringSubmatch(section, -1) {
		documented[mm[1]] = true
	}
	for name := range registered {
		require.True(t, documented[name], "metric %s has no row in docs/operations.md, Metrics", name)
	}
	for name := range documented {
		require.True(t, registered[name], "docs/operations.md documents %s, which is not registered", name)
	}
}
