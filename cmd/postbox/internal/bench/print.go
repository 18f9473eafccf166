package bench

import (
	"cmp"
	"fmt"
	"io"
	"strings"
)

// Print writes r for a person to read.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "postbox bench (%s)\n", r.Machine)
	if r.Emit {
		fmt.Fprintf(w, "events written with outbox.Emit (WAL messages), not outbox rows\n")
	}
	if r.CPUScheduling == "normal" {
		fmt.Fprintf(w, "the relay's threads scheduled as normal (--cpu-scheduling normal), not batch\n")
	}
	lat := []*LatencyResult{r.Latency, r.Hanging}
	if r.Dead != nil {
		lat = append(lat, r.Dead.Alone, r.Dead.Beside)
	}
	for i, l := range lat {
		if l == nil {
			continue
		}
		switch {
		case i == 3:
			fmt.Fprintf(w, "\nthe same beside %d dead endpoints (open breakers, three deliveries waiting on each, parked in %.1f s):\n", r.Dead.Dead, r.Dead.ParkSeconds)
		case l.Hanging:
			fmt.Fprintf(w, "\ncommit → receiver latency of the %d healthy endpoints at %d events/s, one of %d endpoints hanging:\n", l.Endpoints-1, l.Rate, l.Endpoints)
		default:
			fmt.Fprintf(w, "\ncommit → receiver latency at %d events/s over %d endpoints%s:\n", l.Rate, l.Endpoints, l.warmedUp())
		}
		fmt.Fprintf(w, "  p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   (measured/received %d/%d)\n", l.P50ms, l.P90ms, l.P99ms, l.Maxms, l.Measured, l.Received)
		fmt.Fprintf(w, "  sent %d, received %d, lost %d, duplicates %d%s; relay peak RSS %.0f MB\n", l.Sent, l.Received, l.Lost, l.Dups, anomalies(l.Unacknowledged, l.BadSignatures), l.RSSMB)
		l.Split.print(w)
		l.Costs.print(w)
	}
	if l := r.Floor; l != nil {
		fmt.Fprintf(w, "\nthe floor: commit → receiver latency at %d events/s over %d endpoints with no relay, a bare logical client forwarding each row at its Commit%s:\n", l.Rate, l.Endpoints, l.warmedUp())
		fmt.Fprintf(w, "  p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   (measured/received %d/%d)\n", l.P50ms, l.P90ms, l.P99ms, l.Maxms, l.Measured, l.Received)
		fmt.Fprintf(w, "  sent %d, received %d, lost %d, duplicates %d%s\n", l.Sent, l.Received, l.Lost, l.Dups, anomalies(0, l.BadSignatures))
		l.Split.printExact(w)
		l.Disk.print(w)
		l.Costs.print(w)
	}
	if f := r.Failing; f != nil {
		fmt.Fprintf(w, "\nan endpoint answering only 500, %d events queued for it:\n", f.Queued)
		fmt.Fprintf(w, "  %d requests in %.0f s (breaker %s after %d consecutive failures); bad signatures %d\n", f.Requests, f.Seconds, f.State, f.Threshold, f.BadSignatures)
	}
	if l := r.Load; l != nil {
		fmt.Fprintf(w, "\n%d producers inserting single-row transactions as fast as they commit, for %.0f s, over %d endpoints:\n", l.Producers, l.Seconds, l.Endpoints)
		fmt.Fprintf(w, "  inserts %.0f/s with the relay running (%.0f/s without it); deliveries %.0f/s meanwhile\n", l.InsertsPerS, l.BaselinePerS, l.DeliveriesPerS)
		fmt.Fprintf(w, "  lag (committed, not yet received): at most %d, %d when the load stopped, drained %.1f s later\n", l.MaxLag, l.LagAtEnd, l.DrainSeconds)
		fmt.Fprintf(w, "  commit → receiver p50 %.2f ms, p99 %.2f ms (%.1f%% over 50 ms; measured/received %d/%d); sent %d, lost %d, duplicates %d%s; relay peak RSS %.0f MB\n", l.P50ms, l.P99ms, 100*l.Over50ms, l.Measured, l.Received, l.Sent, l.Lost, l.Dups, anomalies(l.Unacknowledged, l.BadSignatures), l.RSSMB)
		l.printWeight(w)
		l.Split.print(w)
		l.Costs.print(w)
	}
	if l := r.LoadFloor; l != nil {
		fmt.Fprintf(w, "\nthe floor under load: %d producers inserting single-row transactions as fast as they commit, for %.0f s, over %d endpoints, with no relay, a bare logical client forwarding each row at its Commit:\n", l.Producers, l.Seconds, l.Endpoints)
		fmt.Fprintf(w, "  inserts %.0f/s; deliveries %.0f/s meanwhile\n", l.InsertsPerS, l.DeliveriesPerS)
		fmt.Fprintf(w, "  lag (committed, not yet received): at most %d, %d when the load stopped, drained %.1f s later\n", l.MaxLag, l.LagAtEnd, l.DrainSeconds)
		fmt.Fprintf(w, "  commit → receiver p50 %.2f ms, p99 %.2f ms (%.1f%% over 50 ms; measured/received %d/%d); sent %d, lost %d, duplicates %d%s\n", l.P50ms, l.P99ms, 100*l.Over50ms, l.Measured, l.Received, l.Sent, l.Lost, l.Dups, anomalies(0, l.BadSignatures))
		l.printWeight(w)
		l.Split.printExact(w)
		l.Costs.print(w)
	}
	for _, c := range []*CatchupResult{r.Catchup, r.CatchupBulk} {
		if c == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s of a %d-event backlog over %d endpoints, %s:\n", c.name(), c.Backlog, c.Endpoints, c.written())
		fmt.Fprintf(w, "  %.0f deliveries/s from relay start (%.1f s); %.0f/s first to last delivery (%.1f s)\n", c.Rate, c.Seconds, c.DrainRate, c.DrainSeconds)
		fmt.Fprintf(w, "  lost %d, duplicates %d%s; relay peak RSS %.0f MB\n", c.Lost, c.Dups, anomalies(c.Unacknowledged, c.BadSignatures), c.RSSMB)
		c.Costs.print(w)
	}
	if sc := r.Scale; sc != nil {
		fmt.Fprintf(w, "\nscale-out: a %d-event backlog over %d endpoints whose receiver takes %.0f ms, max_in_flight %d, relays started together:\n",
			sc.Backlog, sc.Endpoints, sc.DelayMS, sc.InFlight)
		fmt.Fprintf(w, "  instances  deliveries/s  ceiling/s  lost  duplicates  peak RSS MB  PG CPU ms/1000  relays CPU ms/1000\n")
		for _, run := range sc.Runs {
			var pg, relay float64
			if run.Costs != nil {
				pg, relay = run.Costs.PostgresCPUms, run.Costs.RelayCPUms
			}
			fmt.Fprintf(w, "  %9d  %12.0f  %9.0f  %4d  %10d  %11.0f  %14.0f  %18.0f\n", run.Instances, run.PerS, run.CeilingPerS, run.Lost, run.Dups, run.RSSMB, pg, relay)
		}
	}
	if c := r.Chaos; c != nil {
		fmt.Fprintf(w, "\nchaos (seed %d): %d relays, %d events/s over %d endpoints (one flapping) for %.0f s, %d faults:\n", c.Seed, c.Relays, c.Rate, c.Endpoints, c.Seconds, len(c.Faults))
		for _, f := range c.Faults {
			within := "within"
			if f.Dups > f.dupBound() {
				within = "ABOVE"
			}
			fmt.Fprintf(w, "  %6.1f s  %-17s %s; %d in flight before, %d arrived during, %d in flight after, %d arrived and left unrecorded (%d events exposed); %d duplicates, %s its bound of %d%s\n", f.AtSeconds, f.Kind, f.Target, f.InFlight, f.During, f.InFlightAfter, f.Unrecorded, f.Exposed, f.Dups, within, f.dupBound(), errSuffix(f.Error))
		}
		within := "within"
		if !c.DupsWithin {
			within = "ABOVE"
		}
		fmt.Fprintf(w, "  sent %d (%d inserts failed, of which %d were found committed and are counted as sent; %d skipped while the producers waited), received %d, lost %d%s\n", c.Sent, c.FailedInserts, c.FailedCommitted, c.SkippedInserts, c.Received, c.Lost, anomalies(c.Unacknowledged, c.BadSignatures))
		for k, n := range c.LostWhere {
			fmt.Fprintf(w, "    lost, %s: %d\n", k, n)
		}
		fmt.Fprintf(w, "  duplicates %d (%d before any fault), each fault's %s its bound, the attempts in flight at it (%d in all)\n", c.Dups, c.DupsBeforeFaults, within, c.DupBound)
		steady := "within"
		if c.HealthyMaxms > c.SteadyBoundms {
			steady = "ABOVE"
		}
		fmt.Fprintf(w, "  commit → receiver p99 %.0f ms, longest %.0f ms (measured/received %d/%d); without the flapping endpoint: p99 %.0f ms, longest %.0f ms, %s the bound of %.0f s; drained %.1f s after the load; relays' peak RSS %.0f MB\n", c.P99ms, c.Maxms, c.Measured, c.Received, c.HealthyP99ms, c.HealthyMaxms, steady, c.SteadyBoundms/1000, c.DrainSeconds, c.RSSMB)
	}
	if s := r.Soak; s != nil {
		fmt.Fprintf(w, "\nsoak: %d events/s over %d endpoints for %.0f s, one relay, retentions %.0f s, sampled every %s:\n", s.Rate, s.Endpoints, s.Seconds, s.RetentionS, soakInterval)
		fmt.Fprintf(w, "  %7s %8s %10s %12s %10s %8s\n", "at s", "RSS MB", "tables MB", "dead tuples", "WAL MB", "pending")
		for _, p := range s.Samples {
			fmt.Fprintf(w, "  %7.0f %8.1f %10.1f %12d %10.1f %8d\n", p.AtSeconds, p.RSSMB, p.TablesMB, p.DeadTuples, p.RetainedWALMB, p.PendingDeliveries)
		}
		if !s.Judged {
			fmt.Fprintf(w, "  too few samples (fewer than %d) from %.0f s on to judge growth\n", soakMinJudged, s.FromS)
		} else {
			fmt.Fprintf(w, "  slopes from %.0f s on (%d samples), per hour, ± the 95%% interval; growing when the interval's low end is above the threshold:\n", s.FromS, s.Slopes[0].Samples)
			var constant []string
			for _, f := range s.Slopes {
				if f.PerHour == 0 && f.CI95 == 0 {
					constant = append(constant, f.Figure)
					continue
				}
				verdict := "bounded"
				if f.Growing {
					verdict = "GROWING"
				}
				fmt.Fprintf(w, "    %-32s %+12.3f ± %-10.3f %s/h (threshold %g) %s\n", f.Figure, f.PerHour, f.CI95, f.Unit, f.Threshold, verdict)
			}
			if len(constant) > 0 {
				fmt.Fprintf(w, "    constant: %s\n", strings.Join(constant, ", "))
			}
		}
		fmt.Fprintf(w, "  sent %d (%d inserts failed or skipped), lost %d, duplicates %d, bad signatures %d\n", s.Sent, s.FailedInserts, s.Lost, s.Dups, s.BadSignatures)
	}
	r.Storm.print(w)
	r.Partners.print(w)
}

