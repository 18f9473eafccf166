-- Each instance reports, with its heartbeat, the database fault it is
-- running into (read-only, disk full, statement_timeout, …), so that
-- `postbox status` can show it beside the server's own state.
ALTER TABLE postbox.instances ADD COLUMN fault text, ADD COLUMN fault_since timestamptz;
