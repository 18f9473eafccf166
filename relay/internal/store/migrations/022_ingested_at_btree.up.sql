-- Back to a B-tree for events.ingested_at (020 made it BRIN). Retention
-- deletes the oldest events and new ones refill their pages; a refilled
-- page range keeps its old minimum and takes a recent maximum, so after a
-- retention period or two every range holds recent events and a search's
-- "ingested since" (telemetry's searchEventsSQL) would read the whole
-- table, where the B-tree reads what was ingested since. That is worth the
-- record per event the BRIN index saved. Built beside, then swapped, as
-- in 019.
CREATE INDEX events_ingested_at_btree ON postbox.events (ingested_at);
DROP INDEX postbox.events_ingested_at;
ALTER INDEX postbox.events_ingested_at_btree RENAME TO events_ingested_at;
