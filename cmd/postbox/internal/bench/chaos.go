package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// Defaults of the chaos scenario.
const (
	ChaosRateDefault = 300
	// ChaosRelays is how many relays run against the one database.
	ChaosRelays = 3
	// chaosDrain bounds the wait for every committed event once the
	// producers stopped.
	chaosDrain = 3 * time.Minute
	// chaosInsertTimeout bounds one insert, so a producer stuck on a
	// server that went away does not hold up the pacing.
	chaosInsertTimeout = 5 * time.Second
	// flapTimeout is the flapping endpoint's timeout: below flapHang.
	flapTimeout = 2 * time.Second
	// chaosRecovery is the time a fault is given to recover before the
	// producers stop: the longest fault (a freeze or read-only spell of
	// up to 5 s, or a restart) and a margin.
	chaosRecovery = 8 * time.Second
	// ChaosSteadyWithin bounds the commit → delivery of every event of the
	// endpoints that do not flap, faults and all: the longest fault (a
	// freeze or read-only spell of 5 s) and the longest a relay then waits
	// to reconnect and retry (backoff_cap, and the reconnect backoff's cap,
	// 5 s). The run fails beyond it.
	ChaosSteadyWithin = 10 * time.Second
)

// The faults the chaos scenario injects.
const (
	faultKill             = "kill"              // SIGKILL a relay, start it again after a second
	faultFreeze           = "freeze"            // SIGSTOP a relay, SIGCONT it a few seconds later
	faultRestartFast      = "restart-fast"      // restart PostgreSQL, fast shutdown
	faultRestartImmediate = "restart-immediate" // restart PostgreSQL, crash and recovery
	faultDropSlot         = "drop-slot"         // terminate the walsender, drop the slot
	faultReadOnly         = "read-only"         // the database read-only for a few seconds
)

var faultKinds = []string{faultKill, faultFreeze, faultRestartFast, faultRestartImmediate, faultDropSlot, faultReadOnly}

// faultKinds returns the faults o.Faults lists, or all of them.
func (o Options) faultKinds() ([]string, error) {
	if strings.TrimSpace(o.Faults) == "" {
		return faultKinds, nil
	}
	kinds, err := choices("fault", o.Faults, faultKinds)
	if err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	return kinds, nil
}

// ChaosResult is the chaos scenario's.
type ChaosResult struct {
	Seed          uint64  `json:"seed"`
	Relays        int     `json:"relays"`
	Rate          int     `json:"rate_per_s"`
	Endpoints     int     `json:"endpoints"`
	Seconds       float64 `json:"seconds"`
	Faults        []Fault `json:"faults"`
	Sent          int     `json:"sent"`
	FailedInserts int     `json:"failed_inserts"`
	// FailedCommitted is the failed inserts (errored or timed out) found
	// committed in the database afterwards: expected like any other, and
	// in Sent.
	FailedCommitted int `json:"failed_inserts_committed"`
	SkippedInserts  int `json:"skipped_inserts"`
	Received        int `json:"received"`
	// Measured is the received events with a commit → delivery latency:
	// all of them, or the run fails.
	Measured int `json:"measured"`
	Lost     int `json:"lost"`
	Dups     int `json:"duplicates"`
	// DupBound is the sum of the faults' bounds; DupsWithin says each
	// fault's duplicates were within its own, and none came before the
	// first fault (DupsBeforeFaults).
	DupBound         int     `json:"duplicate_bound"`
	DupsWithin       bool    `json:"duplicates_within_bound"`
	DupsBeforeFaults int     `json:"duplicates_before_any_fault"`
	Unacknowledged   int     `json:"unacknowledged_delivered"`
	BadSignatures    int     `json:"bad_signatures"`
	DrainSeconds     float64 `json:"drain_seconds_after_load"`
	Maxms            float64 `json:"max_commit_to_delivery_ms"`
	P99ms            float64 `json:"p99_ms"`
	// HealthyMaxms and HealthyP99ms are the longest and the 99th
	// percentile commit → delivery of the endpoints that do not flap: what
	// the faults alone cost.
	HealthyMaxms float64 `json:"max_commit_to_delivery_ms_steady_endpoints"`
	HealthyP99ms float64 `json:"p99_ms_steady_endpoints"`
	// SteadyBoundms is ChaosSteadyWithin: HealthyMaxms above it fails the
	// run.
	SteadyBoundms float64 `json:"steady_endpoints_bound_ms"`
	// LostWhere counts the lost events by where postbox has them: their
	// delivery's status, still in the outbox, or nowhere.
	LostWhere map[string]int `json:"lost_where,omitempty"`
	RSSMB     float64        `json:"relay_peak_rss_mb"`
}

