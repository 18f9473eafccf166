-- A payload above max_body is never copied into postbox.events: the event
-- is stored with a JSON null payload and the size it had here, and its
-- delivery is a payload_too_large dead letter. Such an event cannot be
-- replayed (its payload is gone); the application resends it.
ALTER TABLE postbox.events ADD COLUMN payload_dropped integer;
