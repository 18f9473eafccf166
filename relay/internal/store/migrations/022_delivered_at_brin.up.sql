-- deliveries_delivered_at's B-tree took an entry, a WAL record, with every
-- delivery's last update. Deliveries are delivered soon after they are
-- written, so a page range's delivery times are close together and a
-- BRIN index serves the last hour's figures (telemetry's DeliveryHourSQL)
-- with no record for rows of the last, unsummarized range. The retention
-- purge of delivered rows goes by id (store.PurgeDeliveries), for the
-- reason the events' purge does. Built beside the B-tree, then swapped, as
-- in 019.
CREATE INDEX deliveries_delivered_at_brin ON postbox.deliveries USING brin (delivered_at) WHERE status = 'delivered';
DROP INDEX postbox.deliveries_delivered_at;
ALTER INDEX postbox.deliveries_delivered_at_brin RENAME TO deliveries_delivered_at;
