-- A retry an instance keeps (store.RecordResults with Keep): its row is
-- failed, as the operator should see it, and stays owned by the instance
-- that failed it (lease_owner), which attempts it again when due without
-- a claim. The queue's indexes leave such rows out, so the claim, the
-- parking and the next-retry probe never see them, and the owner index
-- takes them in, so a dead owner's are released with its claims.
DROP INDEX postbox.deliveries_retry;
CREATE INDEX deliveries_retry ON postbox.deliveries ((coalesce(lane, endpoint)), next_attempt_at, id)
  WHERE status = 'failed' AND next_attempt_at < 'infinity' AND lease_owner IS NULL;
DROP INDEX postbox.deliveries_next_retry;
CREATE INDEX deliveries_next_retry ON postbox.deliveries (next_attempt_at)
  WHERE status = 'failed' AND next_attempt_at < 'infinity' AND lease_owner IS NULL;
DROP INDEX postbox.deliveries_parked;
CREATE INDEX deliveries_parked ON postbox.deliveries ((coalesce(lane, endpoint)), id)
  WHERE status IN ('pending', 'failed') AND next_attempt_at = 'infinity' AND lease_owner IS NULL;
DROP INDEX postbox.deliveries_lease_owner;
CREATE INDEX deliveries_lease_owner ON postbox.deliveries (lease_owner, updated_at)
  WHERE status IN ('in_flight', 'failed') AND lease_owner IS NOT NULL;
