// Package doctor checks a database for postbox and explains what it finds:
// the settings logical replication needs, the role's privilege, the
// publication and the slot, and the clock. `postbox doctor` prints it;
// `postbox run` refuses to start on the fatal subset (store.Preflight).
package doctor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// Severity of a finding.
type Severity string

// Severities.
const (
	OK    Severity = "ok"
	Warn  Severity = "warn"
	Error Severity = "error"
)

// Check is one finding.
type Check struct {
	Name     string   `json:"check"`
	Severity Severity `json:"severity"`
	Detail   string   `json:"detail"`
	Fix      string   `json:"fix,omitempty"`
}

// Run checks the database behind q for cfg. now is the relay's clock.
func Run(ctx context.Context, q telemetry.Querier, cfg *config.Config, now func() time.Time) ([]Check, error) {
	var s settings
	t0 := now()
	err := q.QueryRow(ctx, `
		SELECT current_setting('server_version_num')::int, current_setting('server_version'),
		       current_setting('wal_level'),
		       current_setting('max_replication_slots')::int,
		       (SELECT count(*) FROM pg_replication_slots),
		       current_setting('max_wal_senders')::int,
		       (SELECT count(*) FROM pg_stat_replication),
		       current_setting('max_slot_wal_keep_size'),
		       current_setting('wal_sender_timeout'),
		       current_user,
		       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
		       clock_timestamp(),
		       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2),
		       current_setting('synchronous_commit'), current_database()`, cfg.Table.Schema(), cfg.Table.Name()).
		Scan(&s.versionNum, &s.version, &s.walLevel, &s.maxSlots, &s.slotsUsed, &s.maxSenders, &s.sendersUsed,
			&s.keepSize, &s.senderTimeout, &s.role, &s.canReplicate, &s.dbNow, &s.tableExists, &s.syncCommit, &s.database)
	if err != nil {
		return nil, fmt.Errorf("doctor: %w", err)
	}
	rtt := now().Sub(t0)
	var out []Check
	add := func(name string, sev Severity, detail, fix string) {
		out = append(out, Check{Name: name, Severity: sev, Detail: detail, Fix: fix})
	}

	if s.versionNum < store.MinServerVersion {
		add("server_version", Error, "PostgreSQL "+s.version, "postbox needs PostgreSQL 14 or newer: upgrade the server")
	} else {
		add("server_version", OK, "PostgreSQL "+s.version+"; "+versionApplies(s.versionNum), "")
		fc, err := failoverSlotCheck(ctx, q, s.versionNum, cfg.Slot)
		if err != nil {
			return nil, err
		}
		out = append(out, fc)
	}
	if s.walLevel != "logical" {
		add("wal_level", Error, "wal_level is "+s.walLevel, "ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL")
	} else {
		add("wal_level", OK, "logical", "")
	}
	if !s.canReplicate {
		add("replication_privilege", Error, fmt.Sprintf("role %s may not replicate", s.role),
			fmt.Sprintf("as a superuser: ALTER ROLE %s WITH REPLICATION", pgx.Identifier{s.role}.Sanitize()))
	} else {
		add("replication_privilege", OK, fmt.Sprintf("role %s may replicate", s.role), "")
	}

	st, err := wal.Slot(ctx, q, cfg.Slot)
	if err != nil {
		return nil, err
	}
	switch {
	case s.maxSlots == 0:
		add("max_replication_slots", Error, "0: logical replication is off", "set max_replication_slots to at least 4 and restart PostgreSQL")
	case !st.Exists && s.slotsUsed >= s.maxSlots:
		add("max_replication_slots", Error, fmt.Sprintf("all %d slots are taken and postbox needs one", s.maxSlots), "raise max_replication_slots (restart) or drop an unused slot")
	default:
		add("max_replication_slots", OK, fmt.Sprintf("%d of %d in use", s.slotsUsed, s.maxSlots), "")
	}
	switch {
	case s.maxSenders == 0:
		add("max_wal_senders", Error, "0: no replication connection is possible", "set max_wal_senders to at least 4 and restart PostgreSQL")
	case s.sendersUsed >= s.maxSenders:
		add("max_wal_senders", Warn, fmt.Sprintf("all %d in use", s.maxSenders), "raise max_wal_senders (restart): postbox needs one when it (re)connects")
	default:
		add("max_wal_senders", OK, fmt.Sprintf("%d of %d in use", s.sendersUsed, s.maxSenders), "")
	}
	if s.keepSize == "-1" {
		add("max_slot_wal_keep_size", Warn, "unlimited: a slot nobody reads (postbox stopped for good, a forgotten slot) retains WAL until the disk is full",
			"ALTER SYSTEM SET max_slot_wal_keep_size = '20GB' (postbox recreates an invalidated slot and reconciles from the outbox table)")
	} else {
		add("max_slot_wal_keep_size", OK, s.keepSize, "")
	}
	timeout, terr := parseGUCDuration(s.senderTimeout)
	switch {
	case terr != nil:
		add("wal_sender_timeout", Warn, "unreadable: "+s.senderTimeout, "")
	case timeout == 0:
		add("wal_sender_timeout", Warn, "0: the server never notices a replication client that vanished, and its slot stays taken", "set wal_sender_timeout to 60s")
	case timeout < 2*cfg.StatusInterval:
		add("wal_sender_timeout", Warn, fmt.Sprintf("%s is less than twice postbox's status_interval (%s)", timeout, cfg.StatusInterval), "raise wal_sender_timeout or lower status_interval")
	default:
		add("wal_sender_timeout", OK, timeout.String(), "")
	}

	// As postbox's sessions have it (the server's, the database's or the
	// role's setting). Its ingest does not rely on it (the slot is
	// confirmed only past what the server has flushed), its other writes do.
	if s.syncCommit == "off" {
		add("synchronous_commit", Warn, "off: a crash of PostgreSQL can undo commits that had returned, postbox's records of attempts and results among them (its ingest and the slot's position stay safe)",
			fmt.Sprintf("ALTER DATABASE %s SET synchronous_commit = on (or ALTER ROLE %s SET synchronous_commit = on)",
				pgx.Identifier{s.database}.Sanitize(), pgx.Identifier{s.role}.Sanitize()))
	} else {
		add("synchronous_commit", OK, s.syncCommit, "")
	}

	if !s.tableExists {
		add("outbox_table", Warn, cfg.Table.String()+" does not exist", "postbox migrate (or postbox run) creates it; or apply outbox/schema.sql")
	} else {
		add("outbox_table", OK, cfg.Table.String(), "")
	}
	out = append(out, roleChecks(ctx, q, cfg, s.role)...)
	out = append(out, publicationCheck(ctx, q, cfg), endpointsPublicationCheck(ctx, q, cfg))
	if c, ok := conflictsCheck(ctx, q, cfg); ok {
		out = append(out, c)
	}
	out = append(out, outboxModeCheck(ctx, q, s.keepSize), messagesCheck(ctx, q, cfg))

	switch {
	case !st.Exists:
		add("slot", OK, fmt.Sprintf("%s does not exist yet: postbox run creates it", cfg.Slot), "")
	case st.Database != s.database:
		add("slot", Error, fmt.Sprintf("%s belongs to database %s, not %s: postbox run stops on it", cfg.Slot, st.Database, s.database),
			"give this relay a slot name of its own (slot: in the configuration); slots are the cluster's, not a database's")
	case st.Plugin != "pgoutput":
		add("slot", Error, fmt.Sprintf("%s uses plugin %s", cfg.Slot, st.Plugin), "drop it, or give postbox another slot name")
	case st.WALStatus == "lost":
		add("slot", Error, fmt.Sprintf("%s is invalidated (wal_status lost): WAL it needed is gone", cfg.Slot), "postbox run recreates it and reconciles from the outbox table")
	case st.WALStatus == "unreserved":
		add("slot", Warn, fmt.Sprintf("%s is about to lose WAL (wal_status unreserved), retaining %s", cfg.Slot, telemetry.FormatBytes(st.RetainedBytes)), "start postbox, or raise max_slot_wal_keep_size")
	case st.RetainedBytes > int64(cfg.Alerts.SlotLag):
		add("slot", Warn, fmt.Sprintf("%s retains %s of WAL, above alerts.slot_lag", cfg.Slot, telemetry.FormatBytes(st.RetainedBytes)), "is postbox running and keeping up? postbox status")
	case !st.Active:
		add("slot", Warn, fmt.Sprintf("%s exists but no postbox streams it (retains %s)", cfg.Slot, telemetry.FormatBytes(st.RetainedBytes)), "start postbox run")
	default:
		add("slot", OK, fmt.Sprintf("%s streamed (wal_status %s, retains %s)", cfg.Slot, st.WALStatus, telemetry.FormatBytes(st.RetainedBytes)), "")
	}
	if st.Active && st.ActivePID != 0 && st.Database == s.database {
		c, err := walsenderCheck(ctx, q, st.ActivePID, WalsenderSample, cfg.CPUBatch)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}

	skew := s.dbNow.Sub(t0.Add(rtt / 2))
	switch {
	case skew.Abs() > time.Minute:
		add("clock_skew", Error, fmt.Sprintf("this host's clock is %s off the database's", skew.Round(time.Millisecond)), "synchronise both with NTP: commit-to-delivery times and retries' due times mix the two clocks")
	case skew.Abs() > time.Second:
		add("clock_skew", Warn, fmt.Sprintf("this host's clock is %s off the database's", skew.Round(time.Millisecond)), "synchronise both with NTP")
	default:
		add("clock_skew", OK, fmt.Sprintf("%s (round trip %s)", skew.Round(time.Microsecond), rtt.Round(time.Microsecond)), "")
	}
	return out, nil
}

