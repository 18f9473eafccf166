// Package wal reads the outbox's inserts from a logical replication slot
// (pgoutput, protocol 1, a publication of the outbox table with publish =
// 'insert') and manages the publication and the slot.
//
// Stream.Run is one session: IDENTIFY_SYSTEM, START_REPLICATION, then a
// receive loop with deadlines. Relation messages are cached per session
// and looked up by column name, so ALTER TABLE on the outbox is followed.
// Begin, Insert and Commit build each transaction's rows; everything else
// (Update, Delete, Truncate, Type, Origin, Message) is ignored, the
// position advancing with the commit or keepalive that follows.
// Transactions go to a Queue bounded by rows and bytes, in chunks, so a
// transaction of any size passes in bounded memory.
//
// The flushed position reported to the server is the consumer's durable
// LSN (Acker.Durable), never more, except when nothing is in progress: then
// it follows the server's WAL end, so a quiet outbox never pins WAL. The
// consumer is told how far the server's WAL is flushed: the walsender
// decodes only flushed WAL, so the WAL end in its keepalives and the
// position of each message are flushed positions.
// Keepalives that ask for a reply are answered at once; a status update
// goes out at least every StatusInterval and asks the server to reply, so a
// connection that silently stopped carrying data is noticed after
// StallTimeout.
//
// The LSN checkpoint, one row per slot in postbox.checkpoints, moves like
// this (the relay's ingester is the Acker):
//
//	  WAL ──stream──▶ received ──ingest commits──▶ durable ──status──▶ confirmed_flush_lsn
//	                     │        events + checkpoint             the server may now
//	                     │        in one transaction              recycle WAL below it
//	                     │
//	durable: committed, and flushed in the server's WAL; the ingest commits
//	without waiting for its flush, so its commit is durable once the server
//	reports a position past it (Acker.Durable is given the furthest)
//
//	crash before durable: nothing was confirmed; the next session starts from
//	the checkpoint and the server sends the transaction again; (event_id,
//	endpoint) is unique, so what was ingested is not ingested twice
//
//	nothing in progress: confirmed follows the server's WAL end
//	new session: START_REPLICATION at the checkpoint, unless the slot was
//	recreated or the server's system identifier or timeline changed; then
//	at the slot's own position, and the outbox table is reconciled
//
// Slot and publication names are validated by the caller (lower-case
// identifiers): the replication protocol does not quote them.
package wal
