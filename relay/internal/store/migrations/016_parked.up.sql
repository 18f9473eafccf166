-- The queued deliveries of a lane whose circuit breaker is open are
-- parked: next_attempt_at = 'infinity' takes them out of the claim's
-- indexes, so a claim's skip scan visits only lanes that may deliver,
-- however many breakers are open. The breaker's probe finds them in
-- deliveries_parked; once it closes they are due again.
DROP INDEX postbox.deliveries_pending;
CREATE INDEX deliveries_pending ON postbox.deliveries ((coalesce(lane, endpoint)), next_attempt_at, id)
  WHERE status = 'pending' AND next_attempt_at < 'infinity';
DROP INDEX postbox.deliveries_retry;
CREATE INDEX deliveries_retry ON postbox.deliveries ((coalesce(lane, endpoint)), next_attempt_at, id)
  WHERE status = 'failed' AND next_attempt_at < 'infinity';
CREATE INDEX deliveries_parked ON postbox.deliveries ((coalesce(lane, endpoint)), id)
  WHERE status IN ('pending', 'failed') AND next_attempt_at = 'infinity';
