package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/postbox-relay/postbox/outbox"
)

// floorTable and floorPublication are the floor scenario's own: a copy of
// the outbox the relay does not publish, so the relay never sees these
// events. Its slot is temporary, gone with the connection, and named
// after the relay's (unique when the server is shared).
const (
	floorTable       = "public.bench_floor"
	floorPublication = "bench_floor"
)

// floor is the latency scenario without postbox: the same paced producer
// and receiver, and in between a bare logical replication client that, as
// each transaction's Commit arrives, sends its rows to the receiver, signed,
// one request each, concurrently. It ingests nothing, writes nothing to the
// database and never retries, so what it measures is what PostgreSQL (the
// commit's WAL flush, the walsender), one HTTP request and this machine's
// scheduling cost: the floor under any relay's latency here. Read beside
// the latency scenario's, the difference is what postbox adds.
func (e *env) floor(ctx context.Context, o Options) (*LatencyResult, error) {
	fw, drop, err := e.startFloor(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	warm := e.warmUp(ctx, o, floorTable, false)
	if err := fw.forgetTimings(); err != nil {
		_, _ = fw.stop()
		return nil, err
	}
	led := e.recv.reset()
	fmt.Fprintf(e.log, "bench: floor, %d events/s over %d endpoints for %s, no relay: a bare logical client forwards each row\n", o.Rate, o.Endpoints, o.Duration)
	from := e.read(ctx)
	e.pace(ctx, o, floorTable, led, false)
	if _, _, err := e.resolve(ctx, led, floorTable); err != nil {
		_, _ = fw.stop()
		return nil, err
	}
	t, lat, to, err := e.endFloor(ctx, fw, led, 30*time.Second, 50*time.Millisecond)
	if err != nil {
		return nil, err
	}
	res := &LatencyResult{
		Rate: o.Rate, Endpoints: o.Endpoints, Sent: t.sent, Received: t.received, Measured: len(lat),
		Lost: t.lost, Dups: t.dups, BadSignatures: e.recv.scenarioBad(),
		P50ms: quantile(lat, 0.50), P90ms: quantile(lat, 0.90), P99ms: quantile(lat, 0.99), Maxms: quantile(lat, 1),
		Costs: e.floorCosts(ctx, from, to, t.sent), Split: fw.split(),
	}
	warm.add(res)
	// Then the disk under the cluster alone, at the same pace, for as many
	// flushes as there were commits (10 s of them at most).
	if e.cluster != nil && !e.cluster.External() {
		res.Disk, err = diskFlush(ctx, e.cluster.Dir(), min(t.sent, 10*o.Rate), o.Rate)
		if err != nil {
			return nil, fmt.Errorf("time the disk's flushes: %w", err)
		}
	}
	return res, nil
}

// startFloor creates the floor's table and publication and starts the bare
// logical client on them. drop removes both; call it after the client's
// stop.
func (e *env) startFloor(ctx context.Context) (fw bareClient, drop func(), err error) {
	// The copy is of the relay's outbox, its indexes and defaults.
	if err := e.ensureSchema(ctx); err != nil {
		return nil, nil, err
	}
	_, err = e.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+floorPublication+`;
		DROP TABLE IF EXISTS `+floorTable+`;
		CREATE TABLE `+floorTable+` (LIKE postbox.outbox INCLUDING ALL);
		CREATE PUBLICATION `+floorPublication+` FOR TABLE `+floorTable+` WITH (publish = 'insert')`)
	if err != nil {
		return nil, nil, fmt.Errorf("create the floor's table: %w", err)
	}
	drop = func() {
		e.bare = nil
		_, _ = e.pool.Exec(context.WithoutCancel(ctx), `DROP PUBLICATION `+floorPublication+`; DROP TABLE `+floorTable)
	}
	setup := bareClientSetup{DBURL: e.dbURL, Slot: e.floorSlot(), Target: e.recv.URL, Secret: e.secret, Batch: e.cpuScheduling != "normal"}
	if e.floorInProcess {
		fw, err = startForwarder(ctx, setup.DBURL, setup.Slot, setup.Target, setup.Secret)
	} else if e.bare, err = startBareProcess(ctx, e.bareBinary, e.log, setup); err == nil {
		fw = e.bare
	}
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("start the bare logical client: %w", err)
	}
	return fw, drop, nil
}

// floorSlot is the bare client's temporary slot.
func (e *env) floorSlot() string { return e.slot + "_floor" }

