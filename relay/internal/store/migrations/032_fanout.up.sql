-- Routing by subscription (issue 52): an outbox row whose endpoint is NULL
-- and that has an event_type is delivered to every enabled table endpoint
-- subscribed to the type, one event row (and delivery) per endpoint, all
-- under the row's event_id.
--
-- events.matched says why: NULL for an event addressed by its row's
-- endpoint; for one routed by subscription, the pattern that matched
-- ("order.*", "order.paid + filter"). A routed row that matched nothing is
-- kept as one event under endpoint '' with matched '' and a no_subscriber
-- dead letter, so it is seen, counted and never silently dropped. The
-- outbox purge and the reconciliation find a routed row's events by its
-- event_id among those with matched set. A constant default: no rewrite.
ALTER TABLE postbox.events ADD COLUMN matched text;

-- The outbox postbox created (postbox.outbox) lets endpoint be NULL. An
-- outbox of the application's own (outbox_table, or postbox.outbox made
-- by another role) is left as it is: docs/integration.md says to drop
-- NOT NULL there to route by subscription.
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'postbox' AND c.relname = 'outbox' AND c.relkind IN ('r', 'p')
               AND pg_has_role(c.relowner, 'USAGE')) THEN
    ALTER TABLE postbox.outbox ALTER COLUMN endpoint DROP NOT NULL;
  END IF;
END $$;
