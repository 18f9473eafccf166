-- An instance's liveness is also its connection: it registers the backend
-- of a connection it holds for its whole life. When the process dies (kill
-- -9, OOM), the kernel closes that connection and the backend ends at once;
-- other instances see it gone from pg_stat_activity and return its claims
-- to the queue within a second, without waiting for its lease. Backends
-- registered before the server's last start say nothing (the restart ended
-- every connection): then the lease decides, as it does for a frozen
-- instance, whose connection lives on.
ALTER TABLE postbox.instances
  ADD COLUMN backend_pid   integer,
  ADD COLUMN backend_start timestamptz;