// Fault is one fault the chaos scenario injected.
type Fault struct {
	AtSeconds float64 `json:"at_s"`
	Kind      string  `json:"kind"`
	Target    string  `json:"target"`
	// InFlight is the deliveries in flight just before the fault, During
	// the deliveries that arrived while it lasted, and InFlightAfter those
	// in flight once it was recovered from: see dupBound.
	InFlight      int `json:"in_flight_before"`
	During        int `json:"arrived_during"`
	InFlightAfter int `json:"in_flight_after"`
	// Unrecorded is the events that had reached the receiver in the 5 s
	// before the fault, or while it was injected, and were not recorded
	// delivered once it was recovered from (a state read then, not a
	// time): the fault took the record of that arrival with it (a result
	// not yet written, or an ingest under way when the fast path had
	// already started the attempt), or had not let it be written yet. It
	// counts attempts the in-flight figures cannot see: those whose
	// delivery was not yet committed.
	Unrecorded int `json:"arrived_unrecorded"`
	// Exposed is the events either in flight just before the fault (its
	// deliveries in flight, the arrivals of the 5 s before it not yet
	// recorded or since those reads began, and the events committed in
	// those 5 s not yet arrived) or left unrecorded by it, and for a fault
	// of the database or a kill those that first arrived from its start
	// until the database answered again (the reads of InFlightAfter and
	// Unrecorded), each counted once. These are the attempts in flight at
	// the fault: the events it can have made the relays send twice.
	Exposed  int             `json:"exposed"`
	exposed  map[string]bool // their ids
	inFlight []string        // ids of the deliveries in flight just before the fault
	dupIDs   []string        // the ids of Dups
	// Dups is the duplicates counted against this fault, by webhook-id at
	// the receiver: each repeat of an event is the latest fault's before
	// it arrived that exposed the event, or if none did, the latest
	// fault's before it (a repeat no fault explains).
	Dups  int    `json:"duplicates"`
	Error string `json:"error,omitempty"`
	at    time.Time
}

// dupBound is how many duplicates the fault may cause: the events exposed
// to it (see Exposed: a first attempt the fast path made before its ingest
// committed is in no in-flight row, and when the fault fails that ingest
// the stream brings the event again); or, if more, the deliveries in
// flight once it was recovered from. A relay killed or frozen, or the
// slot dropped, leaves the other relays' deliveries alone.
func (f *Fault) dupBound() int { return max(f.Exposed, f.InFlightAfter) }

// dbFault says whether a fault of kind stops the database: its sessions'
// results of the attempts meanwhile may not be recordable.
func dbFault(kind string) bool {
	return kind == faultRestartFast || kind == faultRestartImmediate || kind == faultReadOnly
}

// expose sets f's exposed events: in flight before it, arrived and
// unrecorded after it, and for a fault of the database or a kill arrived
// during it.
func (f *Fault) expose(unrecorded, during []string) {
	f.exposed = union(f.inFlight, unrecorded)
	// A killed relay's requests already sent arrive while it is being
	// killed, and the relay that takes its events over records its own
	// copy before a read after the fault sees them unrecorded.
	if dbFault(f.Kind) || f.Kind == faultKill {
		for _, id := range during {
			f.exposed[id] = true
		}
	}
	f.Unrecorded, f.Exposed = len(unrecorded), len(f.exposed)
}

// attributeDups counts each repeated delivery (its id and arrival) against
// a fault, see Fault.Dups; it returns those that came before any fault.
func attributeDups(faults []Fault, ids []string, at []time.Time) (before int) {
	for k, id := range ids {
		pick := -1
		for i := len(faults) - 1; i >= 0; i-- {
			if at[k].Before(faults[i].at) {
				continue
			}
			if pick < 0 {
				pick = i // the latest before it, if none exposed the event
			}
			if faults[i].exposed[id] {
				pick = i
				break
			}
		}
		if pick < 0 {
			before++
			continue
		}
		faults[pick].Dups++
		faults[pick].dupIDs = append(faults[pick].dupIDs, id)
	}
	return before
}