type settings struct {
	versionNum                                   int
	version, walLevel, keepSize, senderTimeout   string
	maxSlots, slotsUsed, maxSenders, sendersUsed int
	role, syncCommit, database                   string
	canReplicate, tableExists                    bool
	dbNow                                        time.Time
}

// endpointsPublicationCheck: the publication of postbox.endpoints, which
// streams endpoint changes beside the outbox's events, exists, or
// postbox's role may create it (it owns postbox.endpoints and may create
// in the database).
func endpointsPublicationCheck(ctx context.Context, q telemetry.Querier, cfg *config.Config) Check {
	name := wal.EndpointsPublication(cfg.Publication)
	c := Check{Name: "endpoints_publication", Severity: OK}
	var exists, owns, mayCreate bool
	var owner *string
	// The catalogs, not to_regclass: a role without USAGE on the schema
	// may not look a name up in it.
	err := q.QueryRow(ctx, `
		WITH t AS (SELECT c.relowner FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		           WHERE n.nspname = 'postbox' AND c.relname = 'endpoints')
		SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
		       (SELECT pg_get_userbyid(relowner)::text FROM t),
		       coalesce((SELECT pg_has_role(current_user, relowner, 'USAGE') FROM t), true)
		         OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
		       has_database_privilege(current_database(), 'CREATE')`, name).Scan(&exists, &owner, &owns, &mayCreate)
	switch {
	case err != nil:
		c.Severity, c.Detail = Warn, "unreadable: "+err.Error()
	case exists:
		c.Detail = name + " publishes postbox.endpoints: endpoint changes are streamed"
	case owns && mayCreate:
		c.Detail = name + " does not exist yet: postbox migrate (or run) creates it"
	default:
		c.Severity = Error
		c.Detail = name + " does not exist, and postbox's role may not create it: endpoints written as rows are not applied"
		who := "the owner of postbox.endpoints"
		if owner != nil {
			who = store.Ident(*owner)
		}
		c.Fix = "as " + who + ": " + wal.EndpointsPublicationSQL(cfg.Publication) + " (or run postbox migrate as that role)"
	}
	return c
}

