-- Partner portal (issue 53). A portal link is signed with the endpoint's
-- portal version; bumping it (postbox portal revoke) ends every link and
-- session of that partner at once. Keyed by name, so it serves endpoints
-- of the file and rows of postbox.endpoints alike; no row is version 0.
CREATE TABLE postbox.portal_versions (
  endpoint   text        PRIMARY KEY,
  version    integer     NOT NULL DEFAULT 0,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Each resend a partner made from its portal (portal.allow_replay): the
-- delivery it queued and the link it came through, so the timeline says
-- "replayed by partner" and the operator can tell which link did it.
CREATE TABLE postbox.portal_replays (
  delivery_id bigint      PRIMARY KEY,
  endpoint    text        NOT NULL,
  link_id     text        NOT NULL,
  at          timestamptz NOT NULL DEFAULT now()
);

-- A partner's deliveries, newest first, read an endpoint's events by
-- ingest time: without this index each page would scan every endpoint's.
-- It is on an expression, (endpoint || ''), that only the portal's reads
-- name: on the bare column the planner chose it for the ingest's lookup
-- of each row by (event_id, endpoint), while the table's statistics were
-- young, and read every event of the endpoint per row (PostgreSQL's CPU
-- per event tripled in postbox bench --scenario load).
CREATE INDEX events_endpoint_ingested ON postbox.events ((endpoint || ''), ingested_at);
