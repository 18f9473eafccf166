-- Each attempt records the request target exactly as sent: the URL with
-- its query (a partner's click id, its own parameters) and the path as
-- it was before redact_path, beside target (scheme://host/path, redacted,
-- what the log and the operator's pages show). It is the partner's own
-- data, kept like the payload: shown in the partner's portal, to the
-- operator subject to log_payloads and redact_path, never logged. NULL
-- when it is target itself (no query, nothing redacted: most attempts),
-- so it costs nothing there. A first attempt kept on its delivery's row
-- (migration 026) keeps it in attempt_sent.
ALTER TABLE postbox.attempts ADD COLUMN sent text;
ALTER TABLE postbox.deliveries ADD COLUMN attempt_sent text;

CREATE OR REPLACE VIEW postbox.all_attempts AS
SELECT delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
       error_class, error, response, target, instance, endpoint_revision, coalesce(sent, target) AS sent
FROM postbox.attempts
UNION ALL
SELECT id, endpoint, 1, delivered_at - last_response_ms * interval '1 millisecond', last_response_ms,
       last_status_code, 'delivered', NULL, last_error, last_response, attempt_target, attempted_by, attempt_revision,
       coalesce(attempt_sent, attempt_target)
FROM postbox.deliveries
WHERE status = 'delivered' AND attempted_by IS NOT NULL;