// chaosRelay is one of the chaos scenario's relay processes.
type chaosRelay struct {
	name string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	rss  float64 // peak over its incarnations, MB
}

// sample folds the running process's peak RSS into r.rss.
func (r *chaosRelay) sample() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.rss = max(r.rss, PeakRSS(r.cmd.Process.Pid))
	}
}

// chaos runs ChaosRelays relays under a paced load while injecting faults
// chosen by a PCG seeded with o.Seed, then checks by event id that every
// committed event arrived.
func (e *env) chaos(ctx context.Context, o Options, rate int) (*ChaosResult, error) {
	if e.cluster == nil {
		return nil, errors.New("chaos restarts PostgreSQL: it needs its own server, not a given database")
	}
	led := e.recv.reset()
	kindsOf, err := o.faultKinds()
	if err != nil {
		return nil, err
	}
	res := &ChaosResult{Seed: o.Seed, Relays: o.Relays, Rate: rate, Endpoints: o.Endpoints, Seconds: o.Duration.Seconds()}
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	fmt.Fprintf(e.log, "bench: chaos, seed %d: %d relays, %d events/s over %d endpoints (ep-%d flapping) for %s\n",
		o.Seed, o.Relays, rate, o.Endpoints, o.Endpoints-1, o.Duration)

	cfgPath := filepath.Join(filepath.Dir(e.cfgPath), "chaos.yaml")
	if err := os.WriteFile(cfgPath, []byte(e.chaosConfig(o.Endpoints)), 0o600); err != nil {
		return nil, fmt.Errorf("write the relays' config: %w", err)
	}
	admin, err := pgxpool.New(ctx, e.cluster.URL("postgres"))
	if err != nil {
		return nil, fmt.Errorf("connect to the maintenance database: %w", err)
	}
	defer admin.Close()
	u, err := url.Parse(e.dbURL)
	if err != nil {
		return nil, err
	}
	db := strings.TrimPrefix(u.Path, "/")

	relays := make([]*chaosRelay, o.Relays)
	for i := range relays {
		relays[i] = &chaosRelay{name: fmt.Sprintf("relay-%d", i+1)}
	}
	start := func(r *chaosRelay) error {
		cmd, done, err := e.spawnRelay(cfgPath)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.cmd, r.done = cmd, done
		r.mu.Unlock()
		return nil
	}
	stopAll := func() {
		for _, r := range relays {
			r.sample()
			r.mu.Lock()
			cmd, done := r.cmd, r.done
			r.cmd = nil
			r.mu.Unlock()
			if cmd == nil {
				continue
			}
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	}
	defer stopAll()
	for _, r := range relays {
		if err := start(r); err != nil {
			return nil, err
		}
	}
	if err := e.waitStreaming(ctx); err != nil {
		return nil, err
	}

	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling:
				return
			case <-tick.C:
				for _, r := range relays {
					r.sample()
				}
			}
		}
	}()
	defer func() {
		select {
		case <-sampling:
		default:
			close(sampling)
		}
		<-sampled
	}()

	began := time.Now()
	var failed, skipped int
	var producing sync.WaitGroup
	produceCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	producing.Go(func() { failed, skipped = e.produceChaos(produceCtx, led, rate, o.Endpoints, o.Duration) })

	deadline := began.Add(o.Duration)
	var kinds []string
	for ctx.Err() == nil {
		// A fault at a moment 2 to 5 s after the last one recovered, while
		// the fault has time to recover (chaosRecovery) before the
		// producers stop.
		pause := 2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		if time.Now().Add(pause + chaosRecovery).After(deadline) {
			break
		}
		sleep(ctx, pause)
		if len(kinds) == 0 {
			kinds = append(kinds, kindsOf...)
			rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		}
		f := Fault{Kind: kinds[0]}
		kinds = kinds[1:]
		reading := time.Now()
		f.inFlight = e.inFlightIDs(ctx)
		f.InFlight = len(f.inFlight)
		// Read before the fault, as well as after it: a recovery as quick
		// as a takeover on proof records the re-sent copy of an arrival
		// before a read after the fault can see it unrecorded; and what was
		// committed and had not arrived is what a relay may hold in flight
		// in memory (a frozen relay sends it when it wakes).
		unrecordedBefore, _ := e.unrecorded(ctx, led.firstSince(time.Now().Add(-5*time.Second)))
		f.inFlight = append(f.inFlight, unrecordedBefore...)
		f.inFlight = append(f.inFlight, led.openSince(time.Now().Add(-5*time.Second))...)
		// The reads take a while (seconds on a loaded machine): what
		// arrived meanwhile may be unrecorded at the fault, and what was
		// committed meanwhile and has not arrived may be in a relay's
		// hands; both are as exposed as what the reads found.
		f.inFlight = append(f.inFlight, led.firstSince(reading)...)
		f.inFlight = append(f.inFlight, led.openSince(time.Now().Add(-5*time.Second))...)
		f.at = time.Now()
		f.AtSeconds = f.at.Sub(began).Seconds()
		arrivedBefore := led.arrived()
		if err := e.inject(ctx, &f, rng, relays[rng.IntN(len(relays))], start, admin, db); err != nil {
			f.Error = err.Error()
		}
		f.During = led.arrived() - arrivedBefore
		// Taken after the fault: an attempt that arrived while a relay was
		// being killed was its last, and its record died with it.
		recent := led.firstSince(f.at.Add(-5 * time.Second))
		f.InFlightAfter = e.inFlight(ctx)
		unrecorded, err := e.unrecorded(ctx, recent)
		if err != nil {
			f.Error = strings.TrimPrefix(f.Error+"; ", "; ") + err.Error()
		}
		// A fault of the database lasts, for the relays, until they can
		// record again: what first arrived from its start until the
		// database answered the reads above.
		f.expose(unrecorded, led.firstSince(f.at))
		fmt.Fprintf(e.log, "bench: chaos %6.1fs %-17s %s (in flight before: %d, arrived during: %d, in flight after: %d)%s\n",
			f.AtSeconds, f.Kind, f.Target, f.InFlight, f.During, f.InFlightAfter, errSuffix(f.Error))
		res.Faults = append(res.Faults, f)
	}
	producing.Wait()
	loadEnd := time.Now()
	res.FailedInserts, res.SkippedInserts = failed, skipped
	if _, res.FailedCommitted, err = e.resolve(ctx, led, "postbox.outbox"); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: chaos, load stopped; waiting up to %s for %d committed events\n", chaosDrain, led.pending())
	err = waitFor(ctx, chaosDrain, 50*time.Millisecond, func() (bool, error) { return led.pending() == 0, nil })
	res.DrainSeconds = time.Since(loadEnd).Seconds()
	close(sampling)
	<-sampled
	stopAll()
	for _, r := range relays {
		res.RSSMB = max(res.RSSMB, r.rss)
	}
	if err != nil {
		return nil, err
	}
	t := led.tally()
	lat, err := e.latencies(ctx, t.first)
	if err != nil {
		return nil, err
	}
	res.Maxms, res.P99ms = quantile(lat, 1), quantile(lat, 0.99)
	steady, err := e.latenciesExcept(ctx, t.first, fmt.Sprintf("ep-%d", o.Endpoints-1))
	if err != nil {
		return nil, err
	}
	res.HealthyP99ms, res.HealthyMaxms = quantile(steady, 0.99), quantile(steady, 1)
	res.SteadyBoundms = float64(ChaosSteadyWithin.Milliseconds())
	res.Sent, res.Received, res.Lost, res.Dups, res.Unacknowledged = t.sent, t.received, t.lost, t.dups, t.unacknowledged
	res.Measured = len(lat)
	res.DupsBeforeFaults = attributeDups(res.Faults, t.dupIDs, t.dupAt)
	res.DupsWithin = res.DupsBeforeFaults == 0
	for _, f := range res.Faults {
		res.DupBound += f.dupBound()
		res.DupsWithin = res.DupsWithin && f.Dups <= f.dupBound()
	}
	if t.lost > 0 {
		res.LostWhere = e.whereLost(ctx, t.lostIDs)
		e.storyOf(ctx, "lost", t.lostIDs)
	}
	for _, f := range res.Faults {
		if f.Dups > f.dupBound() {
			e.storyOf(ctx, fmt.Sprintf("duplicated after the %s at %.1f s", f.Kind, f.AtSeconds), f.dupIDs[:min(len(f.dupIDs), 3)])
		}
	}
	res.BadSignatures = e.recv.scenarioBad()
	e.truncate(ctx, true)
	return res, nil
}

