package telemetry

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WalsenderCPU is what SetWalsender's reader returns of the walsender:
// the CPU time it ran, the time it was runnable but waited for a CPU, and
// its nice value.
type WalsenderCPU struct {
	Ran, Waited time.Duration
	Nice        int
}

// walsenderCollector reads the walsender's CPU at each scrape, from the
// function SetWalsender gave it. Its series are absent while there is
// nothing to read: no session streams here, or its walsender runs on
// another machine.
type walsenderCollector struct {
	read              atomic.Pointer[func() (WalsenderCPU, bool)]
	ran, waited, nice *prometheus.Desc
}

func newWalsenderCollector() *walsenderCollector {
	return &walsenderCollector{
		ran: prometheus.NewDesc("postbox_walsender_cpu_seconds_total",
			"CPU time of the walsender streaming this instance's session, where the server runs on this machine "+
				"(/proc/PID/schedstat; absent elsewhere). A new session's walsender counts from its own start.", nil, nil),
		waited: prometheus.NewDesc("postbox_walsender_cpu_wait_seconds_total",
			"Time the walsender streaming this instance's session was runnable but waited for a CPU. Growing as fast "+
				"as postbox_walsender_cpu_seconds_total, the walsender is starved and sends committed rows late "+
				"(walsender_nice gives it its share).", nil, nil),
		nice: prometheus.NewDesc("postbox_walsender_nice",
			"Nice value of the walsender streaming this instance's session (walsender_nice sets it).", nil, nil),
	}
}

func (c *walsenderCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ran
	ch <- c.waited
	ch <- c.nice
}

func (c *walsenderCollector) Collect(ch chan<- prometheus.Metric) {
	read := c.read.Load()
	if read == nil {
		return
	}
	cpu, ok := (*read)()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.ran, prometheus.CounterValue, cpu.Ran.Seconds())
	ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, cpu.Waited.Seconds())
	ch <- prometheus.MustNewConstMetric(c.nice, prometheus.GaugeValue, float64(cpu.Nice))
}

// SetWalsender sets how the walsender's CPU is read at each scrape: read
// reports false when there is none to read.
func (m *Metrics) SetWalsender(read func() (WalsenderCPU, bool)) {
	m.walsender.read.Store(&read)
}
