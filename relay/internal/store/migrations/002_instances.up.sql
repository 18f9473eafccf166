-- Instances: every running postbox registers here and heartbeats. A
-- delivery in flight belongs to its lease_owner for as long as that
-- instance's registration is current, so leases are renewed with one row
-- per instance instead of one update per claimed delivery; when an
-- instance dies (or freezes), its claims return to the queue.
CREATE TABLE postbox.instances (
  id           text        PRIMARY KEY,
  hostname     text        NOT NULL DEFAULT '',
  pid          integer     NOT NULL DEFAULT 0,
  version      text        NOT NULL DEFAULT '',
  started_at   timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL
);

DROP INDEX postbox.deliveries_lease;
CREATE INDEX deliveries_lease_owner ON postbox.deliveries (lease_owner)
  WHERE status = 'in_flight';

-- The lease is the owner's registration now, not a per-row deadline.
ALTER TABLE postbox.deliveries DROP COLUMN lease_expires_at;
