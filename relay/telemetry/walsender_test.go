package telemetry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// The walsender's series are read at each scrape, and absent while there
// is nothing to read: before a relay sets a source, and while its source
// has no walsender on this machine.
func TestWalsenderSeriesFollowTheirSource(t *testing.T) {
	t.Parallel()
	m := telemetry.NewMetrics()
	scrape := func() map[string]float64 {
		families, err := m.Registry.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, f := range families {
			switch f.GetName() {
			case "postbox_walsender_cpu_seconds_total", "postbox_walsender_cpu_wait_seconds_total":
				got[f.GetName()] = f.GetMetric()[0].GetCounter().GetValue()
			case "postbox_walsender_nice":
				got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return got
	}
	require.Empty(t, scrape(), "no source set")

	cpu, ok := telemetry.WalsenderCPU{Ran: 1500 * time.Millisecond, Waited: 250 * time.Millisecond, Nice: -10}, false
	m.SetWalsender(func() (telemetry.WalsenderCPU, bool) { return cpu, ok })
	require.Empty(t, scrape(), "no walsender here")

	ok = true
	require.Equal(t, map[string]float64{
		"postbox_walsender_cpu_seconds_total": 1.5, "postbox_walsender_cpu_wait_seconds_total": 0.25, "postbox_walsender_nice": -10,
	}, scrape())
	cpu.Ran = 2 * time.Second
	require.Equal(t, 2.0, scrape()["postbox_walsender_cpu_seconds_total"], "read again at each scrape")
}
