-- The triggers of postbox.endpoints run as their owner (postbox's), so
-- that a role allowed to write endpoint rows (an application's, through
-- a trigger on its own table: docs/integration.md) needs neither USAGE
-- on the revision sequence nor INSERT on the change log: it cannot write
-- the log but through a change of a row. Running as the owner,
-- current_user is the owner: the actor is the session's role instead
-- (the role that logged in; SET ROLE does not hide it), unless
-- postbox.actor names one (the console's session).
CREATE OR REPLACE FUNCTION postbox.endpoint_stamp() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  NEW.revision := nextval('postbox.endpoint_revision');
  NEW.updated_at := now();
  IF TG_OP = 'INSERT' THEN
    NEW.created_at := now();
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION postbox.endpoint_log() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  who text := coalesce(nullif(current_setting('postbox.actor', true), ''), session_user);
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
