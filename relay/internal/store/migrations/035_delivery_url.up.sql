-- Where a replay sent a delivery, when not where its event's row said
-- (postbox replay --url, --endpoint-url): NULL is the event's own url
-- (the row's, else its endpoint's); '' leaves the row's url out, so its
-- endpoint's url, as it is at each attempt, is used; any other value is
-- the url (a template) the replay gave, checked at each attempt as a
-- row's url is. The event keeps the row's url: its history is not
-- rewritten, and each delivery says where it was retargeted.
ALTER TABLE postbox.deliveries ADD COLUMN url text;
