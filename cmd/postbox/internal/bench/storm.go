package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// Defaults of the storm scenario's options.
const (
	// StormDefault is how many failing endpoints the storm scenario adds.
	StormDefault = 10000
	// StormRateDefault is the storm's fresh failing events a second
	// during the measured run: a quarter of the healthy rate, so that
	// what the run measures is the retries (the seeded event of each
	// failing endpoint retried throughout, and fresh ones entering their
	// retries continuously), not the ingest of more events than the
	// healthy endpoints get. A CPU ratio of 1.5 leaves the whole storm
	// half of what the healthy events cost; at 500 a second (2.5 times
	// the healthy rate) each fresh event, which is written, streamed,
	// ingested and attempted as a healthy one is, would have to cost a
	// fifth of one before a single retry (docs/benchmarks.md).
	StormRateDefault = 50
)

// stormTicks is how many transactions a second the storm's fresh events
// are written in.
const stormTicks = 10

// StormResult is the storm scenario's: the latency scenario run twice,
// once alone and once beside a storm of failing partners, endpoints whose
// targets refuse connections, each given an event just before the run
// (their retries come due over the run, their breakers stay closed) and
// fresh events arriving for them while it lasts.
type StormResult struct {
	Failing int `json:"failing_endpoints"`
	// Rate is the fresh failing events a second during the run.
	Rate int `json:"failing_events_per_s"`
	// Seeded and Sent are the failing events written before the run and
	// during it; Attempts the failed attempts made to them meanwhile;
	// Opened the failing endpoints' breakers open at the end.
	Seeded   int   `json:"failing_events_seeded"`
	Sent     int   `json:"failing_events_sent"`
	Attempts int64 `json:"failing_attempts"`
	Opened   int   `json:"failing_breakers_open"`
	// Lost is the failing events that are neither in the outbox nor held
	// by the relay (a delivery in any state, or a range under way).
	Lost   int            `json:"failing_events_lost"`
	Alone  *LatencyResult `json:"without_storm"`
	Beside *LatencyResult `json:"beside_storm"`
}

// storm measures what a storm of failing partners costs the healthy
// endpoints: their latency, and PostgreSQL's CPU per healthy event.
func (e *env) storm(ctx context.Context, o Options) (*StormResult, error) {
	res := &StormResult{Failing: o.Storm, Rate: o.StormRate}
	var err error
	if res.Alone, err = e.stormLatency(ctx, o, nil); err != nil {
		return nil, err
	}
	port, err := pgtest.FreePort() // nothing listens: connections are refused
	if err != nil {
		return nil, err
	}
	s := &stormLoad{endpoints: o.Storm, rate: o.StormRate, url: fmt.Sprintf("http://127.0.0.1:%d/gone", port)}
	fmt.Fprintf(e.log, "bench: storm, %d endpoints refusing connections, an event each and %d more a second\n", o.Storm, o.StormRate)
	if res.Beside, err = e.stormLatency(ctx, o, s); err != nil {
		return nil, err
	}
	res.Seeded, res.Sent, res.Attempts, res.Opened, res.Lost = s.seeded, len(s.ids)-s.seeded, s.attempts, s.opened, s.lost
	return res, nil
}

// stormLoad is the failing partners' events: written, and what became of
// them.
type stormLoad struct {
	endpoints, rate int
	url             string
	mu              sync.Mutex
	ids             []string // every failing event committed
	seeded, next    int
	attempts        int64
	opened, lost    int
}

// write commits n failing events in one transaction, round robin over
// the failing endpoints.
func (s *stormLoad) write(ctx context.Context, e *env, n int) error {
	s.mu.Lock()
	first := s.next
	s.next += n
	s.mu.Unlock()
	rows, err := e.pool.Query(ctx, `INSERT INTO postbox.outbox (endpoint, url, payload)
		SELECT 'storm-' || (i % $2), $3, jsonb_build_object('i', i)
		FROM generate_series($1::int, $1::int + $4 - 1) i
		RETURNING event_id::text`, first, s.endpoints, s.url, n)
	if err != nil {
		return fmt.Errorf("write failing events: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("write failing events: %w", err)
	}
	s.mu.Lock()
	s.ids = append(s.ids, ids...)
	s.mu.Unlock()
	return nil
}

// run writes s.rate failing events a second, in stormTicks transactions,
// until stop closes.
func (s *stormLoad) run(ctx context.Context, e *env, stop <-chan struct{}) {
	tick := time.NewTicker(time.Second / stormTicks)
	defer tick.Stop()
	carry := 0
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		carry += s.rate
		if n := carry / stormTicks; n > 0 {
			carry -= n * stormTicks
			if err := s.write(ctx, e, n); err != nil && ctx.Err() == nil {
				fmt.Fprintf(e.log, "bench: storm: %v\n", err)
			}
		}
	}
}

