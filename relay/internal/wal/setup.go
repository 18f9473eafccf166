package wal

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// SQLSTATE codes the replication protocol answers with.
const (
	codeUndefinedObject  = "42704" // slot does not exist
	codeDuplicateObject  = "42710" // slot or publication already exists
	codeObjectInUse      = "55006" // slot is active for another PID
	codeNotInPrereqState = "55000" // slot invalidated ("can no longer get changes")
)

// Slot errors, for errors.Is.
var (
	// ErrSlotMissing: the slot does not exist (dropped by an operator).
	ErrSlotMissing = errors.New("replication slot does not exist")
	// ErrSlotBusy: another process streams the slot; stand by.
	ErrSlotBusy = errors.New("replication slot is active for another process")
	// ErrSlotInvalidated: the server removed WAL the slot needed
	// (max_slot_wal_keep_size exceeded); it must be recreated.
	ErrSlotInvalidated = errors.New("replication slot has been invalidated")
	// ErrStalled: nothing arrived from the server within the stall timeout.
	ErrStalled = errors.New("replication connection stalled")
	// ErrSlotElsewhere: a slot of the configured name belongs to another
	// database of the cluster (slots are the cluster's, not a
	// database's). No waiting cures it.
	ErrSlotElsewhere = errors.New("replication slot belongs to another database")
)

// SlotElsewhereError is ErrSlotElsewhere with the slot's and the
// databases' names.
type SlotElsewhereError struct{ Slot, SlotDatabase, Database string }

func (e *SlotElsewhereError) Error() string {
	return fmt.Sprintf("replication slot %s belongs to database %s, not %s: give this relay a slot name of its own (slot:)",
		e.Slot, e.SlotDatabase, e.Database)
}

// Is makes errors.Is(err, ErrSlotElsewhere) hold.
func (e *SlotElsewhereError) Is(target error) bool { return target == ErrSlotElsewhere }

// classify maps a server error on the replication connection to the slot
// errors above, keeping the original in the chain.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case codeUndefinedObject:
		return fmt.Errorf("%w: %w", ErrSlotMissing, err)
	case codeObjectInUse:
		return fmt.Errorf("%w: %w", ErrSlotBusy, err)
	case codeNotInPrereqState:
		return fmt.Errorf("%w: %w", ErrSlotInvalidated, err)
	}
	return err
}

