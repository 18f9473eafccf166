-- A dead letter that a replay has given a new delivery is no longer a dead
-- letter: it becomes 'replayed', keeps its history (errors, attempts, when
-- it died) and the new delivery points at it with replay_of. Counts,
-- alerts and analyses of dead letters see only those still waiting for
-- someone to act.
ALTER TABLE postbox.deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE postbox.deliveries ADD CONSTRAINT deliveries_status_check
  CHECK (status IN ('pending', 'in_flight', 'delivered', 'failed', 'dead_letter', 'replayed')) NOT VALID;
ALTER TABLE postbox.deliveries VALIDATE CONSTRAINT deliveries_status_check;
-- Replayed rows are purged by age like dead letters.
CREATE INDEX deliveries_replayed_at ON postbox.deliveries (updated_at)
  WHERE status = 'replayed';
