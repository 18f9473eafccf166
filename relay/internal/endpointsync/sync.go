// Package endpointsync keeps an instance's table of the endpoints of
// postbox.endpoints (config.EndpointTable) as applied: the streaming
// instance applies each change as its stream decodes it; every instance
// reads postbox.endpoint_state, which the streaming instance writes in
// the ingest transaction of the events after each change, at start, when
// NOTIFYed, every second, and before it attempts an event committed after
// what it has applied (Await).
package endpointsync

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
	"github.com/postbox-relay/postbox/relay/internal/execute"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// PollIntervalDefault is the fallback read of endpoint_state: a NOTIFY
// lost with its connection must not leave an instance behind for long.
const PollIntervalDefault = time.Second

// Syncer is the instance's applied endpoints. Start it, Stop it.
type Syncer struct {
	env     *service.Env
	log     zerolog.Logger
	table   *config.EndpointTable
	changed func()
	loops   service.Loops
	// gateOnly: no LISTEN and no poll, only the reads before attempts
	// (GateOnly; tests of the gate).
	gateOnly bool

	// applied: every change of postbox.endpoints committed before it is
	// in table (the ingest's checkpoint read with the rows, or the
	// stream's decoded commit).
	applied atomic.Uint64

	mu sync.Mutex // one read or stream apply at a time; rows, gone and since
	// rows are the applied rows an update may leave columns out of (see
	// mayToast), for the stream's updates to be merged over.
	rows map[string]endpoints.Row
	// gone holds the revision each name was deleted at: a row of that
	// revision or earlier, read again from endpoint_state before the
	// ingest wrote the delete (the stream is ahead), stays deleted.
	gone  map[string]int64
	since pglogrepl.LSN // the last endpoint_state position read

	// conflicts are the names both the configuration file and the table
	// define, as last checked (warnConflicts): each is warned of once
	// while it lasts, again if it goes and comes back.
	conflictsMu sync.Mutex
	conflicts   map[string]bool

	// heldBy is why each held endpoint of the table waits (execute.Held
	// under heldCfg): computed whole when the configuration changes or the
	// table is read whole, else kept name by name as changes are applied,
	// so that one change resolves its own endpoint and none of the others.
	heldMu  sync.Mutex
	heldCfg *config.Config // nil: heldBy is to be computed whole
	heldBy  map[string]string
	// held and invalid are heldBy's names, sorted; nil until asked for
	// after a change.
	held, invalid []string
	listed        bool
}

// New returns a Syncer keeping table; changed is called after a change
// was applied (held endpoints may be released: wake the claim).
func New(env *service.Env, table *config.EndpointTable, changed func()) *Syncer {
	if changed == nil {
		changed = func() {}
	}
	s := &Syncer{env: env, log: env.Logger("endpoints"), table: table, changed: changed,
		rows: map[string]endpoints.Row{}, gone: map[string]int64{}}
	table.KeepInvalid(s.Invalid)
	table.ParseRowsWith(parseRow)
	return s
}

// parseRow parses a row kept as the JSON of its columns' text.
func parseRow(text []byte) config.TableEndpoint {
	var row endpoints.Row
	if err := json.Unmarshal(text, &row); err != nil {
		// Not reached: the table keeps only what rowText wrote.
		return config.TableEndpoint{Invalid: "row: " + err.Error()}
	}
	return endpoints.Parse(row)
}

// rowText is row as the table keeps it: the JSON of its columns' text,
// NULL columns and the times postbox does not read left out.
func rowText(name string, row endpoints.Row) []byte {
	kept := make(endpoints.Row, len(row))
	for k, v := range row {
		if v != nil && k != "created_at" && k != "updated_at" {
			kept[k] = v
		}
	}
	kept["name"] = &name
	b, _ := json.Marshal(kept) // a map of strings always encodes
	return b
}

// GateOnly makes Start run neither the LISTEN nor the poll: the table
// changes only before an attempt that needs it (Await). For tests that
// prove the gate alone keeps attempts from older settings.
func (s *Syncer) GateOnly() { s.gateOnly = true }

// Table is the table kept.
func (s *Syncer) Table() *config.EndpointTable { return s.table }

