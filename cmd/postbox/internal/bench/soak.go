package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// soakInterval is how often the soak scenario samples.
const soakInterval = 10 * time.Second

// soakRetention is the retention of events, deliveries, attempts and the
// outbox in the relay the soak runs: a few minutes, so that a healthy run
// purges as fast as it writes and its tables reach a steady state well
// within a 30-minute soak. soakRetentionRound is how often the relay's
// leader purges (relay/internal/maintain's RetentionIntervalDefault, which
// the bench cannot import): a row past its retention is gone a round
// later at most.
const (
	soakRetention      = 2 * time.Minute
	soakRetentionRound = time.Minute
)

// soakWarmUp is when the soak starts judging. The rows of the first
// retention are purged within a round after it, and the space they free
// is reused only once autovacuum has been through the table: until about
// a retention later, tables can only grow.
const soakWarmUp = 2*soakRetention + soakRetentionRound

// soakMinJudged is how many samples after soakWarmUp a fit needs: five
// minutes, five purge rounds, so that one tooth of a purge's sawtooth
// cannot pass for a slope. A soak shorter than 10 minutes is not judged.
const soakMinJudged = 30

// The soak's thresholds: a figure grows without bound when the lower end
// of its slope's 95% confidence interval is above its threshold, per hour.
// The table, index and dead-tuple thresholds are for soakThresholdRate
// events/s and scale with the rate above it (a purge that falls behind by
// a fixed share leaves rows in proportion to the rate).
const (
	// A relay that leaked 5 MB an hour would hold 120 MB more a day; below
	// that a 30-minute fit cannot tell a leak from the Go heap's drift.
	soakRSSPerHourMB = 5
	// An events or deliveries table that nothing purged would grow by
	// hundreds of MB an hour at 200 events/s; 10 MB/h is a purge that
	// leaves a few percent of its rows behind, or bloat that vacuum does
	// not reuse.
	soakRelationPerHourMB = 10
	// Two WAL segments an hour: a slot whose restart position follows its
	// confirmed position retains a few segments, whatever the hour.
	soakWALPerHourMB = 32
	// At 200 events/s the relay leaves millions of dead tuples an hour
	// (720,000 events, each delivery's updates, each purge's deletes);
	// 100,000 an hour is autovacuum falling a few percent behind.
	soakDeadPerHour   = 100000
	soakThresholdRate = 200
)

// ErrUnbounded is returned by Run, with the figures, when a soak figure
// grew without bound.
var ErrUnbounded = errors.New("grew without bound")

// SoakResult is the soak scenario's.
type SoakResult struct {
	Rate          int          `json:"rate_per_s"`
	Endpoints     int          `json:"endpoints"`
	Seconds       float64      `json:"seconds"`
	RetentionS    float64      `json:"retention_s"`
	FromS         float64      `json:"judged_from_s"`
	Samples       []SoakSample `json:"samples"`
	Sent          int          `json:"sent"`
	FailedInserts int          `json:"failed_inserts"`
	Lost          int          `json:"lost"`
	Dups          int          `json:"duplicates"`
	BadSignatures int          `json:"bad_signatures"`
	// Slopes are each figure's least-squares slope over the samples after
	// FromS; Judged is false when there were fewer than soakMinJudged of
	// them.
	Slopes []SoakSlope `json:"slopes,omitempty"`
	Judged bool        `json:"judged"`
}

// SoakSample is one of the soak scenario's samples.
type SoakSample struct {
	AtSeconds         float64 `json:"at_s"`
	RSSMB             float64 `json:"relay_rss_mb"`
	TablesMB          float64 `json:"postbox_tables_mb"`
	DeadTuples        int64   `json:"postbox_dead_tuples"`
	DeliveriesVacuum  string  `json:"deliveries_last_autovacuum,omitempty"`
	RetainedWALMB     float64 `json:"slot_retained_wal_mb"`
	PendingDeliveries int     `json:"pending_at_receiver"`
	// Relations are each postbox table's size (pg_table_size: heap, TOAST
	// and maps) and the size of its indexes (pg_indexes_size), in MB, by
	// "table" and "table indexes".
	Relations map[string]float64 `json:"relations_mb"`
}

