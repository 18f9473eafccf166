-- Every WAL record costs the walsender a turn of its loop (it reads every
-- record of the server and polls its client's socket once per record),
-- and every index entry is a record. events.commit_lsn is only ever
-- searched from an LSN onwards (replay --from-lsn), and events arrive in
-- commit order, so a BRIN index serves that range: its last, unsummarized
-- page range takes new rows without a WAL record, where the B-tree wrote
-- one per event. A range that retention empties and new events refill
-- keeps its old minimum, but a search from an LSN reads the maximum, which
-- stays right. Building it reads the table once, and ingest waits for that
-- (a sequential scan: seconds for millions of events); readers of events
-- (claims, searches) wait only for the drop and the rename after it.
CREATE INDEX events_commit_lsn_brin ON postbox.events USING brin (commit_lsn);
DROP INDEX postbox.events_commit_lsn;
ALTER INDEX postbox.events_commit_lsn_brin RENAME TO events_commit_lsn;
