// Package bench is `postbox bench`: the measurements of postbox's performance targets, taken the
// way an operator would see them.
//
// Run starts its own PostgreSQL with fsync on (pgtest), an HTTP receiver on
// loopback, and the relay as a separate process — the postbox binary itself,
// `postbox run --config …` — so the relay's RSS and CPU are its own. The
// relay signs its deliveries as in production (the cost is part of the
// figures), and the receiver checks every signature with outbox.Verify: one
// that fails makes Run fail.
//
// The scenarios, run one after the other in the order given:
//
//   - latency: a paced stream (Options.Rate events/s for Options.Duration),
//     each event its own single-row transaction, spread over
//     Options.Endpoints endpoints. Measures commit → first arrival at the
//     receiver (p50, p90, p99, max), from postbox.events.committed_at, once
//     the relay has caught up with the WAL and after a warm-up: the same
//     stream for Options.Warmup, whose events are checked for loss but
//     not measured (env.warmUp). The floor and hanging scenarios warm up
//     the same way.
//   - floor: the latency scenario without postbox. A bare logical
//     replication client sends each row to the receiver, signed, as soon
//     as its transaction's Commit arrives: no ingest, no database writes,
//     no retries. It runs as a process of its own, as any relay does
//     (ServeBareClient; Options.FloorInProcess runs it in the bench's
//     process instead, beside the receiver, which hands it a receiver
//     already running and so a floor a little lower). Commit → arrival is
//     then what PostgreSQL (the commit's WAL flush, the walsender), one
//     HTTP request and the machine's scheduling cost alone: the floor
//     under any relay's latency here. Run beside latency (`--scenario latency,floor`), the
//     difference is postbox's share. When the bench started the cluster,
//     the floor then times the disk under it alone: an 8 kB page written
//     and datasynced in the cluster's directory at the same pace, as a
//     single-row commit's WAL flush is (diskFlush).
//   - hanging: the latency scenario with one endpoint that never answers;
//     the figures are the healthy endpoints' (the hanging one's events are
//     not expected). It shows whether one stuck endpoint slows the others.
//   - failing: 200 events for an endpoint that answers only 500, for 30 s;
//     counts the requests it gets — what the circuit breaker saves.
//   - catchup: Options.Backlog events queued while the relay is down, one
//     event a transaction from Options.Producers producers (as an
//     application commits its events), then the relay started; measures
//     deliveries/s from relay start and from the first delivery to the
//     last, and the relay's peak RSS. Its output and JSON name the
//     transaction size (events_per_transaction).
//   - catchup-bulk: the same backlog written in transactions of 1,000 rows,
//     one after the other, which the relay ingests by its bulk-copy path
//     (`--scenario catchup,catchup-bulk` gives both, named).
//   - load: Options.Producers producers inserting single-row transactions
//     as fast as they commit for Options.Duration, first into an
//     unpublished copy of the outbox (the machine's rate without the
//     relay), then with the relay running; samples the lag (committed, not
//     yet received) every second and measures how long it takes to drain.
//   - load-floor: the load scenario without postbox, as floor is the
//     latency scenario's: the same producers insert into the floor's table
//     and the bare logical client forwards each row. On a small machine
//     the walsender waits for a CPU beside the producers' backends; this
//     is what that wait and one HTTP request cost with nothing else
//     competing. Run beside load (`--scenario load,load-floor`), the
//     difference is postbox's share of the tail. Options.WalsenderNice
//     (--walsender-nice) gives the walsender of either a scheduling weight
//     (the relay's through its walsender_nice, the bare client's through
//     weighWalsender): with it the walsender keeps up under that load.
//
// The latency and load scenarios also split the latency before the
// request left at the stream's receipt of the row, from the relay's own
// histograms (postbox_commit_to_stream_seconds, the database's share, of
// which postbox_commit_to_send_seconds is the server's until it sent the
// commit, and postbox_stream_to_attempt_seconds, the relay's), read from
// its /metrics at the start and the end: their quantiles are bucket bounds.
// The floor splits its own the same way, from its exact timings: each
// transaction's commit, the server's send of its Commit message (the time
// in the message's header) and its receipt, and each row's request.
// Every scenario with costs also says how often the machine itself stood
// still for 40 ms or more meanwhile (hostWatch): a VM its host throttles
// stops as a whole, and every event committed just before waits it out.
//   - chaos: ChaosRelays relays against one PostgreSQL (always the bench's
//     own: it is restarted) under a paced stream (Options.Rate, default
//     ChaosRateDefault, events/s for Options.Duration) over
//     Options.Endpoints endpoints, the last of which flaps through healthy,
//     answering 500 and hanging past its 2 s timeout, 5 s each. At moments
//     drawn from a PCG seeded with Options.Seed (printed; random when
//     zero) it injects a fault, the kinds shuffled in rounds so that each
//     comes once before any comes again: a relay killed with SIGKILL and
//     started again a second later; a relay frozen with SIGSTOP for 2–5 s;
//     PostgreSQL restarted fast, or immediately (crash recovery); the slot
//     dropped after its walsender is terminated; the database made
//     read-only for 2–5 s (ALTER DATABASE … SET
//     default_transaction_read_only and its sessions terminated, then the
//     same undone). Each fault is followed by a pause of 2–5 s. Inserts that
//     fail meanwhile are not committed, only counted. When the producers
//     stop it waits up to 3 minutes for every committed event, then
//     reports the faults, lost events (the run fails if any), duplicates
//     against their bound — for each fault, the events exposed to it (in
//     flight just before it, or arrived in the 5 s before it or while it
//     was injected and not recorded delivered once it was recovered from,
//     each once), and for a fault of the database also those that
//     arrived while it lasted, as their results may not have been
//     recordable, or if more the deliveries in flight once it was
//     recovered from; each fault's checked — the longest commit →
//     delivery (the steady endpoints' within ChaosSteadyWithin, 10 s, or
//     the run fails) and the relays' peak RSS. --faults limits the faults to some kinds, --relays sets
//     how many relays run. The relays retry within seconds rather than the defaults'
//     minutes (see chaosConfig), so that every event can arrive in time.
//
// Lost and duplicated deliveries are counted by event id. Producers choose
// each event's id and record it once they saw its INSERT commit (recorded
// only after the statement's commit returned OK); the receiver records
// each id it gets (the webhook-id header). An insert that errored or timed
// out may have committed all the same: its id is looked up in the database
// once the producers stop (env.resolve), and one found is expected like
// any other. An event is lost when its id was committed and never arrived
// — every committed id is checked — and each delivery of an id after its
// first is a duplicate. An id that arrives without its commit having been
// acknowledged to the producer (a commit whose answer was lost) is
// reported as unacknowledged_delivered, not counted against the relay.
//
// Every received event has a latency: from its committed_at, or for an
// event the stream did not bring (reconciled from the outbox table after
// a lost slot) from its outbox row's transaction's commit time
// (pg_xact_commit_timestamp; the bench's own server runs with
// track_commit_timestamp on). Each scenario that measures latency prints
// measured/received, and Run fails when they differ. Run fails (with the
// figures, and `postbox bench` exits non-zero) on events lost in any
// scenario, dead's and the floors' included; on duplicates above their
// bound: none in a scenario without faults, and in chaos, for each fault,
// the attempts in flight at it (Fault.dupBound; a repeat is the fault's
// that exposed its event, see attributeDups); and on chaos's steady
// endpoints slower than ChaosSteadyWithin.
//
// For performance work, environment variables of the bench's shell
// (POSTBOX_* variables never reach the relay itself) write diagnostics to
// files: POSTBOX_BENCH_CPUPROFILE and POSTBOX_BENCH_MEMPROFILE the relay's
// CPU and allocation profiles (`postbox run --cpuprofile`, `--memprofile`);
// POSTBOX_BENCH_STATEMENTS the statements that cost the server most, with
// their mean and longest runs (pg_stat_statements); POSTBOX_BENCH_WALRECORDS
// the WAL records per event by kind and relation (pg_walinspect);
// POSTBOX_BENCH_LATENCIES each event's commit time and latency, in commit
// order (the floor scenarios' to the same name with ".floor" added). POSTBOX_BENCH_PGSETTINGS ("name=value;name=value") adds settings to
// the bench's own server, to log its slow statements, autovacuum and
// checkpoints with their times beside those latencies, for instance.
// POSTBOX_BENCH_RELAY_LOG sets the chaos relays' log level (error by
// default); their logs go to the bench's standard error.
package bench
