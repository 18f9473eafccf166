-- Latency histograms of five-minute bins, kept beside the raw samples.
-- Exact percentiles sort an endpoint's whole window: at 200 attempts a
-- second that is 17 million samples, seconds of work for every refresh and
-- every `postbox endpoints`. The histograms answer from at most 288 bins
-- times the buckets in use, however busy the endpoint. Buckets grow by 4 %
-- from 1 µs, so a bucket's geometric middle is within 2 % of every sample
-- in it; the window's start is rounded down to its bin (at most 5 minutes
-- of 24 hours).
CREATE FUNCTION postbox.latency_bucket(ms real) RETURNS smallint
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT CASE WHEN ms <= 0.001 THEN 0 ELSE least(ceil(ln(ms / 0.001) / ln(1.04)), 32767) END::smallint $$;

-- The value a bucket stands for: its geometric middle.
CREATE FUNCTION postbox.latency_bucket_ms(bucket smallint) RETURNS real
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT CASE WHEN bucket <= 0 THEN 0.001 ELSE 0.001 * power(1.04, bucket - 0.5) END::real $$;

CREATE TABLE postbox.latency_histogram (
  endpoint text        NOT NULL,
  bin      timestamptz NOT NULL, -- the start of its five minutes
  bucket   smallint    NOT NULL,
  count    bigint      NOT NULL,
  PRIMARY KEY (endpoint, bin, bucket)
);
CREATE INDEX latency_histogram_bin ON postbox.latency_histogram (bin);

-- The bin a time falls in.
CREATE FUNCTION postbox.latency_bin(at timestamptz) RETURNS timestamptz
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT date_bin('5 minutes', at, timestamptz '2000-01-01 00:00:00+00') $$;

-- Every sample inserted, by whatever writes it, is counted in its bin's
-- histogram in the same statement. Rows are upserted in key order, so two
-- instances recording for the same endpoint lock them in the same order.
CREATE FUNCTION postbox.latency_histogram_add() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
BEGIN
  INSERT INTO postbox.latency_histogram AS h (endpoint, bin, bucket, count)
  SELECT endpoint, postbox.latency_bin(measured_at), postbox.latency_bucket(response_ms), count(*)
  FROM new_samples
  GROUP BY 1, 2, 3
  ORDER BY 1, 2, 3
  ON CONFLICT (endpoint, bin, bucket) DO UPDATE SET count = h.count + excluded.count;
  RETURN NULL;
END
$$;
CREATE TRIGGER latency_histogram_add AFTER INSERT ON postbox.latency_samples
  REFERENCING NEW TABLE AS new_samples
  FOR EACH STATEMENT EXECUTE FUNCTION postbox.latency_histogram_add();

INSERT INTO postbox.latency_histogram (endpoint, bin, bucket, count)
SELECT endpoint, postbox.latency_bin(measured_at), postbox.latency_bucket(response_ms), count(*)
FROM postbox.latency_samples
GROUP BY 1, 2, 3;