// conflictsCheck: the names both the configuration file and
// postbox.endpoints define. The file's endpoint is used and the row is
// not, which whoever writes the row may not know. Left out (ok false)
// while the configuration has no endpoints or the table is not there yet.
func conflictsCheck(ctx context.Context, q telemetry.Querier, cfg *config.Config) (Check, bool) {
	c := Check{Name: "endpoint_conflicts", Severity: OK}
	if len(cfg.Endpoints) == 0 {
		return c, false
	}
	names := make([]string, 0, len(cfg.Endpoints))
	for n := range cfg.Endpoints {
		names = append(names, n)
	}
	var exists bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'postbox' AND c.relname = 'endpoints')`).Scan(&exists)
	if err == nil && !exists {
		return c, false
	}
	var both []string
	if err == nil {
		err = q.QueryRow(ctx, `SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM postbox.endpoints WHERE name = ANY($1)`, names).Scan(&both)
	}
	switch {
	case err != nil:
		c.Severity, c.Detail = Warn, "unreadable: "+err.Error()
	case len(both) == 0:
		c.Detail = "no endpoint of the configuration file is a row of postbox.endpoints too"
	default:
		c.Severity = Warn
		c.Detail = fmt.Sprintf("%s defined both in the configuration file and in postbox.endpoints: the file's settings are used, the row's are not",
			strings.Join(both, ", "))
		c.Fix = "keep one of each: postbox endpoints rm NAME (or DELETE the row), or remove its entry from the file and reload (SIGHUP)"
	}
	return c, true
}

func publicationCheck(ctx context.Context, q telemetry.Querier, cfg *config.Config) Check {
	c := Check{Name: "publication"}
	rows, err := q.Query(ctx, `
		SELECT p.pubinsert, p.puballtables, coalesce(t.schemaname || '.' || t.tablename, '')
		FROM pg_publication p LEFT JOIN pg_publication_tables t ON t.pubname = p.pubname
		WHERE p.pubname = $1`, cfg.Publication)
	if err != nil {
		c.Severity, c.Detail = Warn, "unreadable: "+err.Error()
		return c
	}
	defer rows.Close()
	var tables []string
	var insert, all, found bool
	for rows.Next() {
		var t string
		if err := rows.Scan(&insert, &all, &t); err != nil {
			c.Severity, c.Detail = Warn, "unreadable: "+err.Error()
			return c
		}
		found = true
		if t != "" {
			tables = append(tables, t)
		}
	}
	want := cfg.Table.String()
	covers := false
	for _, t := range tables {
		covers = covers || t == want
	}
	switch {
	case !found:
		return missingPublication(ctx, q, cfg)
	case !covers:
		c.Severity, c.Detail = Error, fmt.Sprintf("%s does not publish %s", cfg.Publication, want)
		c.Fix = fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", cfg.Publication, want)
	case !insert:
		c.Severity, c.Detail = Error, cfg.Publication+" does not publish inserts"
		c.Fix = fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert')", cfg.Publication)
	case all || len(tables) > 1:
		c.Severity, c.Detail = Warn, fmt.Sprintf("%s publishes %d tables, not only %s: the server decodes and sends changes postbox ignores", cfg.Publication, len(tables), want)
		c.Fix = "give postbox a publication of the outbox table only (publication: in the config)"
	default:
		c.Severity, c.Detail = OK, fmt.Sprintf("%s publishes only %s", cfg.Publication, want)
	}
	return c
}

// outboxModeCheck says how the last day's events reached postbox: as
// outbox table rows, as messages written by outbox.Emit (no row: their
// events_outbox_id is NULL), or both; and warns when emitted events could
// be lost with an invalidated slot.
func outboxModeCheck(ctx context.Context, q telemetry.Querier, keepSize string) Check {
	c := Check{Name: "outbox_mode", Severity: OK}
	var rows, messages int64
	err := q.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE outbox_id IS NOT NULL), count(*) FILTER (WHERE outbox_id IS NULL)
		FROM postbox.events WHERE ingested_at > now() - interval '1 day'`).Scan(&rows, &messages)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // not migrated yet
			c.Detail = "no events yet (postbox run creates its schema)"
			return c
		}
		if store.Refused(err) {
			c.Severity, c.Detail = Warn, "postbox.events is not readable by postbox's role (see privileges)"
			return c
		}
		c.Severity, c.Detail = Warn, "could not read postbox.events: "+err.Error()
		return c
	}
	switch {
	case rows == 0 && messages == 0:
		c.Detail = "no events in the last 24 h"
	case messages == 0:
		c.Detail = fmt.Sprintf("table: %d outbox rows in the last 24 h", rows)
	case rows == 0:
		c.Detail = fmt.Sprintf("messages: %d events written with outbox.Emit in the last 24 h, no outbox rows", messages)
	default:
		c.Detail = fmt.Sprintf("both: %d outbox rows and %d events written with outbox.Emit in the last 24 h", rows, messages)
	}
	if messages > 0 && keepSize != "-1" {
		c.Severity = Warn
		c.Fix = "events written with outbox.Emit exist only in WAL until postbox ingests them: if max_slot_wal_keep_size (" + keepSize +
			") invalidates the slot while postbox is down, they are lost, with no table to reconcile from. Size it for your longest outage, or use outbox rows"
	}
	return c
}

