package doctor

import (
	"context"
	"fmt"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// failoverSlotsFrom is the first major version whose logical slots a
// standby can synchronise and keep when promoted.
const failoverSlotsFrom = 170000

// versionApplies says what of postbox's version-specific behaviour the
// server's version gives it (docs/operations.md, "Supported PostgreSQL
// versions").
func versionApplies(versionNum int) string {
	major := versionNum / 10000
	if versionNum < failoverSlotsFrom {
		return fmt.Sprintf("PostgreSQL %d: pgoutput with messages; the slot is not synchronised to standbys (17+), "+
			"so after a failover postbox recreates it and reconciles the outbox table", major)
	}
	s := fmt.Sprintf("PostgreSQL %d: pgoutput with messages; the slot is created with failover, "+
		"so a standby with sync_replication_slots keeps it through a promotion", major)
	if major >= 18 {
		s += "; the WAL's I/O counts are in pg_stat_io"
	}
	return s
}

// failoverSlotCheck, from PostgreSQL 17: is postbox's slot one a standby
// synchronises, and does the primary wait for the standbys before sending
// it changes? Without the wait a promoted standby's copy may be ahead of
// the checkpoint it holds, and postbox reconciles the table instead of
// carrying on (safe, slower, with repeats).
func failoverSlotCheck(ctx context.Context, q telemetry.Querier, versionNum int, slot string) (Check, error) {
	c := Check{Name: "failover_slot", Severity: OK}
	if versionNum < failoverSlotsFrom {
		c.Detail = fmt.Sprintf("PostgreSQL %d has no failover slots: a promoted standby lacks the slot, and postbox recreates it and reconciles the outbox table", versionNum/10000)
		return c, nil
	}
	var failover bool
	var standbySlots string
	var physical int
	err := q.QueryRow(ctx, `
		SELECT coalesce((SELECT failover FROM pg_replication_slots WHERE slot_name = $1), true),
		       current_setting('synchronized_standby_slots'),
		       (SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'physical')`, slot).
		Scan(&failover, &standbySlots, &physical)
	if err != nil {
		return c, fmt.Errorf("doctor: failover slot: %w", err)
	}
	switch {
	case !failover:
		c.Severity = Warn
		c.Detail = fmt.Sprintf("slot %s was made without failover (before an upgrade to 17, or by hand): a promoted standby will not have it", slot)
		c.Fix = fmt.Sprintf(`psql "<database url> replication=database" -c 'ALTER_REPLICATION_SLOT %s (FAILOVER true)'`, slot)
	case physical > 0 && standbySlots == "":
		c.Severity = Warn
		c.Detail = "standbys stream through physical slots, but synchronized_standby_slots is empty: a promoted standby's copy of the slot may be ahead of its data, and postbox then reconciles the outbox table"
		c.Fix = "ALTER SYSTEM SET synchronized_standby_slots = '<the standbys' physical slots>'; SELECT pg_reload_conf(); and on the standbys sync_replication_slots = on, hot_standby_feedback = on, a dbname in primary_conninfo"
	case standbySlots == "":
		c.Detail = "the slot is made with failover; no standby streams through a physical slot here"
	default:
		c.Detail = "the slot is made with failover; the primary waits for " + standbySlots + " before sending it changes"
	}
	return c, nil
}
