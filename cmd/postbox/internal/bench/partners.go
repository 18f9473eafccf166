package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/postbox-relay/postbox/outbox"
)

// Partners scenario defaults: rows of postbox.endpoints, and the changes
// whose application the second instance is timed on.
const (
	TableEndpointsDefault = 100000
	PartnersChanges       = 100
	// partnersFollowEvents are the followed endpoint's events: every
	// attempt is answered 503, so each is retried every 20–40 ms for the
	// whole run, by whichever instance claimed it last.
	partnersFollowEvents = 8
	// partnersChangeWithin is how long a change may take to show at the
	// receiver before it counts as missed.
	partnersChangeWithin = 10 * time.Second
	partnersFollowed     = "followed"
	// partnersShortSweep is the second instance's sweep_interval in the
	// second run of follow: how often it claims the retries another
	// instance scheduled, when none of its own falls due.
	partnersShortSweep = 250 * time.Millisecond
)

// PartnersResult is the partners scenario's: endpoints as rows of
// postbox.endpoints at the scale of a platform's affiliates.
type PartnersResult struct {
	Rows int `json:"table_endpoints"`
	// InsertSeconds is how long the INSERT … generate_series of the rows
	// took (no relay running).
	InsertSeconds float64 `json:"insert_seconds"`
	// FirstStartSeconds is from spawning the relay to its slot streaming
	// when the rows were inserted while it was down, CaughtUpSeconds to
	// the slot having confirmed the insert's WAL (every row decoded and
	// written to endpoint_state); StartSeconds from spawning to streaming
	// with the rows applied before (a restart), each of the runs beside
	// the rows.
	FirstStartSeconds []float64 `json:"first_start_seconds"`
	CaughtUpSeconds   []float64 `json:"first_caught_up_seconds"`
	StartSeconds      []float64 `json:"restart_seconds"`
	// SeedSeconds is from spawning to streaming with a seed owed: the
	// first start beside a table already written (no checkpoint,
	// endpoint_state empty, the slot at the WAL's end), the rows copied
	// whole into endpoint_state and read; SeedPeakRSSMB that relay's peak.
	SeedSeconds   []float64 `json:"seed_start_seconds"`
	SeedPeakRSSMB []float64 `json:"seed_peak_rss_mb"`
	// SteadyRSSMB is the streaming instance's RSS at the end of a latency
	// run beside the rows, PeakRSSMB its high-water mark.
	SteadyRSSMB []float64 `json:"steady_rss_mb"`
	PeakRSSMB   []float64 `json:"peak_rss_mb"`
	// Alone is the latency scenario with its endpoints in the file and
	// no rows, Beside the same over as many of the rows; run alternately.
	Alone  []*LatencyResult `json:"latency_file_endpoints"`
	Beside []*LatencyResult `json:"latency_table_endpoints"`
	// Follow is the second instance's application of changes, with its
	// sweep_interval as configured by default, then shorter.
	Follow []*FollowResult `json:"second_instance"`
}

// FollowResult is the second, non-streaming instance's application of
// changes: for each, from before its UPDATE was sent until the receiver
// got the first request from that instance at the new url.
type FollowResult struct {
	// SweepInterval is the second instance's sweep_interval ("" for the
	// default).
	SweepInterval string  `json:"second_instance_sweep_interval,omitempty"`
	Changes       int     `json:"changes"`
	Missed        int     `json:"missed"`
	P50ms         float64 `json:"p50_ms"`
	P99ms         float64 `json:"p99_ms"`
	Maxms         float64 `json:"max_ms"`
	// The requests of each instance to the followed endpoint.
	StreamingRequests int     `json:"streaming_instance_requests"`
	SecondRequests    int     `json:"second_instance_requests"`
	SteadyRSSMB       float64 `json:"second_instance_rss_mb"`
	PeakRSSMB         float64 `json:"second_instance_peak_rss_mb"`
}

// partnersParts are the partners scenario's parts (Options.PartnersParts).
var partnersParts = []string{"latency", "start", "caughtup", "follow"}

// validParts reports whether list names only parts of partnersParts.
func validParts(list string) bool {
	for _, p := range strings.Split(list, ",") {
		if !slices.Contains(partnersParts, strings.TrimSpace(p)) {
			return false
		}
	}
	return true
}

// runs reports whether the partners scenario runs part.
func (o Options) runs(part string) bool {
	if o.PartnersParts == "" {
		return true
	}
	for _, p := range strings.Split(o.PartnersParts, ",") {
		if strings.TrimSpace(p) == part {
			return true
		}
	}
	return false
}