// loadFloor is the load scenario without postbox: the same producers, as
// fast as they commit, into the floor's table, and the bare logical client
// forwarding each row at its Commit. Under full insert load on a small
// machine the walsender waits for a CPU beside the producers' backends;
// what it and one HTTP request cost then, with no relay competing for the
// CPUs, is the floor under the load scenario's latency.
func (e *env) loadFloor(ctx context.Context, o Options) (*LoadResult, error) {
	fw, drop, err := e.startFloor(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	led := e.recv.reset()
	res := &LoadResult{Producers: o.Producers, Endpoints: o.Endpoints, Seconds: o.Duration.Seconds()}
	if o.WalsenderNice != 0 {
		if err := e.weighWalsender(ctx, e.floorSlot(), o.WalsenderNice); err != nil {
			_, _ = fw.stop()
			return nil, err
		}
		res.WalsenderNice = o.WalsenderNice
	}
	fmt.Fprintf(e.log, "bench: load floor, %d producers inserting for %s, no relay: a bare logical client forwards each row\n", o.Producers, o.Duration)
	from := e.read(ctx)
	e.produceFlat(ctx, o, floorTable, led, res)
	if _, _, err := e.resolve(ctx, led, floorTable); err != nil {
		_, _ = fw.stop()
		return nil, err
	}
	t, lat, to, err := e.endFloor(ctx, fw, led, 5*time.Minute, 20*time.Millisecond)
	if err != nil {
		return nil, err
	}
	res.DrainSeconds = to.at.Sub(res.loadEnd).Seconds()
	res.P50ms, res.P99ms, res.Over50ms = quantile(lat, 0.50), quantile(lat, 0.99), shareOver(lat, 50)
	res.Lost, res.Dups, res.BadSignatures = t.lost, t.dups, e.recv.scenarioBad()
	res.Received, res.Measured = t.received, len(lat)
	res.Costs, res.Split = e.floorCosts(ctx, from, to, res.Sent), fw.split()
	return res, nil
}

// floorCosts is costs for a floor scenario: the relay's figures are the
// bare client's when it runs in a process of its own, and are called so.
func (e *env) floorCosts(ctx context.Context, from, to meter, events int) *Costs {
	c := e.costs(ctx, from, to, events)
	if c != nil && e.bare != nil {
		c.relayName = "bare client"
	}
	return c
}

// endFloor waits (for at most wait, looking every poll, as the scenario
// with the relay does) until every event committed into led has arrived,
// reads the costs' counters, stops the bare client and returns the
// ledger's tally and the arrivals' latencies, sorted.
func (e *env) endFloor(ctx context.Context, fw bareClient, led *ledger, wait, poll time.Duration) (tally, []float64, meter, error) {
	err := waitFor(ctx, wait, poll, func() (bool, error) { return led.pending() == 0, nil })
	to := e.read(ctx)
	committed, ferr := fw.stop()
	if err == nil {
		err = ferr
	}
	if err != nil {
		return tally{}, nil, meter{}, err
	}
	t := led.tally()
	if latenciesFile != "" {
		e.dumpLatencies(ctx, latenciesFile+".floor", t.first, committed)
	}
	return t, latenciesFrom(t.first, committed), to, nil
}

// forwarder is the floor scenario's bare logical client.
type forwarder struct {
	conn    *pgconn.PgConn
	slot    string
	client  *http.Client
	target  string
	secrets []outbox.Secret
	cancel  context.CancelFunc
	done    chan error

	mu        sync.Mutex
	committed map[string]time.Time // event id → its transaction's commit time
	// The split of each transaction's wait (ms): from its commit to the
	// server's send of its Commit message and to its receipt here; and
	// of each row's, from that receipt to its request's hand-over to the
	// HTTP client.
	toSend, toStream, toPost []float64
	posts                    sync.WaitGroup

	// Decoding state, the receive loop's alone.
	columns map[uint32][]string // relation id → column names
	pending []forwardRow        // the open transaction's rows
}

type forwardRow struct{ id, endpoint, payload string }

// startForwarder opens a replication connection, creates a temporary slot
// and starts streaming from it.
func startForwarder(ctx context.Context, dbURL, slot, target, secret string) (*forwarder, error) {
	key, err := outbox.ParseSecret(secret)
	if err != nil {
		return nil, err
	}
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "bench_floor"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Temporary: true}); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + floorPublication + "'"},
	})
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fw := &forwarder{
		conn: conn, slot: slot, target: target, secrets: []outbox.Secret{key}, cancel: cancel, done: make(chan error, 1),
		client:    &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second},
		committed: map[string]time.Time{}, columns: map[uint32][]string{},
	}
	go func() { fw.done <- fw.receive(rctx) }()
	return fw, nil
}