// SoakSlope is one figure's fitted growth, per hour.
type SoakSlope struct {
	Figure    string  `json:"figure"`
	Unit      string  `json:"unit"`
	PerHour   float64 `json:"per_hour"`
	CI95      float64 `json:"ci95_per_hour"` // half the 95% interval's width
	Threshold float64 `json:"threshold_per_hour"`
	Samples   int     `json:"samples"`
	Growing   bool    `json:"growing"`
}

// soakConfig is the relay's configuration for the soak: the bench's
// endpoints, every retention soakRetention.
func (e *env) soakConfig(endpoints int) string {
	r := soakRetention.String()
	return e.config(endpoints) + fmt.Sprintf("outbox_retention: %s\nevent_retention: %s\ndelivery_retention: %s\nattempt_retention: %s\n", r, r, r, r)
}

// soak produces a steady stream for o.Duration with one relay whose
// retentions are soakRetention and samples its RSS, postbox's tables and
// indexes, dead tuples and the slot's retained WAL every soakInterval.
func (e *env) soak(ctx context.Context, o Options) (*SoakResult, error) {
	led := e.recv.reset()
	res := &SoakResult{Rate: o.Rate, Endpoints: o.Endpoints, Seconds: o.Duration.Seconds(), RetentionS: soakRetention.Seconds(), FromS: soakWarmUp.Seconds()}
	cfgPath := filepath.Join(filepath.Dir(e.cfgPath), "soak.yaml")
	if err := os.WriteFile(cfgPath, []byte(e.soakConfig(o.Endpoints)), 0o600); err != nil {
		return nil, fmt.Errorf("write the soak's config: %w", err)
	}
	if err := e.startRelayWith(ctx, cfgPath); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: soak, %d events/s over %d endpoints for %s, retentions %s, sampling every %s\n", o.Rate, o.Endpoints, o.Duration, soakRetention, soakInterval)
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
			s := e.soakSample(ctx, led.pending())
			s.AtSeconds, s.RSSMB = time.Since(began).Seconds(), currentRSS(e.relay.Process.Pid)
			fmt.Fprintf(e.log, "bench: soak %5.0fs rss %.0f MB, tables %.1f MB, dead tuples %d, retained WAL %.1f MB, pending %d\n",
				s.AtSeconds, s.RSSMB, s.TablesMB, s.DeadTuples, s.RetainedWALMB, s.PendingDeliveries)
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
	res.Slopes, res.Judged = judgeSoak(res.Samples, soakWarmUp.Seconds(), o.Rate)
	e.truncate(ctx, false)
	return res, nil
}

// soakSample reads postbox's tables, dead tuples, deliveries' last
// autovacuum and the slot's retained WAL; what it cannot read stays 0.
func (e *env) soakSample(ctx context.Context, pending int) SoakSample {
	s := SoakSample{PendingDeliveries: pending, Relations: map[string]float64{}}
	rows, err := e.pool.Query(ctx, `
		SELECT c.relname, pg_table_size(c.oid)::float8 / 1048576, pg_indexes_size(c.oid)::float8 / 1048576,
		       coalesce(st.n_dead_tup, 0), st.last_autovacuum
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
		WHERE n.nspname = 'postbox' AND c.relkind IN ('r', 'p')`)
	if err == nil {
		for rows.Next() {
			var name string
			var table, indexes float64
			var dead int64
			var vac *time.Time
			if rows.Scan(&name, &table, &indexes, &dead, &vac) != nil {
				continue
			}
			s.Relations[name], s.Relations[name+" indexes"] = table, indexes
			s.TablesMB += table + indexes
			s.DeadTuples += dead
			if name == "deliveries" && vac != nil {
				s.DeliveriesVacuum = vac.UTC().Format(time.RFC3339)
			}
		}
		rows.Close()
	}
	_ = e.pool.QueryRow(ctx, `SELECT coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM pg_replication_slots WHERE slot_name = $1), 0)::float8 / 1048576`,
		e.slot).Scan(&s.RetainedWALMB)
	return s
}