// partnersConfig is the relays' configuration beside the rows: no
// endpoint of the file named as a row.
func (e *env) partnersConfig(admin string) string {
	var b strings.Builder
	e.writeConfigHead(&b, admin, "warn")
	fmt.Fprintf(&b, "endpoints:\n  hang:\n    url: %s/hang\n  fail:\n    url: %s/fail\n", e.recv.URL, e.recv.URL)
	return b.String()
}

// partners measures rows of postbox.endpoints at scale: the latency over
// ten of them against ten endpoints of the file (alternating, twice),
// start-up and memory, and a second instance's application of changes.
func (e *env) partners(ctx context.Context, o Options) (*PartnersResult, error) {
	if err := e.ensureSchema(ctx); err != nil {
		return nil, err
	}
	// Table endpoints sign with the secret derived for their name.
	master, err := outbox.ParseSecret(e.secret)
	if err != nil {
		return nil, err
	}
	extra := []string{outbox.DeriveSecret(master, partnersFollowed).Reveal()}
	for i := range o.Endpoints {
		extra = append(extra, outbox.DeriveSecret(master, fmt.Sprintf("ep-%d", i)).Reveal())
	}
	e.recv.addSecrets(extra...)
	dir := filepath.Dir(e.cfgPath)
	fileCfg := e.cfgPath
	tableCfg := filepath.Join(dir, "partners.yaml")
	if err := os.WriteFile(tableCfg, []byte(e.partnersConfig(e.admin)), 0o600); err != nil {
		return nil, err
	}
	defer func() { e.cfgPath = fileCfg }()
	res := &PartnersResult{Rows: o.TableEndpoints}
	rounds := 2
	if !o.runs("latency") && !o.runs("start") {
		rounds = 0 // the rows are written for follow alone
		if err := e.clearEndpoints(ctx); err != nil {
			return nil, err
		}
		took, err := e.writeEndpoints(ctx, o.TableEndpoints)
		if err != nil {
			return nil, err
		}
		res.InsertSeconds = took
		// Applied before the instances follow: a first start seeds them.
		e.cfgPath = tableCfg
		if err := e.seeded(ctx); err != nil {
			return nil, err
		}
	}
	for range rounds {
		e.cfgPath = fileCfg
		if err := e.clearEndpoints(ctx); err != nil {
			return nil, err
		}
		if o.runs("latency") {
			alone, err := e.latency(ctx, o, false)
			if err != nil {
				return nil, err
			}
			res.Alone = append(res.Alone, alone)
		}

		fmt.Fprintf(e.log, "bench: partners, writing %d rows of postbox.endpoints\n", o.TableEndpoints)
		took, err := e.writeEndpoints(ctx, o.TableEndpoints)
		if err != nil {
			return nil, err
		}
		res.InsertSeconds = took
		e.cfgPath = tableCfg
		if o.runs("start") {
			if err := e.partnersStart(ctx, res, o.runs("caughtup")); err != nil {
				return nil, err
			}
		} else if err := e.seeded(ctx); err != nil {
			// The rows applied before the latency run, which would
			// otherwise read them from the stream while it is timed.
			return nil, err
		}
		if o.runs("latency") {
			beside, err := e.latency(ctx, o, false)
			if err != nil {
				return nil, err
			}
			res.Beside = append(res.Beside, beside)
			res.SteadyRSSMB = append(res.SteadyRSSMB, e.stoppedRSS)
			res.PeakRSSMB = append(res.PeakRSSMB, beside.RSSMB)
		}
	}
	if o.runs("follow") {
		for run, sweep := range []time.Duration{0, partnersShortSweep} {
			f, err := e.follow(ctx, tableCfg, run, sweep)
			if err != nil {
				return nil, err
			}
			res.Follow = append(res.Follow, f)
			e.truncate(ctx, true)
		}
	}
	e.cfgPath = fileCfg
	if err := e.clearEndpoints(ctx); err != nil {
		return nil, err
	}
	e.truncate(ctx, true)
	return res, nil
}

