-- postbox.deliveries is a queue: every event updates its row at least
-- once, so dead tuples accrue at the event rate. With the default
-- autovacuum_vacuum_scale_factor (0.2) a vacuum waits for a fifth of the
-- table to be dead, and as the table grows with event_retention its dead
-- tuples peak ever higher (a 30-minute soak at 1,000 events/s saw them
-- climb from 100 k to 360 k between vacuums). A fixed threshold keeps the
-- peak at what one autovacuum_naptime of updates leaves, whatever the
-- table's size; the visibility map lets each vacuum skip the old, settled
-- pages.
ALTER TABLE postbox.deliveries SET (
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 20000,
  autovacuum_analyze_scale_factor = 0.02
);
-- The endpoints' health and the checkpoints are updated with every batch:
-- small tables, vacuumed whenever they have a few hundred dead rows.
ALTER TABLE postbox.endpoint_health SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
ALTER TABLE postbox.checkpoints SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
