-- The process an instance runs as, so that a restarted instance on the
-- same host can prove its predecessor gone and take back its claims at
-- once instead of after the heartbeat rule's grace: the kernel's boot id,
-- the pid namespace its pid is counted in, and its start time (clock ticks
-- after boot), which tell a recycled pid from the predecessor still
-- running. NULL where they cannot be read (not Linux): nothing is proven
-- then, and the heartbeat rule decides.
ALTER TABLE postbox.instances
  ADD COLUMN boot_id   text,
  ADD COLUMN pid_ns    text,
  ADD COLUMN pid_start bigint;
