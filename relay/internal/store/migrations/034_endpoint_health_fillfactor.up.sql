-- An endpoint's health row is updated with every batch that holds a
-- failure of it (its streak, its latest error): beside a storm of failing
-- partners, tens of thousands of updates a minute. On a full page the
-- new version goes to another page, with the primary key's entry and the
-- old version's lock, each a WAL record the walsender decodes too. Pages
-- filled to half leave each row room for its next version, as for
-- deliveries (021). Only pages filled from now on keep the room.
ALTER TABLE postbox.endpoint_health SET (fillfactor = 50);