// latenciesExcept is the commit → first arrival, in milliseconds and
// sorted, of the events for endpoints other than endpoint.
func (e *env) latenciesExcept(ctx context.Context, first map[string]time.Time, endpoint string) ([]float64, error) {
	committed, err := e.commitTimes(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	return latenciesFrom(first, committed), nil
}

// whereLost counts the event ids by where postbox has them.
func (e *env) whereLost(ctx context.Context, ids []string) map[string]int {
	rows, err := e.pool.Query(ctx, `
		SELECT coalesce(d.status, CASE WHEN o.event_id IS NOT NULL THEN 'in the outbox'
		                               WHEN u.event_pk IS NOT NULL THEN 'an event under way'
		                               WHEN ev.id IS NOT NULL THEN 'an event without a delivery'
		                               ELSE 'nowhere' END), count(*)
		FROM unnest($1::uuid[]) AS l(id)
		LEFT JOIN postbox.outbox o ON o.event_id = l.id
		LEFT JOIN postbox.events ev ON ev.event_id = l.id
		LEFT JOIN postbox.deliveries d ON d.event_pk = ev.id
		LEFT JOIN postbox.events_under_way u ON u.event_pk = ev.id
		GROUP BY 1`, ids)
	if err != nil {
		return map[string]int{"unknown: " + err.Error(): len(ids)}
	}
	defer rows.Close()
	where := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			break
		}
		where[k] = n
	}
	if err := rows.Err(); err != nil {
		return map[string]int{"unknown: " + err.Error(): len(ids)}
	}
	return where
}