// account counts, once the relay has stopped, the failed attempts made to
// the failing endpoints, their open breakers, and the failing events
// that are neither in the outbox nor held by the relay.
func (s *stormLoad) account(ctx context.Context, e *env) error {
	err := e.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM postbox.all_attempts WHERE endpoint LIKE 'storm-%'),
		       (SELECT count(*) FROM postbox.endpoint_health WHERE endpoint LIKE 'storm-%' AND state <> 'closed'),
		       (SELECT count(*) FROM unnest($1::uuid[]) AS c(id)
		        WHERE NOT EXISTS (SELECT 1 FROM postbox.outbox o WHERE o.event_id = c.id)
		          AND NOT EXISTS (SELECT 1 FROM postbox.events ev
		                          WHERE ev.event_id = c.id
		                            AND (EXISTS (SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = ev.id)
		                                 OR EXISTS (SELECT 1 FROM postbox.under_way u WHERE ev.id BETWEEN u.first_event AND u.last_event))))`,
		s.ids).Scan(&s.attempts, &s.opened, &s.lost)
	if err != nil {
		return fmt.Errorf("account for the failing events: %w", err)
	}
	return nil
}

// stormLatency is the latency scenario (see latency), with s beside it
// when not nil: its seed is written once the relay has caught up, before
// the warm-up, and its fresh events from the warm-up until the healthy
// events have arrived.
func (e *env) stormLatency(ctx context.Context, o Options, s *stormLoad) (*LatencyResult, error) {
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	if err := e.waitCaughtUp(ctx); err != nil {
		e.stopRelay()
		return nil, err
	}
	stop := make(chan struct{})
	var storming sync.WaitGroup
	if s != nil {
		for done := 0; done < s.endpoints; done += 1000 {
			if err := s.write(ctx, e, min(1000, s.endpoints-done)); err != nil {
				e.stopRelay()
				return nil, err
			}
		}
		s.seeded = len(s.ids)
		storming.Go(func() { s.run(ctx, e, stop) })
	}
	warm := e.warmUp(ctx, o, "postbox.outbox", false)
	e.waitIngested(ctx, warm.ids)
	led := e.recv.reset()
	fmt.Fprintf(e.log, "bench: storm, %d events/s over %d healthy endpoints for %s (storm: %v)\n", o.Rate, o.Endpoints, o.Duration, s != nil)
	from, fromSplit := e.read(ctx), scrapeSplit(ctx, e.admin)
	e.pace(ctx, o, "postbox.outbox", led, false)
	if _, _, err := e.resolve(ctx, led, "postbox.outbox"); err != nil {
		close(stop)
		storming.Wait()
		e.stopRelay()
		return nil, err
	}
	waited := waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	split := splitBetween(fromSplit, scrapeSplit(ctx, e.admin))
	close(stop)
	storming.Wait()
	to, rss, err := e.endRun(ctx, waited)
	if err != nil {
		return nil, err
	}
	if s != nil {
		if err := s.account(ctx, e); err != nil {
			return nil, err
		}
	}
	t := led.tally()
	lat, err := e.latencies(ctx, t.first)
	if err != nil {
		return nil, err
	}
	e.truncate(ctx, true)
	res := &LatencyResult{
		Rate: o.Rate, Endpoints: o.Endpoints, Sent: t.sent, Received: t.received, Measured: len(lat),
		Lost: t.lost, Dups: t.dups, Unacknowledged: t.unacknowledged, BadSignatures: e.recv.scenarioBad(),
		P50ms: quantile(lat, 0.50), P90ms: quantile(lat, 0.90), P99ms: quantile(lat, 0.99), Maxms: quantile(lat, 1),
		RSSMB: rss, Costs: e.costs(ctx, from, to, t.sent), Split: split,
	}
	warm.add(res)
	return res, nil
}

// lost is the healthy events lost in either run and the failing events
// lost.
func (r *StormResult) lost() int {
	if r == nil {
		return 0
	}
	return r.Alone.Lost + r.Beside.Lost + r.Lost
}

// print writes the storm's figures: the healthy endpoints' alone, then
// beside the storm, and the ratios the scenario is judged by.
func (r *StormResult) print(w io.Writer) {
	if r == nil {
		return
	}
	for i, l := range []*LatencyResult{r.Alone, r.Beside} {
		if i == 0 {
			fmt.Fprintf(w, "\nstorm: commit → receiver latency at %d events/s over %d healthy endpoints, alone%s:\n", l.Rate, l.Endpoints, l.warmedUp())
		} else {
			fmt.Fprintf(w, "\nthe same beside a storm of %d endpoints refusing connections (an event each, then %d a second; %d failed attempts, %d breakers open at the end, failing events lost %d of %d):\n",
				r.Failing, r.Rate, r.Attempts, r.Opened, r.Lost, r.Seeded+r.Sent)
		}
		fmt.Fprintf(w, "  p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms\n", l.P50ms, l.P90ms, l.P99ms, l.Maxms)
		fmt.Fprintf(w, "  sent %d, received %d, lost %d, duplicates %d%s; relay peak RSS %.0f MB\n", l.Sent, l.Received, l.Lost, l.Dups, anomalies(l.Unacknowledged, l.BadSignatures), l.RSSMB)
		l.Split.print(w)
		l.Costs.print(w)
	}
	fmt.Fprintf(w, "  storm / alone: healthy p99 %s (target ≤ 2), PostgreSQL CPU per healthy event %s (target ≤ 1.5)\n",
		ratio(r.Beside.P99ms, r.Alone.P99ms), ratio(cpuOf(r.Beside), cpuOf(r.Alone)))
}

// cpuOf is PostgreSQL's CPU per 1,000 events of a run; 0 when unmeasured.
func cpuOf(l *LatencyResult) float64 {
	if l == nil || l.Costs == nil {
		return 0
	}
	return l.Costs.PostgresCPUms
}

// ratio prints a / b, or "n/a" when b was not measured.
func ratio(a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
