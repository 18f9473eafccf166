-- Endpoint protection: the circuit breaker's probe, pauses asked for by
-- receivers (429 / Retry-After), token buckets, and claim indexes that keep
-- first attempts and retries apart.

ALTER TABLE postbox.endpoint_health
  ADD COLUMN probe_owner      text,         -- the instance probing a half-open breaker
  ADD COLUMN probe_started_at timestamptz,
  ADD COLUMN paused_until     timestamptz,  -- no attempts before this (429, Retry-After)
  -- sub-second cooldowns (tests, fast-recovering receivers) must survive
  ALTER COLUMN cooldown_seconds TYPE double precision;

-- One token bucket per rate-limited endpoint, shared by every instance.
CREATE TABLE postbox.rate_buckets (
  endpoint   text             PRIMARY KEY,
  tokens     double precision NOT NULL,
  granted    integer          NOT NULL DEFAULT 0, -- the last call's grant
  updated_at timestamptz      NOT NULL DEFAULT now()
);

-- First attempts and retries are claimed side by side, so a retry backlog
-- cannot starve new events (nor the reverse): each needs its own index.
DROP INDEX postbox.deliveries_due;
CREATE INDEX deliveries_pending ON postbox.deliveries (endpoint, next_attempt_at, id)
  WHERE status = 'pending';
CREATE INDEX deliveries_retry ON postbox.deliveries (endpoint, next_attempt_at, id)
  WHERE status = 'failed';

-- Ordered endpoints deliver their oldest live delivery first.
CREATE INDEX deliveries_live_order ON postbox.deliveries (endpoint, id)
  WHERE status IN ('pending', 'in_flight', 'failed');
