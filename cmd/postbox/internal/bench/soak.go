package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// soakInterval is how often the soak scenario samples.
const soakInterval = 10 * time.Second

// soakGrowth is how much more the last third of a soak's samples may
// average than the middle third before the figure counts as growing
// without bound.
const soakGrowth = 1.5

// Floors below which a soak figure is too small to judge its growth by a
// ratio: a few MB of WAL or a few thousand dead tuples come and go.
const (
	soakWALFloorMB = 16
	soakDeadFloor  = 10000
)

// ErrUnbounded is returned by Run, with the figures, when a soak figure
// grew without bound.
var ErrUnbounded = errors.New("grew without bound")

// SoakResult is the soak scenario's.
type SoakResult struct {
	Rate          int          `json:"rate_per_s"`
	Endpoints     int          `json:"endpoints"`
	Seconds       float64      `json:"seconds"`
	Samples       []SoakSample `json:"samples"`
	Sent          int          `json:"sent"`
	FailedInserts int          `json:"failed_inserts"`
	Lost          int          `json:"lost"`
	Dups          int          `json:"duplicates"`
	BadSignatures int          `json:"bad_signatures"`
	// Growing names the figures whose last third averaged more than
	// soakGrowth times the middle third; Judged is false when there were
	// too few samples to tell. Unjudged names figures left out: dead
	// tuples are judged only once autovacuum has been through
	// postbox.deliveries before the middle third ends (before its first
	// pass they can only grow).
	Growing  []string `json:"growing,omitempty"`
	Judged   bool     `json:"judged"`
	Unjudged []string `json:"unjudged,omitempty"`
}

// SoakSample is one of the soak scenario's samples.
type SoakSample struct {
	AtSeconds         float64 `json:"at_s"`
	RSSMB             float64 `json:"relay_rss_mb"`
	TablesMB          float64 `json:"postbox_tables_mb"`
	DeliveriesDead    int64   `json:"deliveries_dead_tuples"`
	DeliveriesVacuum  string  `json:"deliveries_last_autovacuum,omitempty"`
	RetainedWALMB     float64 `json:"slot_retained_wal_mb"`
	PendingDeliveries int     `json:"pending_at_receiver"`
}

// soak produces a steady stream for o.Duration with one relay and samples
// its RSS, postbox's tables, autovacuum and the slot's retained WAL every
// soakInterval.
func (e *env) soak(ctx context.Context, o Options) (*SoakResult, error) {
	led := e.recv.reset()
	res := &SoakResult{Rate: o.Rate, Endpoints: o.Endpoints, Seconds: o.Duration.Seconds()}
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: soak, %d events/s over %d endpoints for %s, sampling every %s\n", o.Rate, o.Endpoints, o.Duration, soakInterval)
	began := time.Now()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(soakInterval)
		defer tick.Stop()
		for range int(o.Duration / soakInterval) {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s := SoakSample{AtSeconds: time.Since(began).Seconds(), RSSMB: currentRSS(e.relay.Process.Pid), PendingDeliveries: led.pending()}
			var vac *time.Time
			_ = e.pool.QueryRow(ctx, `
				SELECT (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
				        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'postbox' AND c.relkind = 'r')::float8 / 1048576,
				       coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'postbox' AND relname = 'deliveries'), 0),
				       (SELECT last_autovacuum FROM pg_stat_user_tables WHERE schemaname = 'postbox' AND relname = 'deliveries'),
				       coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM pg_replication_slots WHERE slot_name = $1), 0)::float8 / 1048576`,
				e.slot).Scan(&s.TablesMB, &s.DeliveriesDead, &vac, &s.RetainedWALMB)
			if vac != nil {
				s.DeliveriesVacuum = vac.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(e.log, "bench: soak %5.0fs rss %.0f MB, tables %.1f MB, deliveries dead tuples %d, retained WAL %.1f MB, pending %d\n",
				s.AtSeconds, s.RSSMB, s.TablesMB, s.DeliveriesDead, s.RetainedWALMB, s.PendingDeliveries)
			res.Samples = append(res.Samples, s)
		}
	}()
	failed, skipped := e.produceChaos(ctx, led, o.Rate, o.Endpoints, o.Duration)
	res.FailedInserts = failed + skipped
	<-sampled
	if _, _, err := e.resolve(ctx, led, "postbox.outbox"); err != nil {
		e.stopRelay()
		return nil, err
	}
	err := waitFor(ctx, time.Minute, 50*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	e.stopRelay()
	if err != nil {
		return nil, err
	}
	t := led.tally()
	res.Sent, res.Lost, res.Dups, res.BadSignatures = t.sent, t.lost, t.dups, e.recv.scenarioBad()
	res.Growing, res.Unjudged, res.Judged = growing(res.Samples)
	e.truncate(ctx, false)
	return res, nil
}

// growing compares the last third of the samples with the middle third;
// it needs six samples at least to judge.
func growing(samples []SoakSample) (grew, unjudged []string, judged bool) {
	n := len(samples)
	if n < 6 {
		return nil, nil, false
	}
	vacuumed := samples[2*n/3-1].DeliveriesVacuum != ""
	mid, last := samples[n/3:2*n/3], samples[2*n/3:]
	avg := func(ss []SoakSample, f func(SoakSample) float64) float64 {
		sum := 0.0
		for _, s := range ss {
			sum += f(s)
		}
		return sum / float64(len(ss))
	}
	for _, c := range []struct {
		name  string
		floor float64
		f     func(SoakSample) float64
	}{
		{"relay RSS", 0, func(s SoakSample) float64 { return s.RSSMB }},
		{"slot retained WAL", soakWALFloorMB, func(s SoakSample) float64 { return s.RetainedWALMB }},
		{"deliveries' dead tuples", soakDeadFloor, func(s SoakSample) float64 { return float64(s.DeliveriesDead) }},
	} {
		if c.name == "deliveries' dead tuples" && !vacuumed {
			unjudged = append(unjudged, c.name+" (no autovacuum of postbox.deliveries yet)")
			continue
		}
		m, l := avg(mid, c.f), avg(last, c.f)
		if l > c.floor && l > soakGrowth*m {
			grew = append(grew, fmt.Sprintf("%s (%.1f → %.1f)", c.name, m, l))
		}
	}
	return grew, unjudged, true
}

// currentRSS reads VmRSS (resident set now) of a process, in MB; 0 when it
// cannot be read.
func currentRSS(pid int) float64 { return statusMB(pid, "VmRSS:") }

// err is the soak result's failure, or nil.
func (r *SoakResult) err() error {
	if len(r.Growing) == 0 {
		return nil
	}
	return fmt.Errorf("soak: %s %w", strings.Join(r.Growing, ", "), ErrUnbounded)
}