// seeded starts the relay until it has seeded endpoint_state, then moves
// its slot past the seed's writes, which are not published: a stream that
// read through them first, 100,000 rows of one transaction, fell minutes
// behind.
func (e *env) seeded(ctx context.Context) error {
	// Owed, also to a relay that seeded before these rows were written.
	if _, err := e.pool.Exec(ctx, `UPDATE postbox.checkpoints SET endpoints_seeded = false`); err != nil {
		return err
	}
	if err := e.startRelay(ctx); err != nil {
		return err
	}
	err := waitFor(ctx, 2*time.Minute, 50*time.Millisecond, func() (bool, error) {
		var done bool
		err := e.pool.QueryRow(ctx, `SELECT coalesce(bool_or(endpoints_seeded), false) FROM postbox.checkpoints`).Scan(&done)
		return done, err
	})
	e.stopRelay()
	if err != nil {
		return err
	}
	_, err = e.pool.Exec(ctx, `SELECT pg_replication_slot_advance(slot_name, pg_current_wal_lsn()) FROM pg_replication_slots WHERE slot_name = $1`, e.slot)
	return err
}

// partnersStart times the relay's start beside the rows just written:
// the first, with the rows inserted while it was down, then with a seed
// owed, then a restart with the rows applied.
func (e *env) partnersStart(ctx context.Context, res *PartnersResult, caughtUp bool) error {
	start := time.Now()
	if err := e.startRelay(ctx); err != nil {
		return err
	}
	first := time.Since(start).Seconds()
	// Without caughtUp, what the first start had left to read is read by
	// the starts below, after they stream: their times are still theirs.
	after := -1.0
	if caughtUp {
		err := e.waitCaughtUp(ctx)
		after = time.Since(start).Seconds()
		if err != nil {
			e.stopRelay()
			return err
		}
	}
	e.stopRelay()
	res.FirstStartSeconds, res.CaughtUpSeconds = append(res.FirstStartSeconds, first), append(res.CaughtUpSeconds, after)
	fmt.Fprintf(e.log, "bench: partners, streaming %.1f s after the start, caught up with the rows %.1f s after\n", first, after)
	// A first start beside the table written already: nothing applied,
	// no checkpoint, the slot where the WAL is (as if made now; a slot
	// made by the relay would be active, so seem to stream, before the
	// seed); the relay copies the rows into endpoint_state (the seed) and
	// reads them before it streams. (Owed again to a relay that had
	// applied them, the seed finds them there.)
	if _, err := e.pool.Exec(ctx, `SELECT pg_replication_slot_advance(slot_name, pg_current_wal_lsn()) FROM pg_replication_slots WHERE slot_name = $1`, e.slot); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `DELETE FROM postbox.checkpoints`); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `TRUNCATE postbox.endpoint_state`); err != nil {
		return err
	}
	if err := e.startRelay(ctx); err != nil {
		return err
	}
	res.SeedSeconds = append(res.SeedSeconds, e.startedIn.Seconds())
	res.SeedPeakRSSMB = append(res.SeedPeakRSSMB, e.stopRelay())
	fmt.Fprintf(e.log, "bench: partners, with a seed owed: streaming %.2f s after the start\n", e.startedIn.Seconds())
	// The restart, with the rows applied.
	if err := e.startRelay(ctx); err != nil {
		return err
	}
	res.StartSeconds = append(res.StartSeconds, e.startedIn.Seconds())
	e.stopRelay()
	return nil
}

// clearEndpoints empties postbox.endpoints and what the relays applied of
// it, with no relay running: a TRUNCATE is not published, so no relay
// hears of it, and none needs to (endpoint_state goes with it).
func (e *env) clearEndpoints(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, `TRUNCATE postbox.endpoints, postbox.endpoint_state, postbox.endpoint_changes`)
	if err != nil {
		return fmt.Errorf("empty postbox.endpoints: %w", err)
	}
	return nil
}

// writeEndpoints inserts n rows named ep-0 … ep-(n-1), each with its url
// on the receiver, a header and a timeout, and the followed endpoint,
// which retries at once and never opens its breaker (the streaming
// instance's attempts fail on purpose: see follow).
func (e *env) writeEndpoints(ctx context.Context, n int) (float64, error) {
	start := time.Now()
	_, err := e.pool.Exec(ctx, `
		INSERT INTO postbox.endpoints (name, url, headers, timeout)
		SELECT 'ep-' || i, $1 || '/ep-' || i, jsonb_build_object('X-Partner', 'partner ' || i), interval '10 seconds'
		FROM generate_series(0, $2 - 1) i`, e.recv.URL, n)
	if err == nil {
		_, err = e.pool.Exec(ctx, `
			INSERT INTO postbox.endpoints (name, url, max_attempts, backoff_base, backoff_cap, failure_threshold)
			VALUES ($1, $2, 1000000, interval '20 milliseconds', interval '40 milliseconds', 1000000)`,
			partnersFollowed, e.recv.URL+"/follow/r0/v0")
	}
	if err != nil {
		return 0, fmt.Errorf("write postbox.endpoints: %w", err)
	}
	return time.Since(start).Seconds(), nil
}

