package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/outbox"
)

// insertSQL inserts one event, its id given, into the outbox (or a copy of
// it); the Exec returns only once the implicit transaction's commit has
// been acknowledged. The id is the producer's so that an insert that
// errored or timed out, which may have committed all the same, can be
// looked up afterwards (env.resolve).
const insertSQL = ` (event_id, endpoint, payload) VALUES ($1, $2, $3)`

// produce writes event i for ep in its own transaction: a row of table,
// or with o.Emit a message as outbox.Emit writes it (table is then not
// used). It returns once the commit is acknowledged, and the event's id
// whether or not it did.
func (e *env) produce(ctx context.Context, o Options, table, ep string, i int) (string, error) {
	if o.Emit {
		msg, id, err := outbox.EncodeMessage(outbox.Event{Endpoint: ep, Payload: []byte(payload(i))}, time.Now())
		if err != nil {
			return "", err
		}
		prefix := outbox.MessagePrefix
		if table != "postbox.outbox" {
			prefix = "bench_baseline" // the load scenario's baseline: not for the relay
		}
		_, err = e.pool.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, prefix, msg)
		return id, err
	}
	id := outbox.NewEventID()
	_, err := e.pool.Exec(ctx, `INSERT INTO `+table+insertSQL, id, ep, payload(i))
	return id, err
}

