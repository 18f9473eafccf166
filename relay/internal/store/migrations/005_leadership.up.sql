-- Leadership: one instance streams the slot. It holds a lease on the
-- slot's checkpoint row and renews it; a standby takes over when the lease
-- runs out (the leader died, lost its connection, or froze), bumping the
-- fencing token. Checkpoint writes carry the token they were made under,
-- so a leader that wakes up from a freeze cannot move the checkpoint.
ALTER TABLE postbox.checkpoints
  ADD COLUMN leader           text,
  ADD COLUMN fencing          bigint      NOT NULL DEFAULT 0,
  ADD COLUMN lease_expires_at timestamptz;

-- save_checkpoint stores the end LSN of an ingested transaction, and the
-- server it came from, if the caller still holds leadership token p_fencing;
-- otherwise it raises PBF01 and the caller's whole ingest transaction
-- rolls back.
CREATE FUNCTION postbox.save_checkpoint(p_slot text, p_lsn pg_lsn, p_fencing bigint, p_system_id text, p_timeline integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  UPDATE postbox.checkpoints
  SET lsn = greatest(lsn, p_lsn), system_id = p_system_id, timeline = p_timeline, updated_at = now()
  WHERE slot = p_slot AND fencing = p_fencing;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postbox: checkpoint of slot % fenced off: another instance took over streaming (token %)', p_slot, p_fencing
      USING ERRCODE = 'PBF01';
  END IF;
END
$$;
