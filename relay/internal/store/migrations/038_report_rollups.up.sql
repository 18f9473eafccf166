-- Daily reports per endpoint (postbox report, the partner portal) are
-- read from rollups that outlive the events (report_retention, 400 days
-- by default): per endpoint, quarter hour of commit (UTC) and event type,
-- the events committed, how many of them were delivered and how many are
-- dead letters, and the sums of the payload fields of report_sum. Quarter
-- hours, not days: every time zone in use is a whole number of quarter
-- hours from UTC, so a day in any of them is a set of whole buckets.
-- Pending is what is neither: committed - delivered - dead_lettered.
--
-- Triggers keep them exact in the statements that write the rows, so
-- every path (the ingest, the recorder, replays, the sweep) is counted
-- without knowing about it. An event counts once: delivered if any of
-- its deliveries was delivered, else dead-lettered while its latest
-- delivery is a dead letter (a replay takes it back to pending).
--
-- The triggers only append to report_deltas: were they to update a
-- bucket's row, the ingest and the recorder (and a reconciliation beside
-- the stream) would each hold that row's lock until their commit, and
-- wait for one another. The leader folds the deltas into report_buckets
-- every minute (store.CompactReport); readers add up both.
CREATE TABLE postbox.report_buckets (
  endpoint      text        NOT NULL,
  bucket        timestamptz NOT NULL,
  event_type    text        NOT NULL,
  committed     bigint      NOT NULL DEFAULT 0,
  delivered     bigint      NOT NULL DEFAULT 0,
  dead_lettered bigint      NOT NULL DEFAULT 0,
  sums          jsonb,
  PRIMARY KEY (endpoint, bucket, event_type)
);
CREATE INDEX report_buckets_bucket ON postbox.report_buckets USING brin (bucket);

CREATE TABLE postbox.report_deltas (
  endpoint      text        NOT NULL,
  bucket        timestamptz NOT NULL,
  event_type    text        NOT NULL,
  committed     bigint      NOT NULL DEFAULT 0,
  delivered     bigint      NOT NULL DEFAULT 0,
  dead_lettered bigint      NOT NULL DEFAULT 0,
  sums          jsonb
);
CREATE INDEX report_deltas_endpoint ON postbox.report_deltas (endpoint, bucket);

-- The payload fields summed (report_sum), written by the relay at start.
-- A field counts from the events ingested while it is listed.
CREATE TABLE postbox.report_fields (
  field text PRIMARY KEY
);

