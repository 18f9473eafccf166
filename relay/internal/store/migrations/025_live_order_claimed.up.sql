-- deliveries_live_order finds an ordered endpoint's oldest live delivery
-- (claimOrderedSQL), and took an entry for every live delivery of every
-- endpoint. The deliveries an ingest writes in flight, held in memory for
-- their first attempt (kept), are never an ordered endpoint's: ordered
-- ones are queued pending and claimed one at a time. A kept delivery is
-- marked so and left out of the index while in flight: one record less
-- per delivery of a catch-up. Pending or failed it is in again; a claim
-- clears the mark, so a delivery once kept and later claimed in flight is
-- seen as its endpoint's head should the endpoint be ordered by then. The
-- column's default costs no rewrite. Built beside, then swapped, as in 019.
ALTER TABLE postbox.deliveries ADD COLUMN kept boolean NOT NULL DEFAULT false;
CREATE INDEX deliveries_live_order_claimed ON postbox.deliveries (endpoint, id)
  WHERE status IN ('pending', 'failed') OR (status = 'in_flight' AND NOT kept);
DROP INDEX postbox.deliveries_live_order;
ALTER INDEX postbox.deliveries_live_order_claimed RENAME TO deliveries_live_order;