// storyOf writes to the progress log, for the first few events of ids
// (lost, or duplicated), their deliveries and attempts: what postbox did
// with them.
func (e *env) storyOf(ctx context.Context, what string, ids []string) {
	for _, id := range ids[:min(len(ids), 5)] {
		rows, err := e.pool.Query(ctx, `
			SELECT 'delivery ' || d.id || ' ' || d.status || ' attempts ' || d.attempt_count || ' owner ' || coalesce(d.lease_owner, '-') ||
			       ' created ' || d.created_at::text || ' updated ' || d.updated_at::text || ' delivered ' || coalesce(d.delivered_at::text, '-') ||
			       ' committed ' || coalesce(ev.committed_at::text, '-') || ' ingested ' || ev.ingested_at::text
			FROM postbox.events ev JOIN postbox.deliveries d ON d.event_pk = ev.id WHERE ev.event_id = $1::uuid
			UNION ALL
			SELECT 'attempt of ' || a.delivery_id || ' #' || a.attempt || ' ' || a.outcome || ' at ' || a.started_at::text ||
			       ' status ' || coalesce(a.status_code::text, '-') || ' by ' || a.instance || ' ' || coalesce(a.error, '')
			FROM postbox.events ev JOIN postbox.deliveries d ON d.event_pk = ev.id JOIN postbox.all_attempts a ON a.delivery_id = d.id
			WHERE ev.event_id = $1::uuid`, id)
		if err != nil {
			fmt.Fprintf(e.log, "bench: %s %s: %v\n", what, id, err)
			continue
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			fmt.Fprintf(e.log, "bench: %s %s: %v\n", what, id, err)
			continue
		}
		fmt.Fprintf(e.log, "bench: %s %s:\n  %s\n", what, id, strings.Join(lines, "\n  "))
	}
}

