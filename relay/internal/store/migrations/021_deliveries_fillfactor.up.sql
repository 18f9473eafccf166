-- A delivery's row is inserted in flight and updated once when its attempt
-- ends. On a full page the new version goes to another page, and to find
-- that page the update first marks the old version locked: a WAL record
-- of its own (three in four updates of a catch-up wrote one). Pages
-- filled to half leave each row room for its next version on its own
-- page; pruning frees the old versions for the updates after. Only pages
-- filled from now on keep the room.
ALTER TABLE postbox.deliveries SET (fillfactor = 50);
