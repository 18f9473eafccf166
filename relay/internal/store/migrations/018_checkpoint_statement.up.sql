-- The ingest writes its checkpoint with a plain UPDATE instead of calling
-- postbox.save_checkpoint: the PL/pgSQL call cost more than the update
-- itself, once per ingested transaction. When the update finds no row
-- under the caller's fencing token, the statement calls this function,
-- which raises PBF01 as save_checkpoint does, and the caller's ingest
-- transaction rolls back. save_checkpoint stays for relays of the
-- previous version during a rolling upgrade.
CREATE FUNCTION postbox.checkpoint_fenced(p_slot text, p_fencing bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'postbox: checkpoint of slot % fenced off: another instance took over streaming (token %)', p_slot, p_fencing
    USING ERRCODE = 'PBF01';
END
$$;