// follow runs the streaming instance and a second one, then changes the
// followed endpoint's url PartnersChanges times and times each change
// until the second instance's first request at the new url. The
// receiver tells the instances apart by the process that holds the
// request's socket (socketPID), and answers the streaming instance's
// a few events of the followed endpoint are answered 503 whoever sends
// them, so they are retried for the whole run, every 20–40 ms, by the
// instance that claimed them last: each attempt resolves the endpoint as
// that instance applied it, and the second instance's first request at a
// url is the first it sent after applying the change that set it (an
// event delivered would leave the second instance with no work of its
// own, and it takes others' retries only when one of its own falls due,
// a change was applied, or at its sweep).
func (e *env) follow(ctx context.Context, cfgPath string, run int, sweep time.Duration) (*FollowResult, error) {
	at := func(i int) string { return fmt.Sprintf("/follow/r%d/v%d", run, i) }
	if _, err := e.pool.Exec(ctx, `UPDATE postbox.endpoints SET url = $1 WHERE name = $2`, e.recv.URL+at(0), partnersFollowed); err != nil {
		return nil, err
	}
	if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	defer e.stopRelay()
	second := filepath.Join(filepath.Dir(cfgPath), "second.yaml")
	cfg := e.partnersConfig("127.0.0.1:0")
	res := &FollowResult{Changes: PartnersChanges}
	if sweep > 0 {
		cfg += fmt.Sprintf("sweep_interval: %s\n", sweep)
		res.SweepInterval = sweep.String()
	}
	if err := os.WriteFile(second, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd, done, err := e.spawnRelay(second)
	if err != nil {
		return nil, err
	}
	defer func() {
		res.SteadyRSSMB, res.PeakRSSMB = statusMB(cmd.Process.Pid, "VmRSS:"), PeakRSS(cmd.Process.Pid)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	f := &follower{leader: e.relay.Process.Pid, second: cmd.Process.Pid, port: e.recv.port(), seen: map[string]time.Time{}}
	e.recv.setFollow(f.serve)
	defer e.recv.setFollow(nil)

	for i := range partnersFollowEvents {
		if _, err := e.pool.Exec(ctx, `INSERT INTO postbox.outbox`+insertSQL, outbox.NewEventID(), partnersFollowed, payload(i)); err != nil {
			return nil, fmt.Errorf("write the followed endpoint's events: %w", err)
		}
	}

	// The second instance is up once it has sent to the first url.
	fmt.Fprintln(e.log, "bench: partners, waiting for the second instance's first attempt")
	if _, ok := f.wait(ctx, at(0), time.Time{}, time.Minute); !ok {
		return nil, errors.New("the second instance sent nothing within a minute")
	}
	fmt.Fprintf(e.log, "bench: partners, %d changes of the followed endpoint's url (the second instance's sweep_interval %s)\n", PartnersChanges, cmp.Or(res.SweepInterval, "by default"))
	var lat []float64
	for i := 1; i <= PartnersChanges; i++ {
		path := at(i)
		sent := time.Now()
		if _, err := e.pool.Exec(ctx, `UPDATE postbox.endpoints SET url = $1 WHERE name = $2`, e.recv.URL+path, partnersFollowed); err != nil {
			return nil, fmt.Errorf("change the followed endpoint: %w", err)
		}
		at, ok := f.wait(ctx, path, sent, partnersChangeWithin)
		if !ok {
			res.Missed++
			continue
		}
		lat = append(lat, float64(at.Sub(sent))/float64(time.Millisecond))
	}
	slices.Sort(lat)
	res.P50ms, res.P99ms, res.Maxms = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	res.StreamingRequests, res.SecondRequests = f.counts()
	return res, nil
}

// follower is the receiver's side of follow: it answers the streaming
// instance 503 and the second instance 204, noting when the second one
// first reached each path.
type follower struct {
	leader, second, port int
	mu                   sync.Mutex
	seen                 map[string]time.Time
	first, second2       int // the requests of each instance
}

func (f *follower) serve(w http.ResponseWriter, r *http.Request, now time.Time) {
	pid := socketPID(r, f.port, f.leader, f.second)
	f.mu.Lock()
	defer f.mu.Unlock()
	if pid == f.second {
		f.second2++
		if _, ok := f.seen[r.URL.Path]; !ok {
			f.seen[r.URL.Path] = now
		}
	} else {
		f.first++
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

func (f *follower) counts() (streaming, second int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first, f.second2
}

// wait returns when the second instance first reached path, if it did
// after since and within d.
func (f *follower) wait(ctx context.Context, path string, since time.Time, d time.Duration) (time.Time, bool) {
	var at time.Time
	_ = waitFor(ctx, d, time.Millisecond, func() (bool, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		t, ok := f.seen[path]
		if ok && !t.Before(since) {
			at = t
		}
		return ok, nil
	})
	return at, !at.IsZero()
}

// connPID caches, per connection, the process socketPID found for it.
type connPID struct {
	once sync.Once
	pid  int
}

type connKey struct{}

// socketPID is which of pids holds the client end of r's connection to
// the receiver (listening on port): the socket's inode, from
// /proc/net/tcp and tcp6 by the two ports, among the descriptors of each
// process (/proc/PID/fd). 0 when none does.
func socketPID(r *http.Request, port int, pids ...int) int {
	c, _ := r.Context().Value(connKey{}).(*connPID)
	if c == nil {
		return 0
	}
	c.once.Do(func() {
		_, p, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			return
		}
		client, _ := strconv.Atoi(p)
		inode := socketInode(client, port)
		if inode == "" {
			return
		}
		link := "socket:[" + inode + "]"
		for _, pid := range pids {
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			for _, fd := range fds {
				if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == link {
					c.pid = pid
					return
				}
			}
		}
	})
	return c.pid
}

// socketInode is the inode of the TCP socket whose local port is local
// and remote port remote.
func socketInode(local, remote int) string {
	want := fmt.Sprintf(":%04X", local)
	peer := fmt.Sprintf(":%04X", remote)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], want) && strings.HasSuffix(f[2], peer) {
				return f[9]
			}
		}
	}
	return ""
}

