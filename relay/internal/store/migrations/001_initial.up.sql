-- postbox's own schema: the event log, the delivery queue, latency samples,
-- endpoint health and the replication checkpoint.

-- Where ingestion stands: the end LSN of the last outbox transaction whose
-- events are durably in postbox.events, per slot.
CREATE TABLE postbox.checkpoints (
  slot       text        PRIMARY KEY,
  lsn        pg_lsn      NOT NULL DEFAULT '0/0',
  system_id  text,
  timeline   integer,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every ingested event, kept for event_retention so replays work after the
-- slot has moved on. (event_id, endpoint) is unique: a transaction streamed
-- twice, or an outbox row found by reconciliation too, is ingested once.
CREATE TABLE postbox.events (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id     uuid        NOT NULL,
  endpoint     text        NOT NULL,
  url          text,
  event_type   text        NOT NULL DEFAULT '',
  payload      jsonb       NOT NULL,
  headers      jsonb,
  created_at   timestamptz NOT NULL,
  outbox_id    bigint,
  commit_lsn   pg_lsn,      -- NULL when found by reconciliation
  committed_at timestamptz,
  ingested_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT events_event_endpoint UNIQUE (event_id, endpoint)
);
CREATE INDEX events_commit_lsn ON postbox.events (commit_lsn);
CREATE INDEX events_ingested_at ON postbox.events (ingested_at);

-- The delivery queue. One row per delivery of an event; a replay adds a row.
--   pending     waiting for its first attempt
--   in_flight   claimed by lease_owner until lease_expires_at
--   failed      awaiting a retry at next_attempt_at
--   delivered   done
--   dead_letter given up: last_error says why
CREATE TABLE postbox.deliveries (
  id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_pk         bigint      NOT NULL,
  endpoint         text        NOT NULL,
  status           text        NOT NULL
    CHECK (status IN ('pending', 'in_flight', 'delivered', 'failed', 'dead_letter')),
  attempt_count    integer     NOT NULL DEFAULT 0,
  next_attempt_at  timestamptz NOT NULL DEFAULT now(),
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  delivered_at     timestamptz,
  commit_to_delivery_ms integer,
  last_error       text,
  last_status_code integer,
  last_response_ms integer,
  last_response    text,        -- the start of the last response body
  lease_owner      text,
  lease_expires_at timestamptz,
  replay_of        bigint
);
-- Claims: due rows per endpoint, in due order.
CREATE INDEX deliveries_due ON postbox.deliveries (endpoint, next_attempt_at, id)
  WHERE status IN ('pending', 'failed');
-- Expired leases return to the queue.
CREATE INDEX deliveries_lease ON postbox.deliveries (lease_expires_at)
  WHERE status = 'in_flight';
CREATE INDEX deliveries_event ON postbox.deliveries (event_pk);
-- At most one live delivery per event: a replay cannot double an event
-- that is still queued.
CREATE UNIQUE INDEX deliveries_live ON postbox.deliveries (event_pk)
  WHERE status IN ('pending', 'in_flight', 'failed');
CREATE INDEX deliveries_dead ON postbox.deliveries (endpoint, updated_at)
  WHERE status = 'dead_letter';
CREATE INDEX deliveries_delivered_at ON postbox.deliveries (delivered_at)
  WHERE status = 'delivered';

-- One sample per attempt, kept 24 hours: the source of percentiles.
CREATE TABLE postbox.latency_samples (
  endpoint    text        NOT NULL,
  response_ms integer     NOT NULL,
  status_code integer,
  outcome     text        NOT NULL,
  measured_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX latency_samples_endpoint ON postbox.latency_samples (endpoint, measured_at);
CREATE INDEX latency_samples_measured_at ON postbox.latency_samples USING brin (measured_at);

-- Per-endpoint health: the circuit breaker and latency statistics.
CREATE TABLE postbox.endpoint_health (
  endpoint             text        PRIMARY KEY,
  state                text        NOT NULL DEFAULT 'closed'
    CHECK (state IN ('closed', 'open', 'half_open')),
  consecutive_failures integer     NOT NULL DEFAULT 0,
  failure_threshold    integer,
  cooldown_seconds     integer     NOT NULL DEFAULT 300,
  opened_at            timestamptz,
  last_success_at      timestamptz,
  last_failure_at      timestamptz,
  last_error           text,
  last_status_code     integer,
  p50_ms               integer,
  p95_ms               integer,
  p99_ms               integer,
  sample_count         integer     NOT NULL DEFAULT 0,
  stats_at             timestamptz
);
