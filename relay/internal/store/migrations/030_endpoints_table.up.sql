-- Endpoints as data: one row per endpoint, keyed by name, each column
-- named as its key in the configuration file; NULL inherits the file's
-- defaults (never defaults.headers or its secrets: whoever may write a
-- row could point it at a host of their own). What SQL can refuse, the
-- constraints refuse; what only postbox can judge (a template that does
-- not parse, a header postbox sets itself) makes the endpoint invalid,
-- and its events wait for a corrected row.
CREATE TABLE postbox.endpoints (
  name                  text        PRIMARY KEY CHECK (name <> '' AND octet_length(name) <= 200),
  url                   text,
  method                text        CHECK (upper(method) IN ('GET', 'POST', 'PUT', 'PATCH')),
  body                  text,
  headers               jsonb       CHECK (jsonb_typeof(headers) = 'object'),
  timeout               interval    CHECK (timeout > interval '0'),
  max_attempts          integer     CHECK (max_attempts >= 1),
  backoff_base          interval    CHECK (backoff_base > interval '0'),
  backoff_cap           interval    CHECK (backoff_cap > interval '0'),
  failure_threshold     integer     CHECK (failure_threshold >= 1),
  cooldown              interval    CHECK (cooldown > interval '0'),
  max_cooldown          interval    CHECK (max_cooldown > interval '0'),
  rate_limit            text,
  max_in_flight         integer     CHECK (max_in_flight >= 1),
  success               jsonb       CHECK (jsonb_typeof(success) = 'object'),
  retry_on              integer[],
  ordered               boolean,
  redact_path           jsonb       CHECK (jsonb_typeof(redact_path) IN ('boolean', 'array')),
  allow_row_url         boolean,
  row_url_hosts         text[],
  enabled               boolean     NOT NULL DEFAULT true,
  -- Routing by subscription: rows without an endpoint go to every enabled
  -- endpoint subscribed to their event_type (exact names, or prefix.*),
  -- narrowed by filter (JSON containment of the payload).
  event_types           text[],
  filter                jsonb       CHECK (jsonb_typeof(filter) = 'object'),
  -- Signing: the secret derived for the endpoint's name (version n > 1
  -- derives for "name/n"), the previous version signing too until
  -- previous_secret_until; or a secret the configuration declares by
  -- name (signing.named). No secret is ever stored here.
  secret                text,
  secret_version        integer     NOT NULL DEFAULT 1 CHECK (secret_version >= 1),
  previous_secret_until timestamptz,
  -- revision orders the changes of one row (a row is locked while it
  -- changes, so they are numbered in commit order); attempts record the
  -- revision they used.
  revision              bigint      NOT NULL DEFAULT 0,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now()
);

-- A delete streams its whole old row, revision included, so that it is
-- applied only over what it deleted.
ALTER TABLE postbox.endpoints REPLICA IDENTITY FULL;

CREATE SEQUENCE postbox.endpoint_revision;

-- Every change, who made it (the console names its session in
-- postbox.actor; otherwise the database role) and the row before and
-- after: postbox endpoints history, and the console's.
CREATE TABLE postbox.endpoint_changes (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name       text        NOT NULL,
  op         text        NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
  revision   bigint      NOT NULL,
  actor      text        NOT NULL,
  changed_at timestamptz NOT NULL DEFAULT now(),
  old        jsonb,
  new        jsonb
);
CREATE INDEX endpoint_changes_name ON postbox.endpoint_changes (name, id);

CREATE FUNCTION postbox.endpoint_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.revision := nextval('postbox.endpoint_revision');
  NEW.updated_at := now();
  IF TG_OP = 'INSERT' THEN
    NEW.created_at := now();
  END IF;
  RETURN NEW;
END $$;

CREATE FUNCTION postbox.endpoint_log() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  who text := coalesce(nullif(current_setting('postbox.actor', true), ''), current_user);
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO postbox.endpoint_changes (name, op, revision, actor, old)
    VALUES (OLD.name, 'delete', nextval('postbox.endpoint_revision'), who, to_jsonb(OLD));
    RETURN OLD;
  END IF;
  INSERT INTO postbox.endpoint_changes (name, op, revision, actor, old, new)
  VALUES (NEW.name, lower(TG_OP), NEW.revision, who,
          CASE WHEN TG_OP = 'UPDATE' THEN to_jsonb(OLD) END, to_jsonb(NEW));
  RETURN NEW;
END $$;

CREATE TRIGGER endpoint_stamp BEFORE INSERT OR UPDATE ON postbox.endpoints
  FOR EACH ROW EXECUTE FUNCTION postbox.endpoint_stamp();
CREATE TRIGGER endpoint_log AFTER INSERT OR UPDATE OR DELETE ON postbox.endpoints
  FOR EACH ROW EXECUTE FUNCTION postbox.endpoint_log();

-- The endpoints as the streaming instance applied them, in commit order,
-- written in the transaction that ingests the events after them: every
-- other instance reads them from here (woken by NOTIFY), and never
-- attempts an event before it has read every change up to the event's
-- commit (checkpoints.endpoints_lsn). row holds the columns' text as the
-- stream sent it. The table itself cannot serve: a commit can be streamed
-- before it is visible to other sessions (synchronous replication waits
-- in between).
CREATE TABLE postbox.endpoint_state (
  name     text   PRIMARY KEY,
  row      jsonb  NOT NULL,
  revision bigint NOT NULL,
  lsn      pg_lsn NOT NULL
);

-- endpoints_lsn: the commit of the last endpoint change applied;
-- endpoints_seeded: endpoint_state was copied whole from the table once
-- for this slot (again after a reconciliation), so the stream's changes
-- complete it.
ALTER TABLE postbox.checkpoints
  ADD COLUMN endpoints_lsn    pg_lsn  NOT NULL DEFAULT '0/0',
  ADD COLUMN endpoints_seeded boolean NOT NULL DEFAULT false;
