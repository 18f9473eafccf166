-- Reconciliation owed is remembered in the database, not in the process
-- that found it owed: when a slot is recreated or the server's timeline or
-- identity changes, the rows written meanwhile are only in the outbox
-- table, and if that leader dies before reconciling them, the next leader
-- must.
ALTER TABLE postbox.checkpoints ADD COLUMN reconcile_pending boolean NOT NULL DEFAULT false;
