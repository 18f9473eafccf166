package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Scale scenario defaults: receivers that take ScaleDelay per request,
// each endpoint's max_in_flight ScaleInFlight, so that one instance's
// delivery rate is bounded by its concurrency, not by CPU.
const (
	InstancesDefault = 3
	ScaleDelay       = 20 * time.Millisecond
	ScaleInFlight    = 2
)

// ScaleResult is the scale scenario's: one run per number of instances.
type ScaleResult struct {
	Backlog   int         `json:"backlog"`
	Endpoints int         `json:"endpoints"`
	DelayMS   float64     `json:"receiver_delay_ms"`
	InFlight  int         `json:"max_in_flight"`
	Runs      []*ScaleRun `json:"runs"`
}

// ScaleRun is the scale scenario with Instances relays.
type ScaleRun struct {
	Instances int     `json:"instances"`
	Seconds   float64 `json:"seconds"`
	PerS      float64 `json:"deliveries_per_s"`
	// Ceiling is what the instances' concurrency allows:
	// instances × endpoints × max_in_flight / delay.
	CeilingPerS float64 `json:"ceiling_per_s"`
	Lost        int     `json:"lost"`
	Dups        int     `json:"duplicates"`
	RSSMB       float64 `json:"peak_rss_mb_max"`
	Costs       *Costs  `json:"costs,omitempty"`
}

// scaleConfig is the relays' configuration: endpoints whose receiver
// takes ScaleDelay, at most ScaleInFlight attempts in flight each.
func (e *env) scaleConfig(endpoints int) string {
	var b strings.Builder
	e.writeConfigHead(&b, "127.0.0.1:0", "warn")
	b.WriteString("endpoints:\n")
	for i := range endpoints {
		fmt.Fprintf(&b, "  ep-%d:\n    url: %s/slow/ep-%d\n    max_in_flight: %d\n", i, e.recv.URL, i, ScaleInFlight)
	}
	return b.String()
}

// scale queues a backlog with no relay running, then starts n relays at
// once against the one database and times the drain, for n = 1 to
// o.Instances: the delivery rate grows with n while concurrency is the
// limit, until the database's write rate is.
func (e *env) scale(ctx context.Context, o Options) (*ScaleResult, error) {
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(filepath.Dir(e.cfgPath), "scale.yaml")
	if err := os.WriteFile(cfgPath, []byte(e.scaleConfig(o.Endpoints)), 0o600); err != nil {
		return nil, err
	}
	backlog := max(o.Backlog/5, 1000)
	res := &ScaleResult{Backlog: backlog, Endpoints: o.Endpoints, DelayMS: float64(ScaleDelay) / float64(time.Millisecond), InFlight: ScaleInFlight}
	for n := 1; n <= o.Instances; n++ {
		led := e.recv.reset()
		fmt.Fprintf(e.log, "bench: scale, %d events to %d endpoints taking %s, %d instance(s)\n", backlog, o.Endpoints, ScaleDelay, n)
		for first := 0; first < backlog; first += 10000 {
			if err := e.queue(ctx, o, led, first, min(10000, backlog-first)); err != nil {
				return nil, err
			}
		}
		from := e.read(ctx)
		start := time.Now()
		var relays []*exec.Cmd
		var dones []chan struct{}
		stopAll := func() float64 {
			var rss float64
			for i, cmd := range relays {
				rss = max(rss, PeakRSS(cmd.Process.Pid))
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-dones[i]:
				case <-time.After(60 * time.Second):
					_ = cmd.Process.Kill()
					<-dones[i]
				}
			}
			return rss
		}
		for range n {
			cmd, done, err := e.spawnRelay(cfgPath)
			if err != nil {
				stopAll()
				return nil, err
			}
			relays, dones = append(relays, cmd), append(dones, done)
		}
		err := waitFor(ctx, 10*time.Minute, 20*time.Millisecond, func() (bool, error) {
			for _, d := range dones {
				select {
				case <-d:
					return false, errors.New("a relay exited")
				default:
				}
			}
			return led.pending() == 0, nil
		})
		elapsed := time.Since(start)
		to := e.read(ctx)
		for _, cmd := range relays {
			to.relay += procCPU(cmd.Process.Pid)
		}
		rss := stopAll()
		if err != nil {
			return nil, err
		}
		e.settle(ctx)
		t := led.tally()
		res.Runs = append(res.Runs, &ScaleRun{
			Instances: n, Seconds: elapsed.Seconds(), PerS: float64(t.received) / elapsed.Seconds(),
			CeilingPerS: float64(n*o.Endpoints*ScaleInFlight) / ScaleDelay.Seconds(),
			Lost:        t.lost, Dups: t.dups, RSSMB: rss, Costs: e.costs(ctx, from, to, t.received),
		})
		e.truncate(ctx, true)
	}
	return res, nil
}
