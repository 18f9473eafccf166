-- A delivery that delivered at its first attempt keeps that attempt on its
-- own row instead of a row in postbox.attempts: the recorder's update
-- writes what the attempt row held and the delivery did not (where it was
-- sent, which instance sent it) beside its status code, response time and
-- response, and the attempt's start is its delivered_at less its response
-- time. That is most attempts, and an attempt row cost a heap tuple and
-- two index entries, where this costs one. attempted_by is set only on
-- such rows: the mark that the delivery's attempt is on it.
ALTER TABLE postbox.deliveries ADD COLUMN attempt_target text, ADD COLUMN attempted_by text;

-- Those attempts by endpoint and time, as attempts_endpoint serves the
-- others: an endpoint's recent attempts, its exact percentiles.
CREATE INDEX deliveries_first_attempt ON postbox.deliveries (endpoint, delivered_at)
  WHERE status = 'delivered' AND attempted_by IS NOT NULL;

-- Every attempt, wherever it is kept: the rows of postbox.attempts and the
-- first attempts kept on their deliveries. For operators' queries; a
-- search by an attempt's time reads every attempt kept on a delivery
-- here (the start is computed), so postbox's own readers ask those by
-- delivered_at.
CREATE VIEW postbox.all_attempts AS
SELECT delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
       error_class, error, response, target, instance
FROM postbox.attempts
UNION ALL
SELECT id, endpoint, 1, delivered_at - last_response_ms * interval '1 millisecond', last_response_ms,
       last_status_code, 'delivered', NULL, last_error, last_response, attempt_target, attempted_by
FROM postbox.deliveries
WHERE status = 'delivered' AND attempted_by IS NOT NULL;