// WalsenderSample is how long the walsender check watches the slot's
// walsender, where it runs on this machine.
const WalsenderSample = time.Second

// walsenderCheck watches the walsender streaming the slot (pid) for
// sample, where it runs on this machine: under a load that keeps the
// database's CPUs busy it waits its turn for one, and the rows committed
// meanwhile with it (docs/benchmarks.md, "The walsender's weight").
func walsenderCheck(ctx context.Context, q telemetry.Querier, pid int, sample time.Duration, batch bool) (Check, error) {
	c := Check{Name: "walsender", Severity: OK}
	var port *int32
	err := q.QueryRow(ctx, `SELECT client_port FROM pg_stat_replication WHERE pid = $1`, pid).Scan(&port)
	if errors.Is(err, pgx.ErrNoRows) {
		c.Detail = fmt.Sprintf("pid %d has just ended", pid)
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("doctor: look up walsender %d: %w", pid, err)
	}
	clientPort := 0
	if port != nil {
		clientPort = int(*port)
	}
	// Each reading checks that the process of pid here is that walsender.
	w := wal.Walsender{PID: pid, ClientPort: clientPort}
	before, err := w.CPU()
	if err == nil {
		select {
		case <-ctx.Done():
			return c, ctx.Err()
		case <-time.After(sample):
		}
		var after proc.CPU
		if after, err = w.CPU(); err == nil {
			judgeWalsender(&c, pid, after.Nice, batch, after.Ran-before.Ran, after.Waited-before.Waited, sample)
			return c, nil
		}
	}
	c.Detail = fmt.Sprintf("pid %d, not measured: %v", pid, err)
	return c, nil
}