func errSuffix(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

// inject carries out fault f on the relay r or the server, including its
// own recovery (the relay started again, the database writable again).
func (e *env) inject(ctx context.Context, f *Fault, rng *rand.Rand, r *chaosRelay, start func(*chaosRelay) error, admin *pgxpool.Pool, db string) error {
	switch f.Kind {
	case faultKill:
		r.sample()
		r.mu.Lock()
		cmd, done := r.cmd, r.done
		r.cmd = nil
		r.mu.Unlock()
		f.Target = fmt.Sprintf("%s (pid %d)", r.name, cmd.Process.Pid)
		_ = cmd.Process.Kill()
		<-done
		sleep(ctx, time.Second)
		return start(r)
	case faultFreeze:
		r.mu.Lock()
		cmd := r.cmd
		r.mu.Unlock()
		d := 2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		f.Target = fmt.Sprintf("%s (pid %d) for %.1fs", r.name, cmd.Process.Pid, d.Seconds())
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		sleep(ctx, d)
		return cmd.Process.Signal(syscall.SIGCONT)
	case faultRestartFast, faultRestartImmediate:
		f.Target = "postgres"
		mode := pgtest.Fast
		if f.Kind == faultRestartImmediate {
			mode = pgtest.Immediate
		}
		return e.cluster.Restart(ctx, mode)
	case faultDropSlot:
		f.Target = "slot " + e.slot
		var err error
		// The relay may still be recreating the slot after an earlier
		// drop: under load PostgreSQL makes a new slot consistent only
		// when the transactions running at its start have ended and two
		// running-transactions records (the background writer logs one
		// every 15 s) say so, up to half a minute after the drop.
		for range 450 { // 45 s
			if _, err = admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.slot); err != nil {
				continue
			}
			if _, err = admin.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, e.slot); err == nil {
				return nil
			}
			// Busy (the relay reconnected first), or not there yet.
			sleep(ctx, 100*time.Millisecond)
		}
		return fmt.Errorf("drop the slot: %w", err)
	case faultReadOnly:
		d := 2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		f.Target = fmt.Sprintf("database %s for %.1fs", db, d.Seconds())
		if err := e.setReadOnly(ctx, admin, db, true); err != nil {
			return err
		}
		sleep(ctx, d)
		// Turning it off must happen whatever ctx says: the rest of the
		// run (and the drain) needs a writable database.
		return e.setReadOnly(context.WithoutCancel(ctx), admin, db, false)
	}
	return fmt.Errorf("unknown fault %q", f.Kind)
}

// setReadOnly sets default_transaction_read_only on database db and ends
// its sessions, so that the new ones (the relays reconnect) take it up.
func (e *env) setReadOnly(ctx context.Context, admin *pgxpool.Pool, db string, on bool) error {
	v := "off"
	if on {
		v = "on"
	}
	var err error
	for range 20 {
		if _, err = admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_read_only = `+v); err == nil {
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("set the database read-only %s: %w", v, err)
	}
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitStreaming waits until one relay streams from the slot.
func (e *env) waitStreaming(ctx context.Context) error {
	var active bool
	err := waitFor(ctx, time.Minute, 50*time.Millisecond, func() (bool, error) {
		// confirmed_flush_lsn is NULL while the slot is still being created.
		err := e.pool.QueryRow(ctx, `SELECT coalesce(bool_or(active AND confirmed_flush_lsn IS NOT NULL), false) FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&active)
		return active, err
	})
	if err != nil {
		return fmt.Errorf("wait for a relay to stream: %w", err)
	}
	if !active {
		return errors.New("no relay was streaming within a minute")
	}
	return nil
}

// produceChaos inserts rate events/s for d, each its own transaction, over
// endpoints; the last is the flapping one. Inserts that fail (the server
// down or read-only) are not committed and only counted; it returns how
// many failed, and how many were skipped because every producer was busy
// (waiting for a server that went away).
func (e *env) produceChaos(ctx context.Context, led *ledger, rate, endpoints int, d time.Duration) (failed, skipped int) {
	interval := time.Second / time.Duration(rate)
	total := int(d / interval)
	var mu sync.Mutex
	jobs := make(chan int, 256)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range jobs {
				ictx, cancel := context.WithTimeout(ctx, chaosInsertTimeout)
				id := outbox.NewEventID()
				_, err := e.pool.Exec(ictx, `INSERT INTO postbox.outbox`+insertSQL, id, fmt.Sprintf("ep-%d", i%endpoints), payload(i))
				cancel()
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					led.doubt(id) // it may have committed: looked up once the producers stop
					continue
				}
				led.commit(id)
			}
		})
	}
	start := time.Now()
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		if ctx.Err() != nil {
			break
		}
		select {
		case jobs <- i:
		default:
			skipped++
		}
	}
	close(jobs)
	wg.Wait()
	return failed, skipped
}