// judgeSoak fits each figure's slope over the samples from fromS on and
// judges it against its threshold; it needs soakMinJudged samples.
func judgeSoak(samples []SoakSample, fromS float64, rate int) ([]SoakSlope, bool) {
	var judged []SoakSample
	for _, s := range samples {
		if s.AtSeconds >= fromS {
			judged = append(judged, s)
		}
	}
	if len(judged) < soakMinJudged {
		return nil, false
	}
	scale := max(1, float64(rate)/soakThresholdRate)
	type figure struct {
		name, unit string
		threshold  float64
		f          func(SoakSample) float64
	}
	figures := []figure{
		{"relay RSS", "MB", soakRSSPerHourMB, func(s SoakSample) float64 { return s.RSSMB }},
		{"slot retained WAL", "MB", soakWALPerHourMB, func(s SoakSample) float64 { return s.RetainedWALMB }},
		{"dead tuples", "tuples", soakDeadPerHour * scale, func(s SoakSample) float64 { return float64(s.DeadTuples) }},
	}
	seen := map[string]bool{}
	for _, s := range judged {
		for name := range s.Relations {
			if !seen[name] {
				seen[name] = true
				figures = append(figures, figure{"postbox." + name, "MB", soakRelationPerHourMB * scale, func(s SoakSample) float64 { return s.Relations[name] }})
			}
		}
	}
	// Relations in a fixed order after the three others.
	rel := figures[3:]
	sortFigures := func(a, b figure) int { return strings.Compare(a.name, b.name) }
	slices.SortFunc(rel, sortFigures)
	x, y := make([]float64, len(judged)), make([]float64, len(judged))
	for i, s := range judged {
		x[i] = s.AtSeconds / 3600
	}
	var out []SoakSlope
	for _, f := range figures {
		for i, s := range judged {
			y[i] = f.f(s)
		}
		slope, se := fitSlope(x, y)
		ci := tQuantile975(len(x)-2) * se
		out = append(out, SoakSlope{Figure: f.name, Unit: f.unit, PerHour: slope, CI95: ci, Threshold: f.threshold,
			Samples: len(x), Growing: slope-ci > f.threshold})
	}
	return out, true
}

// fitSlope is the least-squares slope of y against x and its standard
// error; both 0 with fewer than three points or no spread in x.
func fitSlope(x, y []float64) (slope, se float64) {
	n := float64(len(x))
	if len(x) < 3 || len(x) != len(y) {
		return 0, 0
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx, my = mx/n, my/n
	var sxx, sxy float64
	for i := range x {
		sxx += (x[i] - mx) * (x[i] - mx)
		sxy += (x[i] - mx) * (y[i] - my)
	}
	if sxx == 0 {
		return 0, 0
	}
	slope = sxy / sxx
	var sse float64
	for i := range x {
		r := y[i] - my - slope*(x[i]-mx)
		sse += r * r
	}
	return slope, math.Sqrt(sse / (n - 2) / sxx)
}

// t975 is Student's t distribution's 97.5% quantile for 1…30 degrees of
// freedom: a two-sided 95% interval.
var t975 = [...]float64{
	12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
}

// tQuantile975 is t975 for df degrees of freedom, read from the table to
// 30 and conservatively in steps beyond (2.021 at 40, 2.000 at 60, 1.980
// at 120, 1.960 beyond).
func tQuantile975(df int) float64 {
	switch {
	case df < 1:
		return math.Inf(1)
	case df <= len(t975):
		return t975[df-1]
	case df < 40:
		return t975[len(t975)-1]
	case df < 60:
		return 2.021
	case df < 120:
		return 2.000
	case df < 1000:
		return 1.980
	}
	return 1.960
}

// currentRSS reads VmRSS (resident set now) of a process, in MB; 0 when it
// cannot be read.
func currentRSS(pid int) float64 { return statusMB(pid, "VmRSS:") }

// err is the soak result's failure, or nil.
func (r *SoakResult) err() error {
	var grew []string
	for _, s := range r.Slopes {
		if s.Growing {
			grew = append(grew, fmt.Sprintf("%s (%+.3g ± %.3g %s/h, threshold %.3g)", s.Figure, s.PerHour, s.CI95, s.Unit, s.Threshold))
		}
	}
	if len(grew) == 0 {
		return nil
	}
	return fmt.Errorf("soak: %s %w", strings.Join(grew, ", "), ErrUnbounded)
}
