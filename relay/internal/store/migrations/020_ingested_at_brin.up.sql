-- events.ingested_at's B-tree wrote a WAL record per event for an order
-- the primary key already has: events are numbered as they are ingested.
-- Searches take their newest events by id and read the ones ingested
-- since a time through a BRIN index: events arrive in ingest order, so
-- each page range's times are close together, and its last, unsummarized
-- range takes new rows without a WAL record. The retention purge goes by
-- id (store.PurgeEvents): a range that retention empties and new events
-- refill keeps its old minimum. Built beside the B-tree, then swapped, as
-- in 019.
CREATE INDEX events_ingested_at_brin ON postbox.events USING brin (ingested_at);
DROP INDEX postbox.events_ingested_at;
ALTER INDEX postbox.events_ingested_at_brin RENAME TO events_ingested_at;
