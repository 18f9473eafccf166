-- Whether an event was written with outbox.Emit (a logical decoding
-- message) rather than as an outbox row: such events are delivered only
-- while outbox_messages is on, which every attempt checks, a replay's too.
-- outbox_id IS NULL does not tell them apart: a table whose id is not an
-- integer has none either. Events ingested before this step read false.
-- A constant default: no rewrite of the table.
ALTER TABLE postbox.events ADD COLUMN message boolean NOT NULL DEFAULT false;
