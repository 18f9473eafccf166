-- Every attempt is kept: one row per HTTP request, with what it sent to
-- (scheme://host/path, never the query) and what came back. Attempts
-- replace the latency samples (one row per attempt either way) as the
-- source of percentiles and of the five-minute histograms, and are kept
-- for attempt_retention (7 days by default) rather than 24 hours.
CREATE TABLE postbox.attempts (
  delivery_id  bigint      NOT NULL DEFAULT 0, -- 0: unknown (samples carried over from before)
  endpoint     text        NOT NULL,
  attempt      integer     NOT NULL DEFAULT 0, -- the delivery's attempt number, from 1 (0: unknown)
  started_at   timestamptz NOT NULL DEFAULT now(),
  duration_ms  real        NOT NULL,
  status_code  integer,                   -- NULL when there was no response
  outcome      text        NOT NULL,      -- the delivery's state after it
  error_class  text,                      -- http_4xx, http_5xx, timeout, connection, …
  error        text,                      -- the reason, as last_error
  response     text,                      -- the first KiB of the body, redacted
  target       text,                      -- scheme://host/path
  instance     text        NOT NULL DEFAULT ''
);
CREATE INDEX attempts_delivery ON postbox.attempts (delivery_id);
CREATE INDEX attempts_endpoint ON postbox.attempts (endpoint, started_at);
CREATE INDEX attempts_started_at ON postbox.attempts USING brin (started_at);

-- The last 24 hours of samples, so percentiles go on where they were.
INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome)
SELECT 0, endpoint, 0, measured_at, response_ms, status_code, outcome FROM postbox.latency_samples;

-- The histograms count attempts now, in the statement that inserts them.
CREATE FUNCTION postbox.attempt_histogram_add() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
BEGIN
  INSERT INTO postbox.latency_histogram AS h (endpoint, bin, bucket, count)
  SELECT endpoint, postbox.latency_bin(started_at), postbox.latency_bucket(duration_ms), count(*)
  FROM new_attempts
  GROUP BY 1, 2, 3
  ORDER BY 1, 2, 3
  ON CONFLICT (endpoint, bin, bucket) DO UPDATE SET count = h.count + excluded.count;
  RETURN NULL;
END
$$;
CREATE TRIGGER attempt_histogram_add AFTER INSERT ON postbox.attempts
  REFERENCING NEW TABLE AS new_attempts
  FOR EACH STATEMENT EXECUTE FUNCTION postbox.attempt_histogram_add();

DROP TABLE postbox.latency_samples;
DROP FUNCTION postbox.latency_histogram_add();

-- Events carry the payload fields operators search by (search_keys),
-- extracted at ingest: containment lookups through one GIN index, and no
-- index entries at all while no key is configured (the column stays NULL).
ALTER TABLE postbox.events ADD COLUMN search jsonb;
CREATE INDEX events_search ON postbox.events USING gin (search jsonb_path_ops) WHERE search IS NOT NULL;
-- (An event's story finds it by event_id through events_event_endpoint;
-- the list, newest first, through events_ingested_at.)
