-- postbox outbox table: the application's only integration point.
--
-- An application inserts one row here inside its own business transaction;
-- postbox streams the insert through logical replication and delivers it.
-- `postbox migrate` creates this table; teams that run their own
-- migrations can apply this file as it is. The columns are the contract.
CREATE SCHEMA IF NOT EXISTS postbox;

CREATE TABLE IF NOT EXISTS postbox.outbox (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id   uuid        NOT NULL DEFAULT gen_random_uuid(),
  endpoint   text,       -- NULL: every endpoint subscribed to event_type
  url        text,
  event_type text        NOT NULL DEFAULT '',
  payload    jsonb       NOT NULL DEFAULT '{}',
  headers    jsonb,
  created_at timestamptz NOT NULL DEFAULT now()
);
