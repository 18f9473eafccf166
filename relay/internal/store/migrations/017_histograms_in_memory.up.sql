-- The recorder counts its attempts' latency in memory and adds the counts
-- to the histograms once a second (store.RecordResults), instead of the
-- trigger upserting them with every batch of results; it says so in its
-- transaction. Other writers of attempts are still counted by the trigger.
DROP TRIGGER attempt_histogram_add ON postbox.attempts;
CREATE TRIGGER attempt_histogram_add AFTER INSERT ON postbox.attempts
  REFERENCING NEW TABLE AS new_attempts
  FOR EACH STATEMENT
  WHEN (current_setting('postbox.histograms', true) IS DISTINCT FROM 'in_memory')
  EXECUTE FUNCTION postbox.attempt_histogram_add();
