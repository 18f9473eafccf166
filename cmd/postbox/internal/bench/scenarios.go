package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

func payload(i int) string {
	return fmt.Sprintf(`{"i":%d,"click_id":"clk_%d","payout":"1.00"}`, i, i)
}

// latency produces a paced stream over the endpoints; with hanging, one of
// them is the endpoint that never answers (its events are left out of the
// figures, which are the healthy endpoints').
func (e *env) latency(ctx context.Context, o Options, hanging bool) (*LatencyResult, error) {
	e.recv.reset()
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	// Measure the steady state: after a catch-up the walsender first
	// re-reads the WAL it retained, which says nothing about latency.
	if err := e.waitCaughtUp(ctx); err != nil {
		e.stopRelay()
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: latency, %d events/s over %d endpoints for %s (one hanging: %v)\n", o.Rate, o.Endpoints, o.Duration, hanging)
	interval := time.Second / time.Duration(o.Rate)
	total := int(o.Duration / interval)
	var sent atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	// Paced producer: each event its own single-row transaction, issued on
	// schedule by a small pool of workers so one slow commit does not
	// delay the next.
	jobs := make(chan int, 64)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				ep := fmt.Sprintf("ep-%d", i%o.Endpoints)
				if hanging && i%o.Endpoints == o.Endpoints-1 {
					ep = "hang"
				}
				_, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES ($1, $2)`, ep, payload(i))
				if err == nil && ep != "hang" {
					sent.Add(1)
				}
			}
		})
	}
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	err := waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) { return e.recv.distinct() >= int(sent.Load()), nil })
	rss := e.stopRelay()
	if err != nil {
		return nil, err
	}
	first, dups := e.recv.snapshot()
	lat, err := e.latencies(ctx, first)
	if err != nil {
		return nil, err
	}
	e.truncate(ctx, false)
	return &LatencyResult{
		Rate: o.Rate, Endpoints: o.Endpoints, Hanging: hanging, Sent: int(sent.Load()), Received: len(first),
		Lost: int(sent.Load()) - len(first), Dups: dups, BadSignatures: e.recv.scenarioBad(),
		P50ms: quantile(lat, 0.50), P90ms: quantile(lat, 0.90), P99ms: quantile(lat, 0.99), Maxms: quantile(lat, 1),
		RSSMB: rss,
	}, nil
}

// insertFlat inserts single-row transactions into table from o.Producers
// connections as fast as they commit, for d; it returns how many
// committed, and calls each (if not nil) after every commit.
func (e *env) insertFlat(ctx context.Context, o Options, table string, d time.Duration, each func()) int {
	var sent atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for w := range o.Producers {
		wg.Go(func() {
			for i := w; time.Now().Before(stop) && ctx.Err() == nil; i += o.Producers {
				_, err := e.pool.Exec(ctx, `INSERT INTO `+table+` (endpoint, payload) VALUES ($1, $2)`, fmt.Sprintf("ep-%d", i%o.Endpoints), payload(i))
				if err != nil {
					continue
				}
				sent.Add(1)
				if each != nil {
					each()
				}
			}
		})
	}
	wg.Wait()
	return int(sent.Load())
}

// load inserts as fast as o.Producers producers can while the relay runs,
// and samples the lag (committed but not yet received) every second: it
// must stay bounded. A run into an unpublished copy of the outbox first
// gives the machine's insert rate without the relay.
func (e *env) load(ctx context.Context, o Options) (*LoadResult, error) {
	e.recv.reset()
	res := &LoadResult{Producers: o.Producers, Endpoints: o.Endpoints, Seconds: o.Duration.Seconds()}
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: load, %d producers inserting for %s without the relay, then with it\n", o.Producers, o.Duration)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.bench_baseline (LIKE postbox.outbox INCLUDING ALL)`); err != nil {
		return nil, fmt.Errorf("create the baseline table: %w", err)
	}
	res.BaselinePerS = float64(e.insertFlat(ctx, o, "public.bench_baseline", o.Duration, nil)) / o.Duration.Seconds()
	_, _ = e.pool.Exec(ctx, `DROP TABLE public.bench_baseline`)
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	if err := e.waitCaughtUp(ctx); err != nil {
		e.stopRelay()
		return nil, err
	}
	var committed atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for range int(o.Duration / time.Second) {
			<-tick.C
			res.MaxLag = max(res.MaxLag, int(committed.Load())-e.recv.distinct())
		}
	}()
	start := time.Now()
	sent := e.insertFlat(ctx, o, "postbox.outbox", o.Duration, func() { committed.Add(1) })
	loadEnd := time.Now()
	<-sampled
	res.Sent = sent
	res.LagAtEnd = sent - e.recv.distinct()
	res.InsertsPerS = float64(sent) / loadEnd.Sub(start).Seconds()
	res.DeliveriesPerS = float64(e.recv.distinct()) / loadEnd.Sub(start).Seconds()
	err := waitFor(ctx, 5*time.Minute, 20*time.Millisecond, func() (bool, error) { return e.recv.distinct() >= sent, nil })
	res.DrainSeconds = time.Since(loadEnd).Seconds()
	res.RSSMB = e.stopRelay()
	if err != nil {
		return nil, err
	}
	first, dups := e.recv.snapshot()
	lat, err := e.latencies(ctx, first)
	if err != nil {
		return nil, err
	}
	res.P50ms, res.P99ms = quantile(lat, 0.50), quantile(lat, 0.99)
	res.Lost, res.Dups = sent-len(first), dups
	res.BadSignatures = e.recv.scenarioBad()
	e.truncate(ctx, false)
	return res, nil
}

