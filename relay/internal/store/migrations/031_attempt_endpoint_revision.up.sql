-- Each attempt records the revision of its endpoint's row of
-- postbox.endpoints it was made under (NULL for an endpoint of the
-- configuration file or the defaults): which settings a partner was sent
-- with, as the change log names them. A first attempt kept on its
-- delivery's row (migration 026) keeps it there, in attempt_revision.
ALTER TABLE postbox.attempts ADD COLUMN endpoint_revision bigint;
ALTER TABLE postbox.deliveries ADD COLUMN attempt_revision bigint;

CREATE OR REPLACE VIEW postbox.all_attempts AS
SELECT delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
       error_class, error, response, target, instance, endpoint_revision
FROM postbox.attempts
UNION ALL
SELECT id, endpoint, 1, delivered_at - last_response_ms * interval '1 millisecond', last_response_ms,
       last_status_code, 'delivered', NULL, last_error, last_response, attempt_target, attempted_by, attempt_revision
FROM postbox.deliveries
WHERE status = 'delivered' AND attempted_by IS NOT NULL;