// stop ends the stream, waits for the requests in flight and returns the
// commit time of every event it saw.
func (fw *forwarder) stop() (map[string]time.Time, error) {
	fw.cancel()
	err := <-fw.done
	fw.posts.Wait()
	fw.client.CloseIdleConnections()
	_ = fw.conn.Close(context.Background())
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.committed, err
}

// split is the bare client's Split, from its own exact timings rather
// than a relay's histograms: per transaction, from the commit to the
// server's send and to the receipt; per row, from the receipt to the
// request. Call it after stop.
func (fw *forwarder) split() *Split {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if len(fw.toStream) == 0 {
		return nil
	}
	for _, xs := range [][]float64{fw.toSend, fw.toStream, fw.toPost} {
		sort.Float64s(xs)
	}
	return &Split{
		Streamed:            len(fw.toStream),
		CommitToStreamP50ms: quantile(fw.toStream, 0.50), CommitToStreamP99ms: quantile(fw.toStream, 0.99),
		StreamedOver50ms:  shareOver(fw.toStream, 50),
		CommitToSendP50ms: quantile(fw.toSend, 0.50), CommitToSendP99ms: quantile(fw.toSend, 0.99),
		SentOver50ms:         shareOver(fw.toSend, 50),
		StreamToAttemptP50ms: quantile(fw.toPost, 0.50), StreamToAttemptP99ms: quantile(fw.toPost, 0.99),
	}
}

// forgetTimings drops the timings taken so far (a warm-up's) from the
// split.
func (fw *forwarder) forgetTimings() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.toSend, fw.toStream, fw.toPost = fw.toSend[:0], fw.toStream[:0], fw.toPost[:0]
	return nil
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// receive reads the stream until ctx ends.
func (fw *forwarder) receive(ctx context.Context) error {
	for {
		msg, err := fw.conn.ReceiveMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyData:
			if err := fw.handle(ctx, msg.Data); err != nil {
				return err
			}
		}
	}
}

func (fw *forwarder) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil || !ka.ReplyRequested {
			return err
		}
		return pglogrepl.SendStandbyStatusUpdate(ctx, fw.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: ka.ServerWALEnd})
	case pglogrepl.XLogDataByteID:
	default:
		return nil
	}
	x, err := pglogrepl.ParseXLogData(data[1:])
	if err != nil {
		return err
	}
	received := time.Now()
	m, err := pglogrepl.Parse(x.WALData)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		names := make([]string, len(m.Columns))
		for i, c := range m.Columns {
			names[i] = c.Name
		}
		fw.columns[m.RelationID] = names
	case *pglogrepl.InsertMessage:
		var r forwardRow
		for i, c := range m.Tuple.Columns {
			switch fw.columns[m.RelationID][i] {
			case "event_id":
				r.id = string(c.Data)
			case "endpoint":
				r.endpoint = string(c.Data)
			case "payload":
				r.payload = string(c.Data)
			}
		}
		fw.pending = append(fw.pending, r)
	case *pglogrepl.CommitMessage:
		fw.mu.Lock()
		for _, r := range fw.pending {
			fw.committed[r.id] = m.CommitTime
		}
		if len(fw.pending) > 0 {
			fw.toSend = append(fw.toSend, ms(x.ServerTime.Sub(m.CommitTime)))
			fw.toStream = append(fw.toStream, ms(received.Sub(m.CommitTime)))
		}
		fw.mu.Unlock()
		for _, r := range fw.pending {
			fw.posts.Add(1)
			go fw.post(r, received)
		}
		fw.pending = fw.pending[:0]
		return pglogrepl.SendStandbyStatusUpdate(ctx, fw.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: m.TransactionEndLSN})
	}
	return nil
}

// post sends one row to the receiver as the relay would: its payload,
// signed. A failure is only counted by the receiver's ledger, as missing.
func (fw *forwarder) post(r forwardRow, received time.Time) {
	defer fw.posts.Done()
	body := []byte(r.payload)
	ts := time.Now().Unix()
	req, err := http.NewRequest(http.MethodPost, fw.target+"/"+r.endpoint, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set(outbox.HeaderID, r.id)
	req.Header.Set(outbox.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(outbox.HeaderSignature, outbox.SignatureHeader(fw.secrets, r.id, ts, body))
	fw.mu.Lock()
	fw.toPost = append(fw.toPost, ms(time.Since(received)))
	fw.mu.Unlock()
	resp, err := fw.client.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}
