-- Durations in fractional milliseconds: a receiver on the same network
-- answers in well under a millisecond, and whole milliseconds would show
-- its percentiles as 0. real keeps microseconds up to minutes, in the
-- same four bytes as the integer it replaces.
ALTER TABLE postbox.deliveries
  ALTER COLUMN last_response_ms      TYPE real,
  ALTER COLUMN commit_to_delivery_ms TYPE real;
ALTER TABLE postbox.latency_samples
  ALTER COLUMN response_ms TYPE real;
ALTER TABLE postbox.endpoint_health
  ALTER COLUMN p50_ms TYPE real,
  ALTER COLUMN p95_ms TYPE real,
  ALTER COLUMN p99_ms TYPE real;
