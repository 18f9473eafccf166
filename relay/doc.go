// Package relay is postbox as a library: New, Start, Stop.
//
// # Services and their goroutines
//
// Relay is a composition root: Start builds the services below, starts
// them in this order, and Stop stops them in reverse, each returning only
// when all of its goroutines have.
//
//	service                 goroutines it owns
//	admin listener          Serve (joined after Shutdown); the console's
//	                        pages run on its request goroutines
//	internal/endpointsync   the LISTEN loop and the poll loop of the
//	                        applied endpoints (postbox.endpoint_state)
//	internal/record         the recording loop
//	internal/claim          the claim loop, the LISTEN loop
//	internal/dispatch       the attempt goroutines: one per attempt in
//	                        flight, each making the next one handed to
//	                        it until idle for 5 s
//	internal/ingest         the stream loop; per session the lease keeper,
//	                        the ingester and the reconciler
//	internal/maintain       one loop per duty: heartbeat, rescuer,
//	                        outbox purger, telemetry, percentiles,
//	                        retention, idle lanes, walsender watch,
//	                        secrets watcher
//
// internal/protect (breakers, pauses, rate limits) and internal/execute
// (one attempt) own none: the dispatcher's goroutines run them. Services
// share one internal/service.Env (store, current configuration, logger,
// clock, metrics, and the database faults each part reports: the first
// report of a cause is logged once, and /readyz, /status and the
// instance's heartbeat carry it until the parts that met it succeed
// again) and talk through small interfaces, never through Relay.
//
// # The path of an event
//
//	application tx ──commit──▶ WAL ──pgoutput──▶ wal.Stream ──Queue──▶ ingester
//	                                                                   │
//	      ┌──────────── one transaction of postbox's schema ───────────┤
//	      │  INSERT events + deliveries (in_flight when the endpoint's │
//	      │  lane had room, else pending; dead_letter for bad input)   │
//	      │        ── fast path: hand the in_flight ones to the ───────┼──▶ dispatch lanes ──▶ HTTP
//	      │           dispatcher now, while the rest commits           │        ▲
//	      │  checkpoint := commit end LSN; DELETE the outbox rows      │        │ claims (FOR UPDATE
//	      └─ COMMIT ──▶ durable LSN ──▶ reported to PostgreSQL as flushed      │ SKIP LOCKED) for pending
//	                                                                            │ rows, due retries, other
//	  results (batched) ──▶ deliveries, attempts, endpoint health        ◀─────┘ instances' work
//
// # The LSN checkpoint
//
// The position confirmed to PostgreSQL never passes what is durable in
// postbox's own tables:
//
//	received ──(Commit)──▶ queued ──(ingest COMMIT)──▶ durable ──(status update)──▶ confirmed
//	                                                      │
//	               nothing queued and no transaction open ┴─▶ confirmed := server WAL end
//
// A crash between ingest and confirmation makes the server send those
// transactions again; they are recognised by the checkpoint (their commit
// lies before it) and skipped, and the unique (event_id, endpoint) key
// makes any that slip through harmless. A crash before the ingest
// committed loses nothing either: the server still has the WAL. Only
// attempts that had started (the fast path starts them while the ingest
// commits) may then be repeated.
//
// # Leases
//
// A delivery in flight belongs to the instance named in lease_owner for as
// long as that instance is alive. It heartbeats every second on a
// connection it holds for its whole life and registers that connection's
// backend, and its process (host, boot id, pid namespace, pid and start
// time). When the process dies (kill -9, OOM), the connection ends with
// it; a host that vanishes is noticed by the server's TCP keepalives
// within seconds. But a connection cut while its process lives looks the
// same, so the other instances return its deliveries to the queue only
// once it has not heartbeated for a grace and they have seen it gone for
// a grace more (the heartbeat rule). An instance of the same host, boot
// and pid namespace can prove more: when the registered pid no longer
// runs the registered process (a pid taken by another process since
// started at another time), the instance is gone for good, and its
// deliveries and its stream's lead are taken back at once; a restarted
// instance does so for its predecessor at its first look. Other hosts,
// and other systems than Linux, prove nothing and wait for the rule. A
// frozen instance keeps its connection, so its deliveries return when its
// registration's lease runs out. A late result of an instance whose
// deliveries were returned is not written: the owner no longer matches.
//
// # Endpoint protection
//
// Each endpoint has its own lane (max_in_flight attempts and a small
// buffer), its own circuit breaker (see policy.Breaker; shared by all
// instances through postbox.endpoint_health, with exactly one probe when
// half-open), its own token bucket (shared through postbox.rate_buckets),
// and its own pause when a receiver answers 429 or Retry-After. Held-back
// events wait in the queue without spending attempts.
package relay
