-- When the next retry falls due, whoever scheduled it (store.NextRetryIn):
-- an instance with nothing to do waits for it rather than for its sweep,
-- so another instance's retries are claimed when due by whoever is free.
-- deliveries_retry leads with the lane, so its earliest time across lanes
-- is a probe per lane; this is one probe. Same predicate as
-- deliveries_retry: failed rows only, an entry per retry scheduled (the
-- update writes a new version anyway), none for first attempts.
CREATE INDEX deliveries_next_retry ON postbox.deliveries (next_attempt_at)
  WHERE status = 'failed' AND next_attempt_at < 'infinity';
