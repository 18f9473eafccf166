-- When each applied row was last written: a tombstone (a deleted
-- endpoint's JSON null) is purged once it is older than any instance
-- could still need it (see store.PurgeEndpointTombstones). Not indexed:
-- an index on a column every write changes would end the table's HOT
-- updates, and the leader's purge reads the table once a minute.
ALTER TABLE postbox.endpoint_state ADD COLUMN written_at timestamptz NOT NULL DEFAULT now();