// failing queues 200 events for an endpoint that answers only 500 and
// counts the requests it gets in 30 seconds: the breaker's saving.
func (e *env) failing(ctx context.Context) (*FailingResult, error) {
	e.recv.reset()
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintln(e.log, "bench: failing endpoint, 200 events queued for 30 s")
	if _, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint) SELECT 'fail' FROM generate_series(1, 200)`); err != nil {
		e.stopRelay()
		return nil, fmt.Errorf("queue events: %w", err)
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		e.stopRelay()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
	}
	res := &FailingResult{Queued: 200, Seconds: time.Since(start).Seconds(), Requests: e.recv.failed.Load()}
	_ = e.pool.QueryRow(ctx, `SELECT state, failure_threshold FROM postbox.endpoint_health WHERE endpoint = 'fail'`).Scan(&res.State, &res.Threshold)
	e.stopRelay()
	res.BadSignatures = e.recv.scenarioBad()
	e.truncate(ctx, true)
	return res, nil
}

// catchup queues o.Backlog events while the relay is down, then starts it
// and waits for every one of them.
func (e *env) catchup(ctx context.Context, o Options) (*CatchupResult, error) {
	e.recv.reset()
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: catch-up, queueing %d events while the relay is down\n", o.Backlog)
	for done := 0; done < o.Backlog; done += 1000 {
		_, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload)
			SELECT 'ep-' || (i % $2), jsonb_build_object('i', i, 'click_id', 'clk_' || i, 'payout', '1.00')
			FROM generate_series($1::int, $1::int + $3 - 1) i`, done, o.Endpoints, min(1000, o.Backlog-done))
		if err != nil {
			return nil, fmt.Errorf("queue the backlog: %w", err)
		}
	}
	start := time.Now()
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	err := waitFor(ctx, 10*time.Minute, 20*time.Millisecond, func() (bool, error) { return e.recv.distinct() >= o.Backlog, nil })
	elapsed := time.Since(start)
	rss := e.stopRelay()
	if err != nil {
		return nil, err
	}
	first, dups := e.recv.snapshot()
	var lo, hi time.Time
	for _, at := range first {
		if lo.IsZero() || at.Before(lo) {
			lo = at
		}
		if at.After(hi) {
			hi = at
		}
	}
	drain := hi.Sub(lo).Seconds()
	e.truncate(ctx, false)
	return &CatchupResult{
		Backlog: o.Backlog, Endpoints: o.Endpoints, Seconds: elapsed.Seconds(), DrainSeconds: drain,
		Rate: float64(len(first)) / elapsed.Seconds(), DrainRate: float64(len(first)) / drain,
		Lost: o.Backlog - len(first), Dups: dups, BadSignatures: e.recv.scenarioBad(), RSSMB: rss,
	}, nil
}