// chaosLogLevel, from POSTBOX_BENCH_RELAY_LOG ("error" when unset), is the
// chaos relays' log level; their logs go to the bench's standard error.
var chaosLogLevel = cmp.Or(os.Getenv("POSTBOX_BENCH_RELAY_LOG"), "error")

// chaosConfig is the relays' configuration: the bench's endpoints, the
// last of them flapping, with retries and breakers quick enough that every
// event arrives within the run.
func (e *env) chaosConfig(endpoints int) string {
	var b strings.Builder
	e.writeConfigHead(&b, "127.0.0.1:0", chaosLogLevel)
	// Changed from the defaults: retries every few seconds instead of
	// from 30 s to an hour, a breaker open for seconds instead of minutes,
	// and attempts enough that no event is dead-lettered by the faults.
	b.WriteString("defaults:\n  max_attempts: 1000\n  backoff_base: 500ms\n  backoff_cap: 5s\n  cooldown: 2s\n  max_cooldown: 10s\n")
	// Ingested outbox rows are kept for the run: an event reconciled from
	// them after a dropped slot has no committed_at, and its row's
	// transaction's commit time is its latency's start (env.commitTimes).
	b.WriteString("outbox_retention: 1h\n")
	b.WriteString("endpoints:\n")
	for i := range endpoints - 1 {
		fmt.Fprintf(&b, "  ep-%d:\n    url: %s/ep-%d\n", i, e.recv.URL, i)
	}
	fmt.Fprintf(&b, "  ep-%d:\n    url: %s/flap/ep-%d\n    timeout: %s\n", endpoints-1, e.recv.URL, endpoints-1, flapTimeout)
	return b.String()
}

// unrecorded returns those of ids (events that arrived at the receiver)
// not recorded delivered now, retrying for a few seconds while the
// database is still coming back; all of them when it does not answer.
func (e *env) unrecorded(ctx context.Context, ids []string) ([]string, error) {
	var out []string
	var err error
	_ = waitFor(ctx, 10*time.Second, 200*time.Millisecond, func() (bool, error) {
		var rows pgx.Rows
		if rows, err = e.pool.Query(ctx, `
			SELECT l.id::text FROM unnest($1::uuid[]) AS l(id)
			WHERE NOT EXISTS (SELECT 1 FROM postbox.events ev JOIN postbox.deliveries d ON d.event_pk = ev.id
			                  WHERE ev.event_id = l.id AND d.status = 'delivered')`, ids); err == nil {
			out, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		return err == nil, nil
	})
	if err != nil {
		return ids, fmt.Errorf("read which arrivals are recorded (all taken as not): %w", err)
	}
	return out, nil
}

// inFlightIDs returns the event ids of the deliveries in flight and of
// the events under way (none when the database does not answer).
func (e *env) inFlightIDs(ctx context.Context) []string {
	rows, err := e.pool.Query(ctx, `
		SELECT e.event_id::text FROM postbox.deliveries d JOIN postbox.events e ON e.id = d.event_pk
		WHERE d.status IN ('in_flight', 'failed') AND d.lease_owner IS NOT NULL -- a retry kept may be under way
		UNION ALL
		SELECT e.event_id::text FROM postbox.events_under_way u JOIN postbox.events e ON e.id = u.event_pk`)
	if err != nil {
		return nil
	}
	ids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	return ids
}

// union returns the distinct strings of a and b.
func union(a, b []string) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for _, s := range slices.Concat(a, b) {
		out[s] = true
	}
	return out
}

// inFlight counts the deliveries in flight and the events under way,
// retrying for a few seconds while the database is still coming back; -1
// when it does not answer.
func (e *env) inFlight(ctx context.Context) int {
	n := -1
	_ = waitFor(ctx, 10*time.Second, 200*time.Millisecond, func() (bool, error) {
		return e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM postbox.deliveries WHERE status IN ('in_flight', 'failed') AND lease_owner IS NOT NULL) +
			(SELECT count(*) FROM postbox.events_under_way)`).Scan(&n) == nil, nil
	})
	return n
}
