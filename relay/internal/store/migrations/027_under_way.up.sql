-- Ranges of events whose deliveries an instance holds in memory and has
-- not written yet (the deliveries an instance alone keeps): their rows are
-- written once, when their attempts end, instead of in flight at ingest
-- and updated at the end. A range belongs to its owner while the owner
-- lives; once it is dead, the sweep deletes the range and gives a pending
-- delivery to each of its events that has none.
CREATE TABLE postbox.under_way (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  owner       text        NOT NULL,
  first_event bigint      NOT NULL,
  last_event  bigint      NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX under_way_owner ON postbox.under_way (owner);

-- The events under way: in flight in an instance's memory, without a
-- delivery row yet. Readers count them in flight (postbox status, the
-- endpoints' queues, an event's story, searches for in_flight). The plan
-- starts from the few ranges and reads each one's events by primary key
-- (the lateral subquery's OFFSET keeps the planner from flattening it into
-- a scan of all events and deliveries).
CREATE VIEW postbox.events_under_way AS
SELECT e.id AS event_pk, e.endpoint, e.ingested_at, u.owner
FROM postbox.under_way u
CROSS JOIN LATERAL (
  SELECT e.id, e.endpoint, e.ingested_at FROM postbox.events e
  WHERE e.id BETWEEN u.first_event AND u.last_event
    AND NOT EXISTS (SELECT 1 FROM postbox.deliveries d WHERE d.event_pk = e.id)
  OFFSET 0
) e;
