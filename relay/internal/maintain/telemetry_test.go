package maintain

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// gauge reads a gauge of m, the one whose labels include label (a name and
// a value) when label is given; ok is false if it is not there.
func gauge(t *testing.T, m *telemetry.Metrics, name string, label ...string) (float64, bool) {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, g := range f.GetMetric() {
			match := len(label) == 0
			for _, l := range g.GetLabel() {
				match = match || l.GetName() == label[0] && l.GetValue() == label[1]
			}
			if match {
				return g.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// The telemetry flusher sets the gauges on every instance, and records the
// alerts' states only where it leads.
func TestTelemetrySetsGaugesAndTheLeaderRecordsAlerts(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	queue(t, tb.st, 2)
	release := holdUpkeepLock(t, tb)
	var turn sync.Mutex
	f := newTelemetry(tb.env, &turn, newLeader(tb.env, &turn), func() bool { return true })
	require.Equal(t, TelemetryFirstDefault, f.first)
	require.Equal(t, TelemetryIntervalDefault, f.interval)
	f.first, f.interval = 0, tick
	require.NoError(t, f.Start(context.Background()))
	defer f.Stop()

	require.Eventually(t, func() bool {
		pending, _ := gauge(t, tb.env.Metrics, "postbox_queue_depth", "status", "pending")
		streaming, _ := gauge(t, tb.env.Metrics, "postbox_streaming")
		return pending == 2 && streaming == 1
	}, wait, tick)
	require.Zero(t, count(t, tb.st, `SELECT count(*) FROM postbox.alerts`), "another instance leads")
	release()
	require.Eventually(t, func() bool { return count(t, tb.st, `SELECT count(*) FROM postbox.alerts`) > 0 }, wait, tick,
		"it leads now")
}
