// Package maintain is the relay's housekeeping: small services, one duty
// each, in a file of its own with its own interval, that one Maintainer
// starts and stops.
//
//   - heartbeat keeps this instance registered (which keeps its claims its
//     own) and notes whether other instances are alive;
//   - rescuer returns the deliveries of instances that died to the queue:
//     at once those of an instance of this host whose process it sees gone
//     (a restarted instance's predecessor), the others by the heartbeat
//     rule;
//   - outboxPurger deletes ingested outbox rows past their retention;
//   - telemetry keeps the metrics' gauges current and, on the leader,
//     logs alert changes once for all instances;
//   - percentiles, retentionCleaner and lanePruner refresh the endpoints'
//     percentiles, purge what is past its retention and drop idle row-URL
//     lanes, on the leader (the instance holding the upkeep lock);
//   - walsenderWatch warns when the walsender streaming this instance's
//     slot is starved of CPU (where it runs on this machine);
//   - secretsWatcher reloads the configuration when a secrets file changes
//     (a Kubernetes secret rotated in place).
package maintain