// Start reads endpoint_state whole, then keeps up with it: a LISTEN on
// its own connection, and a read every PollIntervalDefault.
func (s *Syncer) Start(ctx context.Context) error {
	if err := s.Reload(ctx); err != nil {
		return err
	}
	if s.gateOnly {
		return s.loops.Start(ctx)
	}
	return s.loops.Start(ctx, s.listenLoop, s.pollLoop)
}

// Stop ends both loops and waits for them.
func (s *Syncer) Stop() { s.loops.Stop() }

// Applied is the position up to which every endpoint change is applied.
func (s *Syncer) Applied() pglogrepl.LSN { return pglogrepl.LSN(s.applied.Load()) }

func (s *Syncer) advance(lsn pglogrepl.LSN) {
	for {
		cur := s.applied.Load()
		if uint64(lsn) <= cur || s.applied.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// Reload reads endpoint_state whole and makes the table hold exactly it.
func (s *Syncer) Reload(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := map[string]endpoints.Row{}
	since := pglogrepl.LSN(0)
	zero := false // rows of a first start's seed were read
	var at pglogrepl.LSN
	err := s.table.ReplaceWith(func(add func(config.TableEndpoint, []byte)) error {
		var err error
		at, err = s.env.Store.ScanEndpointState(ctx, 0, true, func(st store.EndpointState) error {
			if mayToast(st.Row) {
				rows[st.Name] = st.Row
			}
			add(endpoints.Parse(st.Row), st.Text)
			since = max(since, st.LSN)
			zero = zero || st.LSN == 0
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	s.rows, s.since = rows, max(since, at)
	if zero {
		s.since = pastFirstSeed(s.since, at)
	}
	s.heldMu.Lock()
	s.heldCfg = nil
	s.heldMu.Unlock()
	s.advance(at)
	s.changed()
	s.warnConflicts()
	return nil
}

// pastFirstSeed is where the next read starts once the rows a first
// start seeded were read: past them while the ingest has no position yet
// (at 0), else the read would take them all again, every second, until
// the first event is ingested. Rows at position 0 are only those, written
// together by one seed (store.SeedEndpoints at position 0); what changes
// after it comes from the stream, at the change's commit.
func pastFirstSeed(since, at pglogrepl.LSN) pglogrepl.LSN {
	if at == 0 {
		return max(since, 1)
	}
	return since
}

// Reconfigured checks the configuration now in force (a reload) for
// names the table defines too.
func (s *Syncer) Reconfigured() { s.warnConflicts() }

// warnConflicts warns of each name the configuration file and
// postbox.endpoints both define when it begins to (at start, after a
// change applied, after a reload): the file's endpoint is used, and the
// row is not. After a change, only the names it changed are looked at
// (changed); otherwise each of the file's endpoints is looked up in the
// table, which is never walked whole.
func (s *Syncer) warnConflicts(changed ...string) {
	cfg := s.env.Config()
	s.conflictsMu.Lock()
	defer s.conflictsMu.Unlock()
	was, now, names := s.conflicts, maps.Clone(s.conflicts), changed
	if changed == nil {
		now, names = nil, make([]string, 0, len(cfg.Endpoints))
		for name := range cfg.Endpoints {
			names = append(names, name)
		}
	}
	if now == nil {
		now = map[string]bool{}
	}
	for _, name := range names {
		_, inFile := cfg.Endpoints[name]
		if !inFile || s.table.Revision(name) == 0 { // revisions start at 1: 0 is none
			delete(now, name)
			continue
		}
		now[name] = true
		if !was[name] {
			s.log.Warn().Str("endpoint", name).Msg("endpoint defined both in the configuration file and in postbox.endpoints: the file's is used, the row is not; " +
				"remove one (postbox endpoints rm NAME, or its entry in the file and reload)")
		}
	}
	s.conflicts = now
}

// Refresh reads the rows of endpoint_state applied since the last read
// and applies them.
func (s *Syncer) Refresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshLocked(ctx)
}

func (s *Syncer) refreshLocked(ctx context.Context) error {
	var applied []string
	since := s.since
	// Each row is applied as it is read, not held with the others: until
	// the first ingest moves the checkpoint, the rows a first start seeded
	// (at position 0) are all read again by every read, 100,000 of them
	// held at once for 200 MB.
	seeded := false // rows of a first start's seed were read
	at, err := s.env.Store.ScanEndpointState(ctx, since, false, func(st store.EndpointState) error {
		rowsRead.Add(1)
		s.since = max(s.since, st.LSN)
		seeded = seeded || st.LSN == 0
		// Rows of the read's position are read again, and the stream may
		// be ahead: apply only what is news. A delete keeps its row's
		// revision.
		ok, rev := s.table.Has(st.Name), s.table.Revision(st.Name)
		if st.Row == nil && (!ok || rev > st.Revision) || st.Row != nil && (ok && rev >= st.Revision || s.gone[st.Name] >= st.Revision) {
			return nil
		}
		s.applyLocked(st.Name, st.Row, st.Revision, true)
		applied = append(applied, st.Name)
		return nil
	})
	if err != nil {
		s.since = since // read again from where it began
		return err
	}
	// Every change committed before the ingest's position is in what was
	// read: the next read starts there, not at the last row's position,
	// which a seed gives every row (100,000 rows read again each second).
	s.since = max(s.since, at)
	if seeded {
		s.since = pastFirstSeed(s.since, at)
	}
	s.advance(at)
	if len(applied) > 0 {
		s.log.Debug().Int("changes", len(applied)).Stringer("applied", s.Applied()).Msg("applied endpoint changes")
		s.changed()
		s.warnConflicts(applied...)
	}
	return nil
}

// Await returns once every endpoint change committed before commit is
// applied: at once when it is, else after one read of endpoint_state (an
// event is claimed once ingested, and its ingest wrote every change
// before it).
func (s *Syncer) Await(ctx context.Context, commit uint64) error {
	if s.applied.Load() >= commit {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applied.Load() >= commit {
		return nil // another attempt's read applied it
	}
	return s.refreshLocked(ctx)
}

// Apply applies a change as the stream decoded it (the streaming
// instance, ahead of endpoint_state): an update's row is merged into the
// applied one, whose TOAST-unchanged columns it lacks.
func (s *Syncer) Apply(c wal.EndpointChange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case c.Deleted:
		s.applyLocked(c.Name, nil, c.Revision, true)
	case c.OldName != "":
		// Renamed: the columns the update left out are the old name's.
		row := maps.Clone(s.rows[c.OldName])
		if row == nil {
			row = endpoints.Row{}
		}
		maps.Copy(row, c.Row)
		s.applyLocked(c.Name, row, c.Revision, true)
		s.applyLocked(c.OldName, nil, c.Revision, true)
	default:
		s.applyLocked(c.Name, c.Row, c.Revision, c.Inserted)
	}
	s.changed()
	if c.OldName != "" {
		s.warnConflicts(c.Name, c.OldName)
	} else {
		s.warnConflicts(c.Name)
	}
}

// Decoded says the stream decoded all of a transaction committed at
// commit: every endpoint change before it is applied.
func (s *Syncer) Decoded(commit pglogrepl.LSN) { s.advance(commit) }

// applyLocked puts a row (nil: a delete) of revision into the table
// unless it holds a later one; a row not whole is merged into the one
// applied.
func (s *Syncer) applyLocked(name string, row endpoints.Row, revision int64, whole bool) {
	if row == nil {
		s.table.Remove(name, revision)
		if !s.table.Has(name) {
			delete(s.rows, name)
		}
		s.gone[name] = max(s.gone[name], revision)
		s.heldChanged(name)
		return
	}
	if s.gone[name] >= revision {
		return
	}
	delete(s.gone, name)
	if !whole {
		merged := maps.Clone(s.rows[name])
		if merged == nil {
			merged = endpoints.Row{}
		}
		maps.Copy(merged, row)
		row = merged
	}
	te := endpoints.Parse(row)
	te.Name = name
	s.table.ApplyRow(te, rowText(name, row))
	if s.table.Revision(name) == te.Revision {
		if mayToast(row) {
			s.rows[name] = row
		} else {
			delete(s.rows, name)
		}
	}
	s.heldChanged(name)
}

// toastThreshold is below PostgreSQL's TOAST_TUPLE_THRESHOLD (about
// 2 kB): only a row larger than it may have a value stored out of line,
// which an update that leaves it unchanged does not send.
const toastThreshold = 1024

// mayToast reports whether row is large enough to have a value TOASTed
// out of line: only such rows are kept for merges (100,000 small rows
// kept as text would double the memory the parsed ones take).
func mayToast(row endpoints.Row) bool {
	n := 0
	for k, v := range row {
		n += len(k)
		if v != nil {
			n += len(*v)
		}
	}
	return n > toastThreshold
}

// Held names the table's endpoints whose events wait (execute.Held under
// the configuration in force), sorted; computed again after a change or
// a reload only.
func (s *Syncer) Held() []string {
	held, _ := s.heldAndInvalid()
	return held
}

// Invalid names the table's endpoints that are invalid (a row postbox
// cannot use as written), sorted: the endpoint_invalid alert.
func (s *Syncer) Invalid() []string {
	_, invalid := s.heldAndInvalid()
	return invalid
}

func (s *Syncer) heldAndInvalid() ([]string, []string) {
	cfg := s.env.Config()
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.heldCfg != cfg {
		s.heldBy = map[string]string{}
		s.table.Each(func(te config.TableEndpoint) {
			if h := heldOf(cfg, te); h != "" {
				s.heldBy[te.Name] = h
			}
		})
		s.heldCfg, s.listed = cfg, false
	}
	if !s.listed {
		s.held, s.invalid = nil, nil
		for name, h := range s.heldBy {
			s.held = append(s.held, name)
			if h != "disabled" {
				s.invalid = append(s.invalid, name)
			}
		}
		slices.Sort(s.held)
		slices.Sort(s.invalid)
		s.listed = true
	}
	return s.held, s.invalid
}

// heldChanged computes again whether name is held, after a change to its
// row alone.
func (s *Syncer) heldChanged(name string) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.heldCfg == nil {
		return // computed whole when next asked
	}
	h := ""
	if te, ok := s.table.Get(name); ok {
		h = heldOf(s.heldCfg, te)
	}
	if h != s.heldBy[name] {
		if h == "" {
			delete(s.heldBy, name)
		} else {
			s.heldBy[name] = h
		}
		s.listed = false
	}
}

// heldOf is why te's events wait under cfg (execute.Held), "" when they
// do not or when the file defines the name (the file wins). It resolves
// te without keeping the resolution: an endpoint's is kept when its
// events are attempted (Config.Endpoint), not for every row at once.
func heldOf(cfg *config.Config, te config.TableEndpoint) string {
	heldResolutions.Add(1)
	if _, ok := cfg.Endpoints[te.Name]; ok {
		return ""
	}
	return execute.Held(cfg.ResolveTableEndpoint(te))
}

// rowsRead counts the rows Refresh read (tests: a read starts at the
// ingest's position).
var rowsRead atomic.Int64

// heldResolutions counts heldOf's resolutions (tests: a change resolves
// its own endpoint only).
var heldResolutions atomic.Int64

// listenLoop reads endpoint_state when the streaming instance NOTIFYs
// that it applied changes: a LISTEN on its own connection, reconnecting
// with backoff.
func (s *Syncer) listenLoop(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		conn, err := s.env.Pool().Acquire(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+store.EndpointsChannel)
			if err == nil {
				// Changes made before the LISTEN took hold.
				err = s.Refresh(ctx)
			}
			for err == nil {
				attempt = 1
				var n *pgconn.Notification
				if n, err = conn.Conn().WaitForNotification(ctx); err == nil && n != nil {
					err = s.Refresh(ctx)
					s.env.Faults.Observe("endpoints", err)
				}
			}
			// The connection had a LISTEN: do not give it back to the pool.
			_ = conn.Conn().Close(context.Background())
			conn.Release()
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Debug().Err(err).Msg("endpoint notifications interrupted; reconnecting")
		if !service.Sleep(ctx, service.RetryWait(attempt)) {
			return
		}
	}
}

// pollLoop reads endpoint_state every PollIntervalDefault.
func (s *Syncer) pollLoop(ctx context.Context) {
	t := time.NewTicker(PollIntervalDefault)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			err := s.Refresh(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("could not read the applied endpoints")
			}
			s.env.Faults.Observe("endpoints", err)
		}
	}
}

// String is for logs: how many endpoints are applied, and up to where.
func (s *Syncer) String() string {
	return fmt.Sprintf("%d endpoints applied up to %s", s.table.Len(), s.Applied())
}
