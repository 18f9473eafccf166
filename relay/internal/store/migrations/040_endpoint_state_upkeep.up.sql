-- When each applied row was last written: a tombstone (a deleted
-- endpoint's JSON null) is purged once it is older than any instance
-- could still need it (see store.PurgeEndpointTombstones). Not indexed:
-- an index on a column every write changes would end the table's HOT
-- updates, and the leader's purge reads the table once a minute.
ALTER TABLE postbox.endpoint_state ADD COLUMN written_at timestamptz NOT NULL DEFAULT now();

-- A reconciliation owed now marks the endpoints' seed owed
-- (endpoints_seeded false) and the seed pays it. A debt an earlier
-- version recorded may not have been seeded for: seeded once more.
UPDATE postbox.checkpoints SET endpoints_seeded = false WHERE reconcile_pending;