// EnsurePublication creates the publication for the outbox table (inserts
// only) if it is missing, and refuses one that does not cover the table.
func EnsurePublication(ctx context.Context, q store.Querier, publication string, table outbox.Table) error {
	var exists, covers bool
	err := q.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
		       EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`,
		publication, table.Schema(), table.Name()).Scan(&exists, &covers)
	if err != nil {
		return fmt.Errorf("look up publication %s: %w", publication, err)
	}
	if exists && !covers {
		return fmt.Errorf("publication %s exists but does not include %s: run ALTER PUBLICATION %s ADD TABLE %s",
			publication, table, publication, table)
	}
	if exists {
		return nil
	}
	_, err = q.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{publication}.Sanitize()+
		" FOR TABLE "+table.Ident()+" WITH (publish = 'insert')")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeDuplicateObject {
		return nil // another instance made it first
	}
	if err != nil {
		// CREATE PUBLICATION takes the table's owner: where the
		// application's migrations own it, they make the publication.
		return fmt.Errorf("create publication %s: %w", publication, store.NeedsPrivilege(err, store.Missing{
			What: "ownership of " + table.String() + " (or the publication made by its owner)", Why: "creating publication " + publication,
			Grant: "as the table's owner: " + PublicationSQL(publication, table)}))
	}
	return nil
}

// EndpointsPublication is the name of the publication of postbox.endpoints
// beside publication (the outbox's): "<publication>_endpoints", its
// prefix cut so the whole fits PostgreSQL's 63 bytes.
func EndpointsPublication(publication string) string {
	const suffix = "_endpoints"
	if len(publication)+len(suffix) > 63 {
		publication = publication[:63-len(suffix)]
	}
	return publication + suffix
}

// EnsureEndpointsPublication creates the publication of postbox.endpoints
// (inserts, updates and deletes) if it is missing. postbox owns its
// schema, so its own role makes it, unlike the outbox's.
func EnsureEndpointsPublication(ctx context.Context, q store.Querier, publication string) error {
	name := EndpointsPublication(publication)
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("look up publication %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err := q.Exec(ctx, EndpointsPublicationSQL(publication))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeDuplicateObject {
		return nil
	}
	if err != nil {
		// It takes CREATE on the database and the table's owner: where
		// postbox's schema was migrated by another role, postbox migrate
		// made it.
		return fmt.Errorf("create publication %s: %w", name, store.NeedsPrivilege(err, store.Missing{
			What: "CREATE on the database and ownership of postbox.endpoints (or the publication made by its owner)", Why: "creating publication " + name,
			Grant: "as the owner of postbox.endpoints: " + EndpointsPublicationSQL(publication) + " (or run postbox migrate as that role)"}))
	}
	return nil
}

// EndpointsPublicationSQL is the statement that creates the publication
// of postbox.endpoints beside publication.
func EndpointsPublicationSQL(publication string) string {
	return "CREATE PUBLICATION " + store.Ident(EndpointsPublication(publication)) +
		" FOR TABLE postbox.endpoints WITH (publish = 'insert, update, delete')"
}

// PublicationSQL is the statement that creates the publication postbox
// reads: the outbox table's inserts only.
func PublicationSQL(publication string, table outbox.Table) string {
	return "CREATE PUBLICATION " + store.Ident(publication) + " FOR TABLE " + table.String() + " WITH (publish = 'insert')"
}

// SlotState describes a replication slot.
type SlotState struct {
	Exists         bool
	Plugin         string
	Database       string
	Active         bool
	ActivePID      int
	WALStatus      string // reserved, extended, unreserved, lost
	ConfirmedFlush pglogrepl.LSN
	RetainedBytes  int64
}

// Slot reads the slot's state from pg_replication_slots.
func Slot(ctx context.Context, q store.Querier, slot string) (SlotState, error) {
	var st SlotState
	var plugin, db, walStatus, confirmed *string
	var pid *int
	var retained *int64
	err := q.QueryRow(ctx, `
		SELECT plugin, database, active, active_pid, wal_status, confirmed_flush_lsn::text,
		       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8
		FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&plugin, &db, &st.Active, &pid, &walStatus, &confirmed, &retained)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("look up slot %s: %w", slot, err)
	}
	st.Exists = true
	st.Plugin, st.Database, st.WALStatus = deref(plugin), deref(db), deref(walStatus)
	if pid != nil {
		st.ActivePID = *pid
	}
	if retained != nil {
		st.RetainedBytes = *retained
	}
	if confirmed != nil {
		st.ConfirmedFlush, _ = pglogrepl.ParseLSN(*confirmed)
	}
	return st, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// CreateSlot creates a permanent pgoutput slot over a replication
// connection; on PostgreSQL 17 and newer with failover enabled, so the
// slot is synchronised to standbys and survives a failover. A slot that
// appeared meanwhile (another instance) is fine.
func CreateSlot(ctx context.Context, connString, slot string) (created bool, err error) {
	conn, err := connect(ctx, connString)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	if serverMajor(conn) >= 17 {
		// The options form; pglogrepl writes the pre-15 keyword form.
		_, err = pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
			"CREATE_REPLICATION_SLOT "+slot+" LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER)"))
	} else {
		_, err = pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeDuplicateObject {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	return true, nil
}

// SynchronizedStandbySlots reads, on a primary, its timeline and its
// synchronized_standby_slots (PostgreSQL 17+; "" before, or unset): the
// physical slots whose standbys must have the WAL before a failover
// slot's walsender sends it. The timeline is the current WAL file's.
func SynchronizedStandbySlots(ctx context.Context, q store.Querier) (timeline int32, slots string, err error) {
	err = q.QueryRow(ctx, `
		SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int,
		       coalesce(current_setting('synchronized_standby_slots', true), '')`).Scan(&timeline, &slots)
	if err != nil {
		return 0, "", fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	return timeline, slots, nil
}

// serverMajor is the server's major version from the connection's
// parameters (0 when unknown).
func serverMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version")
	major := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		major = major*10 + int(c-'0')
	}
	return major
}

// DropSlot drops the slot, waiting for nothing: it must not be active.
func DropSlot(ctx context.Context, q store.Querier, slot string) error {
	_, err := q.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	if err != nil {
		return fmt.Errorf("drop replication slot %s: %w", slot, err)
	}
	return nil
}

// connect opens a replication connection (replication=database) with
// postbox's session settings.
func connect(ctx context.Context, connString string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "postbox"
	store.SessionParams(cfg.RuntimeParams)
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	return conn, nil
}
