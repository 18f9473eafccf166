// Package outbox is what an application imports to use postbox.
//
// The sending side is one row: Insert writes an Event into the outbox table
// inside the caller's own transaction (pgx.Tx or *sql.Tx), so the webhook is
// delivered if and only if the business transaction commits. schema.sql is
// the table's DDL for teams that run their own migrations.
//
// The receiving side verifies what postbox sends: Verify checks a Standard
// Webhooks signature (webhook-id, webhook-timestamp, webhook-signature) with
// a tolerance of five minutes either way against any of several secrets, so
// a key rotation needs no coordinated switch.
//
// This import path is stable: github.com/postbox-relay/postbox/outbox.
package outbox
