-- The deliveries an instance holds in flight, by when they last changed:
-- the claimer's look for claims it lost track of (StaleOwned) asks for
-- its own older than ten seconds, and with the owner alone in the key it
-- read every delivery the instance held, a whole catch-up's backlog, to
-- test each one's age (80 ms, twice a catch-up). The entries are the same
-- ones, in flight only: no write costs more. Built beside, then swapped,
-- as in 019.
CREATE INDEX deliveries_lease_owner_updated ON postbox.deliveries (lease_owner, updated_at)
  WHERE status = 'in_flight';
DROP INDEX postbox.deliveries_lease_owner;
ALTER INDEX postbox.deliveries_lease_owner_updated RENAME TO deliveries_lease_owner;