-- An event's time in reports: its commit, or its ingest when it was
-- found by reconciliation (no commit time).
CREATE FUNCTION postbox.report_bucket(committed_at timestamptz, ingested_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN date_bin('15 minutes', coalesce(committed_at, ingested_at), timestamptz '2000-01-01 00:00:00+00');

-- A payload field as a number: a JSON number, or a string holding one
-- ("12.50", as amounts are often sent); anything else is not summed.
CREATE FUNCTION postbox.report_number(v jsonb) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE jsonb_typeof(v)
  WHEN 'number' THEN v::numeric
  WHEN 'string' THEN CASE WHEN (v #>> '{}') ~ '^\s*-?[0-9]+(\.[0-9]+)?\s*$' THEN (v #>> '{}')::numeric END
END;

-- Two sums objects added field by field.
CREATE FUNCTION postbox.report_add(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN a IS NULL THEN b WHEN b IS NULL THEN a ELSE (
  SELECT jsonb_object_agg(k, coalesce((a ->> k)::numeric, 0) + coalesce((b ->> k)::numeric, 0))
  FROM (SELECT jsonb_object_keys(a) UNION SELECT jsonb_object_keys(b)) AS keys(k)) END;

-- Committed events and their sums, per statement of the ingest.
CREATE FUNCTION postbox.report_events_add() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_nestloop = on SET enable_seqscan = off AS $$
BEGIN
  INSERT INTO postbox.report_deltas (endpoint, bucket, event_type, committed, sums)
  SELECT g.endpoint, g.bucket, g.event_type, g.n, s.sums
  FROM (SELECT endpoint, postbox.report_bucket(committed_at, ingested_at) AS bucket, event_type, count(*) AS n
        FROM new_events GROUP BY 1, 2, 3) g
  LEFT JOIN (SELECT endpoint, bucket, event_type, jsonb_object_agg(field, total) AS sums
             FROM (SELECT e.endpoint, postbox.report_bucket(e.committed_at, e.ingested_at) AS bucket, e.event_type,
                          f.field, sum(postbox.report_number(e.payload -> f.field)) AS total
                   FROM new_events e CROSS JOIN postbox.report_fields f
                   GROUP BY 1, 2, 3, 4) t
             WHERE total IS NOT NULL
             GROUP BY 1, 2, 3) s USING (endpoint, bucket, event_type);
  RETURN NULL;
END $$;
CREATE TRIGGER report_events_add AFTER INSERT ON postbox.events
  REFERENCING NEW TABLE AS new_events
  FOR EACH STATEMENT EXECUTE FUNCTION postbox.report_events_add();

-- Outcomes: each delivery whose status changed (old_status NULL for a
-- row inserted), as changes to its event's counts. The lookups are by
-- key, row by row for the small statements of live traffic: the trigger
-- functions allow nested loops whatever the session set (the ingest
-- turns them off, store.IngestConn), and no scan of a whole table.
CREATE FUNCTION postbox.report_deliveries_insert() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_nestloop = on SET enable_seqscan = off AS $$
BEGIN
  WITH x AS MATERIALIZED (
      SELECT n.id, n.event_pk, NULL::text AS old_status, n.status
      FROM new_deliveries n
      WHERE n.status IN ('delivered', 'dead_letter')
  ),
  c AS (
    SELECT x.event_pk,
           CASE WHEN x.status = 'delivered' AND NOT o.other_delivered THEN 1 ELSE 0 END AS delivered,
           CASE WHEN o.other_delivered THEN 0
                WHEN x.status = 'dead_letter' THEN 1
                WHEN x.old_status = 'dead_letter' THEN -1 ELSE 0 END AS dead
    FROM x CROSS JOIN LATERAL (
      -- By the event's deliveries (deliveries_event), never by the
      -- partial index of all delivered ones, whatever the planner guesses.
      SELECT coalesce(bool_or(d.status = 'delivered'), false) AS other_delivered
      FROM postbox.deliveries d WHERE d.event_pk = x.event_pk AND d.id <> x.id
      OFFSET 0) o
  )
  INSERT INTO postbox.report_deltas (endpoint, bucket, event_type, delivered, dead_lettered)
  SELECT e.endpoint, postbox.report_bucket(e.committed_at, e.ingested_at), e.event_type,
         sum(c.delivered), sum(c.dead)
  FROM c JOIN postbox.events e ON e.id = c.event_pk
  GROUP BY 1, 2, 3
  HAVING sum(c.delivered) <> 0 OR sum(c.dead) <> 0;
  RETURN NULL;
END $$;
CREATE TRIGGER report_deliveries_insert AFTER INSERT ON postbox.deliveries
  REFERENCING NEW TABLE AS new_deliveries
  FOR EACH STATEMENT EXECUTE FUNCTION postbox.report_deliveries_insert();

CREATE FUNCTION postbox.report_deliveries_update() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_nestloop = on SET enable_seqscan = off AS $$
BEGIN
  WITH x AS MATERIALIZED (
      SELECT n.id, n.event_pk, o.status AS old_status, n.status
      FROM new_deliveries n JOIN old_deliveries o USING (id)
      WHERE n.status IS DISTINCT FROM o.status
        AND (n.status IN ('delivered', 'dead_letter') OR o.status = 'dead_letter')
  ),
  c AS (
    SELECT x.event_pk,
           CASE WHEN x.status = 'delivered' AND NOT o.other_delivered THEN 1 ELSE 0 END AS delivered,
           CASE WHEN o.other_delivered THEN 0
                WHEN x.status = 'dead_letter' THEN 1
                WHEN x.old_status = 'dead_letter' THEN -1 ELSE 0 END AS dead
    FROM x CROSS JOIN LATERAL (
      -- By the event's deliveries (deliveries_event), never by the
      -- partial index of all delivered ones, whatever the planner guesses.
      SELECT coalesce(bool_or(d.status = 'delivered'), false) AS other_delivered
      FROM postbox.deliveries d WHERE d.event_pk = x.event_pk AND d.id <> x.id
      OFFSET 0) o
  )
  INSERT INTO postbox.report_deltas (endpoint, bucket, event_type, delivered, dead_lettered)
  SELECT e.endpoint, postbox.report_bucket(e.committed_at, e.ingested_at), e.event_type,
         sum(c.delivered), sum(c.dead)
  FROM c JOIN postbox.events e ON e.id = c.event_pk
  GROUP BY 1, 2, 3
  HAVING sum(c.delivered) <> 0 OR sum(c.dead) <> 0;
  RETURN NULL;
END $$;
CREATE TRIGGER report_deliveries_update AFTER UPDATE ON postbox.deliveries
  REFERENCING OLD TABLE AS old_deliveries NEW TABLE AS new_deliveries
  FOR EACH STATEMENT EXECUTE FUNCTION postbox.report_deliveries_update();

-- The events kept so far, counted as the triggers would have.
INSERT INTO postbox.report_buckets (endpoint, bucket, event_type, committed, delivered, dead_lettered)
SELECT e.endpoint, postbox.report_bucket(e.committed_at, e.ingested_at), e.event_type, count(*),
       count(*) FILTER (WHERE d.delivered), count(*) FILTER (WHERE NOT coalesce(d.delivered, false) AND d.last_status = 'dead_letter')
FROM postbox.events e
LEFT JOIN LATERAL (SELECT bool_or(status = 'delivered') AS delivered, (array_agg(status ORDER BY id DESC))[1] AS last_status
                   FROM postbox.deliveries WHERE event_pk = e.id) d ON true
GROUP BY 1, 2, 3;