func (p *PartnersResult) print(w io.Writer) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "\npartners: %d rows of postbox.endpoints (url, a header, a timeout each), written by one INSERT … generate_series in %.1f s\n", p.Rows, p.InsertSeconds)
	for i := range p.SeedSeconds {
		fmt.Fprintf(w, "  run %d: start with the rows inserted while down: streaming after %.2f s, every row applied after %.2f s; a first start with a seed owed (no checkpoint, endpoint_state empty): streaming after %.2f s, peak RSS %.0f MB; restart with the rows applied: streaming after %.2f s\n",
			i+1, p.FirstStartSeconds[i], p.CaughtUpSeconds[i], p.SeedSeconds[i], p.SeedPeakRSSMB[i], p.StartSeconds[i])
	}
	for i := range p.Beside {
		fmt.Fprintf(w, "  run %d: RSS %.0f MB at the end of the latency run over ten of the rows, peak %.0f MB\n", i+1, p.SteadyRSSMB[i], p.PeakRSSMB[i])
	}
	if len(p.Alone) > 0 {
		fmt.Fprintf(w, "  commit → receiver latency, runs alternating, endpoints in the file (no rows) / the same number of the rows:\n")
	}
	for i := range p.Alone {
		for j, l := range []*LatencyResult{p.Alone[i], p.Beside[i]} {
			what := []string{"file ", "table"}[j]
			fmt.Fprintf(w, "    %s, %d events/s over %d: p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   (measured/received %d/%d, lost %d, duplicates %d%s)\n",
				what, l.Rate, l.Endpoints, l.P50ms, l.P90ms, l.P99ms, l.Maxms, l.Measured, l.Received, l.Lost, l.Dups, anomalies(l.Unacknowledged, l.BadSignatures))
		}
	}
	for _, f := range p.Follow {
		fmt.Fprintf(w, "  a second, non-streaming instance (sweep_interval %s): %d changes of one row's url, each timed from before its UPDATE until the receiver's first request from that instance at the new url\n", cmp.Or(f.SweepInterval, "5s, the default"), f.Changes)
		fmt.Fprintf(w, "  (%d events of the row answered 503 whoever sends them, so each is retried every 20-40 ms by the instance that claimed it last; the receiver tells the instances apart by the process holding the request's socket):\n", partnersFollowEvents)
		fmt.Fprintf(w, "    p50 %.0f ms   p99 %.0f ms   max %.0f ms   missed (none within %s) %d; requests: second instance %d, streaming instance %d; second instance RSS %.0f MB, peak %.0f MB\n",
			f.P50ms, f.P99ms, f.Maxms, partnersChangeWithin, f.Missed, f.SecondRequests, f.StreamingRequests, f.SteadyRSSMB, f.PeakRSSMB)
	}
}