// resolve looks up the inserts of led that errored or timed out (ledger.doubt)
// in table and, for the outbox, postbox.events (an ingest with
// outbox_retention 0 deletes the row it ingests): one found committed is
// expected like any other, one not found never committed. It returns how
// many were looked up and how many had committed. An emitted message is in
// postbox.events only once ingested: resolve it after the relay caught up.
func (e *env) resolve(ctx context.Context, led *ledger, table string) (doubted, committed int, err error) {
	ids := led.doubted()
	if len(ids) == 0 {
		return 0, 0, nil
	}
	q := `SELECT event_id::text FROM ` + table + ` WHERE event_id = ANY($1::uuid[])`
	if table == "postbox.outbox" {
		q += ` UNION SELECT event_id::text FROM postbox.events WHERE event_id = ANY($1::uuid[])`
	}
	var found []string
	_ = waitFor(ctx, 30*time.Second, 200*time.Millisecond, func() (bool, error) {
		var rows pgx.Rows
		if rows, err = e.pool.Query(ctx, q, ids); err == nil {
			found, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		return err == nil, nil // the server may still be coming back
	})
	if err != nil {
		return len(ids), 0, fmt.Errorf("look up the inserts that errored: %w", err)
	}
	led.commit(found...)
	return len(ids), len(found), nil
}

func payload(i int) string {
	return fmt.Sprintf(`{"i":%d,"click_id":"clk_%d","payout":"1.00"}`, i, i)
}

// latency produces a paced stream over the endpoints; with hanging, one of
// them is the endpoint that never answers (its events are left out of the
// figures, which are the healthy endpoints').
func (e *env) latency(ctx context.Context, o Options, hanging bool) (*LatencyResult, error) {
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	// Measure the steady state: after a catch-up the walsender first
	// re-reads the WAL it retained, which says nothing about latency.
	if err := e.waitCaughtUp(ctx); err != nil {
		e.stopRelay()
		return nil, err
	}
	warm := e.warmUp(ctx, o, "postbox.outbox", hanging)
	// The relay counts a row in its histograms as it ingests it, which
	// can be after the row's delivery: none of the warm-up's may fall in
	// the run's split.
	e.waitIngested(ctx, warm.ids)
	led := e.recv.reset()
	fmt.Fprintf(e.log, "bench: latency, %d events/s over %d endpoints for %s (one hanging: %v)\n", o.Rate, o.Endpoints, o.Duration, hanging)
	from, fromSplit := e.read(ctx), scrapeSplit(ctx, e.admin)
	e.pace(ctx, o, "postbox.outbox", led, hanging)
	if _, _, err := e.resolve(ctx, led, "postbox.outbox"); err != nil {
		e.stopRelay()
		return nil, err
	}
	waited := waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	split := splitBetween(fromSplit, scrapeSplit(ctx, e.admin))
	to, rss, err := e.endRun(ctx, waited)
	if err != nil {
		return nil, err
	}
	t := led.tally()
	lat, err := e.latencies(ctx, t.first)
	if err != nil {
		return nil, err
	}
	e.dumpWALRecords(ctx, walRecordsFile, "latency", from.wal, to.wal, t.sent)
	e.truncate(ctx, false)
	res := &LatencyResult{
		Rate: o.Rate, Endpoints: o.Endpoints, Hanging: hanging, Sent: t.sent, Received: t.received, Measured: len(lat),
		Lost: t.lost, Dups: t.dups, Unacknowledged: t.unacknowledged, BadSignatures: e.recv.scenarioBad(),
		P50ms: quantile(lat, 0.50), P90ms: quantile(lat, 0.90), P99ms: quantile(lat, 0.99), Maxms: quantile(lat, 1),
		RSSMB: rss, Costs: e.costs(ctx, from, to, t.sent), Split: split,
	}
	warm.add(res)
	return res, nil
}

// warmup is what a latency scenario's warm-up sent, and what of it went
// wrong.
type warmup struct {
	seconds                     float64
	sent, lost, dups, signature int
	ids                         []string // of the events delivered
}

// warmUp produces at the scenario's rate for o.Warmup before it measures,
// to a ledger of its own, and waits until those events have arrived.
// Once started, a relay (or the floor's bare client) and its walsender
// first plan their statements, fill their caches and open their
// connections, which one that has run for a while has done: without a
// warm-up, at 200 events/s the events of the run's first 150 ms took 3–30
// ms, half of its slowest 1%, where the rest's p99 was 2.9 ms. The
// warm-up's events are checked for loss, duplicates and signatures as
// the run's are.
func (e *env) warmUp(ctx context.Context, o Options, table string, hanging bool) warmup {
	if o.Warmup <= 0 {
		return warmup{}
	}
	led := e.recv.reset()
	w := o
	w.Duration = o.Warmup
	e.pace(ctx, w, table, led, hanging)
	_, _, _ = e.resolve(ctx, led, table) // one not found is a loss of the warm-up's
	_ = waitFor(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	t := led.tally()
	return warmup{seconds: o.Warmup.Seconds(), sent: t.sent, lost: t.lost, dups: t.dups, signature: e.recv.scenarioBad(),
		ids: slices.Collect(maps.Keys(t.first))}
}

// waitIngested waits (up to 10 s) until the relay has ingested the events
// ids.
func (e *env) waitIngested(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	_ = waitFor(ctx, 10*time.Second, 20*time.Millisecond, func() (bool, error) {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.events WHERE event_id = ANY($1::uuid[])`, ids).Scan(&n)
		return n == len(ids), err
	})
}

// add counts the warm-up into a result.
func (w warmup) add(r *LatencyResult) {
	r.WarmupSeconds, r.WarmupSent = w.seconds, w.sent
	r.Lost += w.lost
	r.Dups += w.dups
	r.BadSignatures += w.signature
}

// pace produces o.Rate events a second for o.Duration into table, round
// robin over the endpoints, each its own single-row transaction, and records each
// committed id in led; with hanging, the last endpoint's events go to the
// endpoint that never answers and are not recorded. It returns when the
// last commit has been acknowledged.
func (e *env) pace(ctx context.Context, o Options, table string, led *ledger, hanging bool) {
	interval := time.Second / time.Duration(o.Rate)
	total := int(o.Duration / interval)
	var wg sync.WaitGroup
	start := time.Now()
	// Issued on schedule by a small pool of workers, so one slow commit
	// does not delay the next.
	jobs := make(chan int, 64)
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				ep := fmt.Sprintf("ep-%d", i%o.Endpoints)
				if hanging && i%o.Endpoints == o.Endpoints-1 {
					ep = "hang"
				}
				id, err := e.produce(ctx, o, table, ep, i)
				switch {
				case ep == "hang":
				case err != nil:
					led.doubt(id)
				default:
					led.commit(id)
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
}

// insertFlat inserts single-row transactions into table from o.Producers
// connections as fast as they commit, for d; it returns how many
// committed, and calls each (if not nil) with every event's id and its
// insert's error.
func (e *env) insertFlat(ctx context.Context, o Options, table string, d time.Duration, each func(id string, err error)) int {
	var sent atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for w := range o.Producers {
		wg.Go(func() {
			for i := w; time.Now().Before(stop) && ctx.Err() == nil; i += o.Producers {
				id, err := e.produce(ctx, o, table, fmt.Sprintf("ep-%d", i%o.Endpoints), i)
				if each != nil {
					each(id, err)
				}
				if err == nil {
					sent.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(sent.Load())
}

// produceFlat inserts into table as fast as o.Producers producers can for
// o.Duration, each committed id into led, and samples the lag (committed,
// not yet received) every second meanwhile. It sets res's Sent, rates and
// lags, and the moment the load ended.
func (e *env) produceFlat(ctx context.Context, o Options, table string, led *ledger, res *LoadResult) {
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for range int(o.Duration / time.Second) {
			select {
			case <-tick.C:
			case <-ctx.Done(): // the producers stop too
				return
			}
			res.MaxLag = max(res.MaxLag, led.pending())
		}
	}()
	start := time.Now()
	res.Sent = e.insertFlat(ctx, o, table, o.Duration, func(id string, err error) {
		if err != nil {
			led.doubt(id)
			return
		}
		led.commit(id)
	})
	res.loadEnd = time.Now()
	<-sampled
	res.LagAtEnd = led.pending()
	res.InsertsPerS = float64(res.Sent) / res.loadEnd.Sub(start).Seconds()
	res.DeliveriesPerS = float64(led.received()) / res.loadEnd.Sub(start).Seconds()
}

// load inserts as fast as o.Producers producers can while the relay runs,
// and samples the lag (committed but not yet received) every second: it
// must stay bounded. A run into an unpublished copy of the outbox first
// gives the machine's insert rate without the relay.
func (e *env) load(ctx context.Context, o Options) (*LoadResult, error) {
	led := e.recv.reset()
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
	cfg, err := e.weighedConfig(o.WalsenderNice)
	if err != nil {
		return nil, err
	}
	if err := e.startRelayWith(ctx, cfg); err != nil {
		return nil, err
	}
	if err := e.waitCaughtUp(ctx); err != nil {
		e.stopRelay()
		return nil, err
	}
	if o.WalsenderNice != 0 {
		if err := e.checkWeighed(ctx, o.WalsenderNice); err != nil {
			e.stopRelay()
			return nil, err
		}
		res.WalsenderNice = o.WalsenderNice
	}
	from, fromSplit := e.read(ctx), scrapeSplit(ctx, e.admin)
	e.produceFlat(ctx, o, "postbox.outbox", led, res)
	if _, _, err := e.resolve(ctx, led, "postbox.outbox"); err != nil {
		e.stopRelay()
		return nil, err
	}
	sent := res.Sent
	err = waitFor(ctx, 5*time.Minute, 20*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	res.DrainSeconds = time.Since(res.loadEnd).Seconds()
	res.Split = splitBetween(fromSplit, scrapeSplit(ctx, e.admin))
	to, rss, err := e.endRun(ctx, err)
	if err != nil {
		return nil, err
	}
	res.RSSMB = rss
	res.Costs = e.costs(ctx, from, to, sent)
	t := led.tally()
	lat, err := e.latencies(ctx, t.first)
	if err != nil {
		return nil, err
	}
	res.P50ms, res.P99ms = quantile(lat, 0.50), quantile(lat, 0.99)
	res.Over50ms = shareOver(lat, 50)
	res.Lost, res.Dups, res.Unacknowledged = t.lost, t.dups, t.unacknowledged
	res.Received, res.Measured = t.received, len(lat)
	res.BadSignatures = e.recv.scenarioBad()
	e.dumpWALRecords(ctx, walRecordsFile, "load", from.wal, to.wal, sent)
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

// endRun ends a scenario's run of the relay once waiting for its events
// returned waitErr: it reads the counters while the relay's CPU time can
// still be read, stops the relay (returning its peak RSS) and, unless the
// wait failed, lets the relay's statistics settle for written.
func (e *env) endRun(ctx context.Context, waitErr error) (to meter, rssMB float64, err error) {
	to = e.read(ctx)
	rssMB = e.stopRelay()
	if waitErr != nil {
		return to, rssMB, waitErr
	}
	e.settle(ctx)
	return to, rssMB, nil
}

// catchupBulkRows is the rows of each of catchup-bulk's transactions.
const catchupBulkRows = 1000

// catchup queues o.Backlog events while the relay is down, then starts it
// and waits for every one of them. The backlog is written one event a
// transaction by o.Producers producers (perTx 1: as an application commits
// its events), or in transactions of perTx rows one after the other,
// which the relay ingests by its bulk-copy path.
func (e *env) catchup(ctx context.Context, o Options, perTx int) (*CatchupResult, error) {
	led := e.recv.reset()
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	res := &CatchupResult{Backlog: o.Backlog, Endpoints: o.Endpoints, EventsPerTransaction: perTx, Producers: 1}
	if perTx == 1 {
		res.Producers = o.Producers
	}
	fmt.Fprintf(e.log, "bench: %s, queueing %d events while the relay is down, %s\n", res.name(), o.Backlog, res.written())
	if perTx == 1 {
		e.queueEach(ctx, o, led)
	} else {
		for done := 0; done < o.Backlog; done += perTx {
			if err := e.queue(ctx, o, led, done, min(perTx, o.Backlog-done)); err != nil {
				return nil, err
			}
		}
	}
	e.settle(ctx)
	from := e.read(ctx)
	start := time.Now()
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	err := waitFor(ctx, 10*time.Minute, 20*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	if err == nil {
		// An insert that errored may have committed (an emitted message
		// is found only once ingested): those found are waited for too.
		var found int
		if _, found, err = e.resolve(ctx, led, "postbox.outbox"); err == nil && found > 0 {
			err = waitFor(ctx, time.Minute, 20*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
		}
	}
	elapsed := time.Since(start)
	to, rss, err := e.endRun(ctx, err)
	if err != nil {
		return nil, err
	}
	t := led.tally()
	var lo, hi time.Time
	for _, at := range t.first {
		if lo.IsZero() || at.Before(lo) {
			lo = at
		}
		if at.After(hi) {
			hi = at
		}
	}
	drain := hi.Sub(lo).Seconds()
	e.dumpWALRecords(ctx, walRecordsFile, res.name(), from.wal, to.wal, t.received)
	e.truncate(ctx, false)
	res.Seconds, res.DrainSeconds = elapsed.Seconds(), drain
	res.Rate, res.DrainRate = float64(t.received)/elapsed.Seconds(), float64(t.received)/drain
	res.Lost, res.Dups, res.Unacknowledged, res.BadSignatures, res.RSSMB = t.lost, t.dups, t.unacknowledged, e.recv.scenarioBad(), rss
	res.Costs = e.costs(ctx, from, to, t.received)
	return res, nil
}

// name is the scenario's name.
func (c *CatchupResult) name() string {
	if c.EventsPerTransaction > 1 {
		return "catchup-bulk"
	}
	return "catchup"
}

// written says how the backlog was written.
func (c *CatchupResult) written() string {
	if c.EventsPerTransaction > 1 {
		return fmt.Sprintf("written in transactions of %d events, one after the other", c.EventsPerTransaction)
	}
	return fmt.Sprintf("written one event a transaction by %d producers", c.Producers)
}

// queueEach writes o.Backlog events, each in its own transaction, from
// o.Producers producers, and records their ids once committed.
func (e *env) queueEach(ctx context.Context, o Options, led *ledger) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range o.Producers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= o.Backlog {
					return
				}
				id, err := e.produce(ctx, o, "postbox.outbox", fmt.Sprintf("ep-%d", i%o.Endpoints), i)
				if err != nil {
					led.doubt(id)
					continue
				}
				led.commit(id)
			}
		})
	}
	wg.Wait()
}

// queue writes n events, numbered from first, in one transaction, as
// outbox rows or with o.Emit as WAL messages, and records their ids once
// it has committed.
func (e *env) queue(ctx context.Context, o Options, led *ledger, first, n int) error {
	if o.Emit {
		return e.emitBatch(ctx, led, first, n, o.Endpoints)
	}
	return e.insertBatch(ctx, led, first, n, o.Endpoints)
}

// insertBatch inserts n events, numbered from first, in one transaction and
// records their ids once it has committed.
func (e *env) insertBatch(ctx context.Context, led *ledger, first, n, endpoints int) error {
	return e.collect(ctx, led, n, `INSERT INTO postbox.outbox (endpoint, payload)
		SELECT 'ep-' || (i % $2), jsonb_build_object('i', i, 'click_id', 'clk_' || i, 'payout', '1.00')
		FROM generate_series($1::int, $1::int + $3 - 1) i
		RETURNING event_id::text`, first, endpoints, n)
}

// emitBatch writes n events as outbox.Emit does (outbox.EncodeMessage's
// format), in one transaction.
func (e *env) emitBatch(ctx context.Context, led *ledger, first, n, endpoints int) error {
	return e.collect(ctx, led, n, `
		WITH ev AS (SELECT gen_random_uuid() AS id, i FROM generate_series($1::int, $1::int + $3 - 1) i)
		SELECT id::text FROM ev
		CROSS JOIN LATERAL (SELECT pg_logical_emit_message(true, '`+outbox.MessagePrefix+`', convert_to(
		  json_build_object('v', 1, 'id', id, 'endpoint', 'ep-' || (i % $2), 'created_at', now())::text || E'\n' ||
		  json_build_object('i', i, 'click_id', 'clk_' || i, 'payout', '1.00')::text, 'UTF8'))) m`, first, endpoints, n)
}

// collect runs a statement that writes n events and returns their ids,
// and records them once it has committed.
func (e *env) collect(ctx context.Context, led *ledger, n int, sql string, args ...any) error {
	rows, err := e.pool.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("queue the backlog: %w", err)
	}
	ids := make([]string, 0, n)
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("queue the backlog: %w", err)
		}
		ids = append(ids, id)
	}
	// Err is known only once the rows are closed, which reads up to the
	// server's ReadyForQuery: after the commit.
	if err := rows.Err(); err != nil {
		return fmt.Errorf("queue the backlog: %w", err)
	}
	led.commit(ids...)
	return nil
}
