-- One index on deliveries.event_pk where there were two. deliveries_event
-- found an event's deliveries; deliveries_live held at most one live
-- (pending, in flight or failed) delivery per event, so a replay cannot
-- double an event still queued. A delivery took an entry in each when it
-- was inserted and another in deliveries_event when its attempt ended:
-- three records per delivery, each one a turn of the walsender's loop
-- (see 019). One unique index keyed on the event and, for a finished
-- delivery, its own id (for a live one, 0) does both: an event's
-- deliveries share the leading column, and two live ones of an event would
-- share the whole key. Two records per delivery. Built beside, then the
-- old two dropped, as in 019; replay's ON CONFLICT names the new key.
CREATE UNIQUE INDEX deliveries_event_once ON postbox.deliveries
  (event_pk, (CASE WHEN status IN ('pending', 'in_flight', 'failed') THEN 0 ELSE id END));
DROP INDEX postbox.deliveries_live;
DROP INDEX postbox.deliveries_event;
ALTER INDEX postbox.deliveries_event_once RENAME TO deliveries_event;
