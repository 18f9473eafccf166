// Package ingest is the ingest supervisor: it keeps this instance
// streaming the slot when it holds the leadership lease and standing by
// when another instance does; sets up the publication and slot; runs one
// replication session after another with backoff; writes what each
// session brings into postbox.events and postbox.deliveries with the
// checkpoint, fenced by the lease's token; hands the deliveries it could
// reserve room for straight to the dispatcher (the fast path); and
// reconciles the outbox table when the slot is new or the server changed.
//
// The durable LSN, the position up to which outbox transactions are
// ingested, is a watermark: the stream reports it to PostgreSQL as
// flushed, and reconciliation waits on it.
//
// Every goroutine of a session (the lease keeper, the ingester, the
// reconciler) is joined before the session returns, and the supervisor's
// Stop returns only after the last session has.
package ingest