// anomalies are the figures that should be zero: bad signatures always,
// deliveries of events whose commit was never acknowledged when there are
// any (they are not a fault of the relay).
func anomalies(unacknowledged, badSignatures int) string {
	s := fmt.Sprintf(", bad signatures %d", badSignatures)
	if unacknowledged > 0 {
		s += fmt.Sprintf(", delivered without an acknowledged commit %d", unacknowledged)
	}
	return s
}

// print writes the costs on one line, when there are any.
func (c *Costs) print(w io.Writer) {
	if c == nil {
		return
	}
	relay := cmp.Or(c.relayName, "relay")
	fmt.Fprintf(w, "  per 1,000 events: CPU %.0f ms PostgreSQL (%.0f of it walsender), %.0f ms %s, %.0f ms bench; per event: %.1f rows, %.1f WAL records, %.0f WAL bytes, %.2f WAL flushes\n",
		c.PostgresCPUms, c.WalsenderCPUms, c.RelayCPUms, relay, c.BenchCPUms, c.RowsPerEvent, c.WALRecordsPerEvent, c.WALPerEvent, c.WALFlushesPerEvent)
	if c.WalsenderWaitms != 0 || c.RelayWaitms != 0 { // else not read: a given database's walsender, no relay
		fmt.Fprintf(w, "  waited for a CPU, per 1,000 events: walsender %.0f ms (%.0f µs a turn), %s %.0f ms (%.0f µs a turn, its threads together)\n",
			c.WalsenderWaitms, c.WalsenderWaitPerTurnus, relay, c.RelayWaitms, c.RelayWaitPerTurnus)
	}
	switch p := c.HostPauses; {
	case p == nil:
	case p.Count == 0:
		fmt.Fprintln(w, "  the machine never stood still for 40 ms or more")
	default:
		fmt.Fprintf(w, "  the machine stood still %d times for 40 ms or more, longest %.0f ms, %.0f ms in all (the bench's watch thread neither asleep nor waiting for a CPU, as when a host throttles its VM)\n",
			p.Count, p.LongestMS, p.TotalMS)
	}
}

// warmedUp says, for a latency heading, what warm-up came before the run.
func (l *LatencyResult) warmedUp() string {
	if l.WarmupSent == 0 {
		return ""
	}
	return fmt.Sprintf(" (after a %.0f s warm-up at that rate: %d events, in no figure but lost, duplicates and bad signatures)", l.WarmupSeconds, l.WarmupSent)
}

// printWeight says when the walsender was given a weight (--walsender-nice).
func (l *LoadResult) printWeight(w io.Writer) {
	if l.WalsenderNice != 0 {
		fmt.Fprintf(w, "  the walsender at nice %d (--walsender-nice), its scheduling group's too\n", l.WalsenderNice)
	}
}