// judgeWalsender fills c from what the walsender did in sample: a warning
// when it was starved (wal.Starved), behind the other processes of a
// saturated machine. batch is the configuration's cpu_scheduling.
func judgeWalsender(c *Check, pid, nice int, batch bool, ran, waited, sample time.Duration) {
	c.Detail = fmt.Sprintf("pid %d on this machine, nice %d: in %s it ran %s and waited %s for a CPU", pid, nice, sample,
		ran.Round(time.Microsecond), waited.Round(time.Microsecond))
	if !wal.Starved(ran, waited, sample) {
		return
	}
	c.Severity = Warn
	c.Detail += ": the database's CPUs are saturated, and the rows it streams wait with it"
	c.Fix = wal.StarvedFix(nice, batch)
}

// Failed reports whether any check is an error.
func Failed(checks []Check) bool {
	for _, c := range checks {
		if c.Severity == Error {
			return true
		}
	}
	return false
}

// parseGUCDuration reads a duration setting as current_setting shows it
// ("60s", "1min", "500ms", "0").
func parseGUCDuration(s string) (time.Duration, error) {
	units := []struct {
		suffix string
		d      time.Duration
	}{{"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if n, ok := cutSuffix(s, u.suffix); ok {
			v, err := strconv.Atoi(n)
			return time.Duration(v) * u.d, err
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, errors.New("not a duration")
	}
	return time.Duration(v) * time.Millisecond, nil
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return "", false
}
