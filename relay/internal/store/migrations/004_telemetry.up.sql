-- Telemetry: the oldest undelivered event without a scan of the queue,
-- dead letters by time, and retention purges by age.
CREATE INDEX deliveries_undelivered ON postbox.deliveries (created_at)
  WHERE status IN ('pending', 'failed');
CREATE INDEX deliveries_dead_at ON postbox.deliveries (updated_at)
  WHERE status = 'dead_letter';
-- Delivered rows are purged by age (delivery_retention); delivered_at is
-- already indexed for them.
CREATE INDEX deliveries_replay_of ON postbox.deliveries (replay_of)
  WHERE replay_of IS NOT NULL;

-- Which instance streams, for `postbox status`.
ALTER TABLE postbox.instances ADD COLUMN streaming boolean NOT NULL DEFAULT false;

-- The alerts' last known state, so a change is logged once however many
-- instances evaluate them.
CREATE TABLE postbox.alerts (
  alert   text        NOT NULL,
  subject text        NOT NULL DEFAULT '', -- the endpoint, for per-endpoint alerts
  firing  boolean     NOT NULL,
  since   timestamptz NOT NULL DEFAULT now(),
  detail  text        NOT NULL DEFAULT '',
  PRIMARY KEY (alert, subject)
);
