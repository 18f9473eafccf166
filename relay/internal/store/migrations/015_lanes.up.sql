-- A delivery to a row's own URL is queued and protected in a lane of its
-- own: the endpoint's name and the URL's host (config.Config.Lane), so
-- one partner's hanging host does not hold up another's under the same
-- endpoint. NULL, as for every delivery to a configured URL, is the
-- endpoint's own lane: nothing is stored for it.
ALTER TABLE postbox.deliveries ADD COLUMN lane text;

-- The claim walks lanes, not names.
DROP INDEX postbox.deliveries_pending;
CREATE INDEX deliveries_pending ON postbox.deliveries ((coalesce(lane, endpoint)), next_attempt_at, id)
  WHERE status = 'pending';
DROP INDEX postbox.deliveries_retry;
CREATE INDEX deliveries_retry ON postbox.deliveries ((coalesce(lane, endpoint)), next_attempt_at, id)
  WHERE status = 'failed';
