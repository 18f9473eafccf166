package endpointsync_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpointsync"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/internal/wal"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testBundle is a database, the ingest connection of the instance that
// streams (writing endpoint_state as its ingest does), and the
// environment of an instance that does not.
type testBundle struct {
	st  *store.Store
	ic  *store.IngestConn
	env *service.Env
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	st := &store.Store{Pool: pool, Table: table, Slot: "test"}
	lead, ok, _, err := st.AcquireLeadership(ctx, "leader", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	ic, err := st.AcquireIngest(ctx, "leader")
	require.NoError(t, err)
	t.Cleanup(ic.Release)
	ic.SetSession(lead, "7000000000000000001", 1)

	resolved, err := config.Default().Resolve()
	require.NoError(t, err)
	resolved.EndpointTable = config.NewEndpointTable()
	var cfg atomic.Pointer[config.Config]
	cfg.Store(resolved)
	env := service.NewEnv(&cfg)
	env.Store, env.Owner, env.Log = st, "follower", zerolog.Nop()
	return &testBundle{st: st, ic: ic, env: env}
}

func text(s string) *string { return &s }

// ingest commits endpoint changes as the streaming instance's ingest
// does, with the checkpoint at end.
func (tb *testBundle) ingest(t *testing.T, end pglogrepl.LSN, ws []store.EndpointWrite, whole ...bool) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, tb.ic.WriteEndpoints(ctx, ws, whole))
	require.NoError(t, tb.ic.Commit(ctx, end, false))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func row(t *testing.T, name string, revision int64, cols map[string]string) []byte {
	t.Helper()
	m := map[string]*string{"name": text(name), "revision": text(itoa(revision))}
	for k, v := range cols {
		m[k] = text(v)
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// TestAwaitReadsChangesCommittedBeforeAnEvent is the gate on an instance
// that does not stream: with neither its NOTIFY nor its poll running, an
// attempt of an event committed after a change it has not applied reads
// the change first. An update merges into the applied row (its TOAST-
// unchanged columns kept), a delete removes the row, a row inserted again
// comes back.
func TestAwaitReadsChangesCommittedBeforeAnEvent(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	table := tb.env.Config().EndpointTable
	s := endpointsync.New(tb.env, table, nil)
	require.NoError(t, s.Reload(ctx))
	require.Zero(t, table.Len())

	tb.ingest(t, 0x200, []store.EndpointWrite{{Name: "p", Revision: 1, LSN: 0x100,
		Row: row(t, "p", 1, map[string]string{"url": "http://a.example/1", "headers": `{"X-A": "1"}`})}}, true)
	_, ok := table.Get("p")
	require.False(t, ok, "not applied before an event after it is attempted")
	require.NoError(t, s.Await(ctx, 0x150))
	te, ok := table.Get("p")
	require.True(t, ok)
	require.Equal(t, "http://a.example/1", *te.Settings.URL)
	require.GreaterOrEqual(t, s.Applied(), pglogrepl.LSN(0x200))

	// An update without its TOAST-unchanged headers.
	tb.ingest(t, 0x400, []store.EndpointWrite{{Name: "p", Revision: 2, LSN: 0x300,
		Row: row(t, "p", 2, map[string]string{"url": "http://a.example/2"})}}, false)
	require.NoError(t, s.Await(ctx, 0x300))
	te, _ = table.Get("p")
	require.Equal(t, "http://a.example/2", *te.Settings.URL)
	require.Equal(t, map[string]string{"X-A": "1"}, te.Settings.Headers, "the unchanged column keeps its value")
	require.Equal(t, "http://a.example/2", tb.env.Config().Endpoint("p").URL)

	// An older revision read again changes nothing.
	tb.ingest(t, 0x500, []store.EndpointWrite{{Name: "p", Revision: 1, LSN: 0x450,
		Row: row(t, "p", 1, map[string]string{"url": "http://a.example/1"})}}, true)
	require.NoError(t, s.Await(ctx, 0x450))
	te, _ = table.Get("p")
	require.Equal(t, int64(2), te.Revision)

	tb.ingest(t, 0x700, []store.EndpointWrite{{Name: "p", Revision: 2, LSN: 0x600}}, true)
	require.NoError(t, s.Await(ctx, 0x600))
	_, ok = table.Get("p")
	require.False(t, ok, "deleted")

	tb.ingest(t, 0x900, []store.EndpointWrite{{Name: "p", Revision: 3, LSN: 0x800,
		Row: row(t, "p", 3, map[string]string{"url": "http://a.example/3", "enabled": "f"})}}, true)
	require.NoError(t, s.Await(ctx, 0x800))
	te, ok = table.Get("p")
	require.True(t, ok, "inserted again")
	require.False(t, te.Enabled)
	require.Equal(t, []string{"p"}, s.Held(), "a disabled endpoint holds its events")
	require.Empty(t, s.Invalid())

	tb.ingest(t, 0xb00, []store.EndpointWrite{{Name: "p", Revision: 4, LSN: 0xa00,
		Row: row(t, "p", 4, map[string]string{"enabled": "t", "headers": `{"Host": "x"}`})}}, false)
	require.NoError(t, s.Await(ctx, 0xa00))
	require.Equal(t, []string{"p"}, s.Invalid(), "a header postbox sets makes the row invalid")
}

// TestStartedInstanceFollowsNotifications: started, an instance that
// does not stream applies a change when the ingest that wrote it NOTIFYs,
// with no event to attempt.
func TestStartedInstanceFollowsNotifications(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	table := tb.env.Config().EndpointTable
	changed := make(chan struct{}, 16)
	s := endpointsync.New(tb.env, table, func() { changed <- struct{}{} })
	require.NoError(t, s.Start(ctx))
	t.Cleanup(s.Stop)

	tb.ingest(t, 0x200, []store.EndpointWrite{{Name: "q", Revision: 1, LSN: 0x100,
		Row: row(t, "q", 1, map[string]string{"url": "http://q.example/"})}}, true)
	require.Eventually(t, func() bool { _, ok := table.Get("q"); return ok }, 10*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, s.Applied(), pglogrepl.LSN(0x200))
}

// TestStreamChangesApplyAsDecoded: the streaming instance applies the
// stream's changes at once, an update merged over the row applied (one
// large enough to have TOASTed values, which an update may leave out),
// and its applied position follows the decoded commits.
func TestStreamChangesApplyAsDecoded(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	table := tb.env.Config().EndpointTable
	s := endpointsync.New(tb.env, table, nil)
	s.Apply(wal.EndpointChange{Name: "r", Revision: 5, Inserted: true, Commit: 0x100,
		Row: map[string]*string{"name": text("r"), "revision": text("5"), "url": text("http://r.example/"), "max_in_flight": text("3"),
			"body": text(`{"pad": "` + strings.Repeat("x", 3000) + `"}`)}})
	s.Decoded(0x100)
	require.Equal(t, pglogrepl.LSN(0x100), s.Applied())
	s.Apply(wal.EndpointChange{Name: "r2", OldName: "r", Revision: 6, Commit: 0x200,
		Row: map[string]*string{"name": text("r2"), "revision": text("6"), "url": text("http://r2.example/")}})
	_, ok := table.Get("r")
	te, _ := table.Get("r2")
	require.Equal(t, 3, *te.Settings.MaxInFlight, "kept from the old name's row")
	require.False(t, ok, "renamed away")
	te, ok = table.Get("r2")
	require.True(t, ok)
	require.Equal(t, "http://r2.example/", *te.Settings.URL)
	s.Apply(wal.EndpointChange{Name: "r2", Revision: 7, Commit: 0x300,
		Row: map[string]*string{"name": text("r2"), "revision": text("7"), "max_in_flight": text("9")}})
	te, _ = table.Get("r2")
	require.Equal(t, "http://r2.example/", *te.Settings.URL, "kept: TOAST-unchanged in the update")
	require.Equal(t, 9, *te.Settings.MaxInFlight)
	s.Apply(wal.EndpointChange{Name: "r2", Revision: 7, Deleted: true, Commit: 0x400})
	require.Zero(t, table.Len())
}

// TestDeleteDecodedStaysDeletedWhileTheIngestCatchesUp: the streaming
// instance applies a delete as decoded; until its ingest writes it, a read
// of endpoint_state finds the row again (its position is read again), and
// leaves it deleted.
func TestDeleteDecodedStaysDeletedWhileTheIngestCatchesUp(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	table := tb.env.Config().EndpointTable
	s := endpointsync.New(tb.env, table, nil)
	tb.ingest(t, 0x200, []store.EndpointWrite{{Name: "d", Revision: 1, LSN: 0x100,
		Row: row(t, "d", 1, map[string]string{"url": "http://d.example/"})}}, true)
	require.NoError(t, s.Reload(ctx))
	_, ok := table.Get("d")
	require.True(t, ok)
	s.Apply(wal.EndpointChange{Name: "d", Revision: 1, Deleted: true, Commit: 0x300})
	require.NoError(t, s.Refresh(ctx))
	_, ok = table.Get("d")
	require.False(t, ok, "not brought back by the row read again")
}

// TestConflictsWarnedOnceWhenTheyAppear: a name defined both in the
// configuration file and in postbox.endpoints is warned of once when it
// begins to be: at start, when a change creates it, when a reload does;
// not again while it lasts, again once it went and came back.
func TestConflictsWarnedOnceWhenTheyAppear(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	logs := &lockedBuffer{}
	table := config.NewEndpointTable()
	var cur atomic.Pointer[config.Config]
	env := service.NewEnv(&cur)
	env.Store, env.Owner, env.Log = tb.st, "follower", zerolog.New(logs)
	file := func(names ...string) {
		f := config.Default()
		f.Endpoints = map[string]config.EndpointConfig{}
		for _, n := range names {
			u := "http://" + n + ".example/"
			f.Endpoints[n] = config.EndpointConfig{URL: &u}
		}
		cfg, err := f.Resolve()
		require.NoError(t, err)
		cfg.EndpointTable = table
		cur.Store(cfg)
	}
	warned := func() []string {
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(logs.string()), "\n") {
			var l struct {
				Level, Endpoint, Message string
			}
			if line == "" || json.Unmarshal([]byte(line), &l) != nil || !strings.Contains(l.Message, "defined both in the configuration file") {
				continue
			}
			require.Equal(t, "warn", l.Level)
			out = append(out, l.Endpoint)
		}
		return out
	}
	put := func(name string, rev int64) {
		tb.ingest(t, pglogrepl.LSN(0x100*rev+0x10), []store.EndpointWrite{{Name: name, Revision: rev, LSN: pglogrepl.LSN(0x100 * rev),
			Row: row(t, name, rev, map[string]string{"url": "http://row.example/"})}}, true)
	}

	file("both", "filed")
	put("both", 1)
	s := endpointsync.New(env, table, nil)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(s.Stop)
	require.Equal(t, []string{"both"}, warned(), "at start")

	// Changes: an update of a conflicting row says nothing new; a row
	// of another file endpoint's name is a new conflict.
	s.Apply(wal.EndpointChange{Name: "both", Revision: 2, Commit: 0x200, Row: map[string]*string{"name": text("both"), "revision": text("2"), "max_in_flight": text("3")}})
	s.Apply(wal.EndpointChange{Name: "rowonly", Revision: 3, Inserted: true, Commit: 0x300, Row: map[string]*string{"name": text("rowonly"), "revision": text("3")}})
	s.Apply(wal.EndpointChange{Name: "filed", Revision: 4, Inserted: true, Commit: 0x400, Row: map[string]*string{"name": text("filed"), "revision": text("4")}})
	require.Equal(t, []string{"both", "filed"}, warned())

	// Gone, then back: warned again.
	s.Apply(wal.EndpointChange{Name: "filed", Revision: 4, Deleted: true, Commit: 0x500})
	s.Apply(wal.EndpointChange{Name: "filed", Revision: 5, Inserted: true, Commit: 0x600, Row: map[string]*string{"name": text("filed"), "revision": text("5")}})
	require.Equal(t, []string{"both", "filed", "filed"}, warned())

	// A reload that adds rowonly to the file makes a conflict of it.
	file("both", "filed", "rowonly")
	s.Reconfigured()
	require.Equal(t, []string{"both", "filed", "filed", "rowonly"}, warned())
}

// lockedBuffer is a log sink the syncer's loops and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) string() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRefreshStartsAtTheIngestPosition: rows written at one position (a
// seed writes every row at its own) are read once; the reads after start
// at the ingest's position, past them.
func TestRefreshStartsAtTheIngestPosition(t *testing.T) {
	// Not parallel: it counts the package's rows read.
	tb := setup(t)
	ctx := context.Background()
	table := tb.env.Config().EndpointTable
	s := endpointsync.New(tb.env, table, nil)
	require.NoError(t, s.Reload(ctx))
	var ws []store.EndpointWrite
	for i := range 50 {
		name := "p-" + strconv.Itoa(i)
		ws = append(ws, store.EndpointWrite{Name: name, Revision: int64(i + 1), LSN: 0x100,
			Row: row(t, name, int64(i+1), map[string]string{"url": "http://a.example/" + name})})
	}
	tb.ingest(t, 0x200, ws, slices.Repeat([]bool{true}, len(ws))...)
	before := endpointsync.RowsRead()
	require.NoError(t, s.Refresh(ctx))
	require.Equal(t, 50, table.Len())
	require.NoError(t, s.Refresh(ctx))
	require.NoError(t, s.Refresh(ctx))
	require.Equal(t, int64(50), endpointsync.RowsRead()-before, "the rows at 0x100 are read once")
}

// TestSeededRowsReadOnce: a seed's rows, written as of the checkpoint's
// position, are read by the read of the whole table and by no read after
// it while the checkpoint stays where it was (an instance with nothing
// to ingest).
func TestSeededRowsReadOnce(t *testing.T) {
	// Not parallel: it counts the package's rows read.
	tb := setup(t)
	ctx := context.Background()
	tb.ingest(t, 0x200, nil)
	_, err := tb.st.Pool.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) SELECT 'p-' || i, 'http://a.example/' || i FROM generate_series(1, 50) i`)
	require.NoError(t, err)
	_, err = tb.st.SeedEndpoints(ctx, 0x200)
	require.NoError(t, err)
	table := tb.env.Config().EndpointTable
	s := endpointsync.New(tb.env, table, nil)
	require.NoError(t, s.Reload(ctx))
	require.Equal(t, 50, table.Len())
	before := endpointsync.RowsRead()
	for range 3 {
		require.NoError(t, s.Refresh(ctx))
	}
	require.Zero(t, endpointsync.RowsRead()-before, "the seeded rows are not read again")
	require.Equal(t, 50, table.Len())
}

// TestFirstSeedRowsReadOnce: the rows a first start seeded (at position
// 0, no event ingested yet) are read once by an instance that started
// before the seed, and by no read after it, while the ingest has no
// position; what the stream applies next is read.
func TestFirstSeedRowsReadOnce(t *testing.T) {
	// Not parallel: it counts the package's rows read.
	tb := setup(t)
	ctx := context.Background()
	var at string // the leadership's checkpoint row, at no position yet
	require.NoError(t, tb.st.Pool.QueryRow(ctx, `SELECT lsn::text FROM postbox.checkpoints WHERE slot = $1`, tb.st.Slot).Scan(&at))
	require.Equal(t, "0/0", at)
	table := tb.env.Config().EndpointTable
	s := endpointsync.New(tb.env, table, nil)
	require.NoError(t, s.Reload(ctx))
	require.Zero(t, table.Len())

	_, err := tb.st.Pool.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) SELECT 'p-' || i, 'http://a.example/' || i FROM generate_series(1, 50) i`)
	require.NoError(t, err)
	_, err = tb.st.SeedEndpoints(ctx, 0)
	require.NoError(t, err)
	before := endpointsync.RowsRead()
	require.NoError(t, s.Refresh(ctx))
	require.Equal(t, 50, table.Len())
	require.Equal(t, int64(50), endpointsync.RowsRead()-before, "the seeded rows are read")
	before = endpointsync.RowsRead()
	for range 3 {
		require.NoError(t, s.Refresh(ctx))
	}
	require.Zero(t, endpointsync.RowsRead()-before, "and not read again")

	// An instance that starts now reads them whole, and no more after.
	other := endpointsync.New(tb.env, config.NewEndpointTable(), nil)
	require.NoError(t, other.Reload(ctx))
	require.Equal(t, 50, other.Table().Len())
	before = endpointsync.RowsRead()
	require.NoError(t, other.Refresh(ctx))
	require.Zero(t, endpointsync.RowsRead()-before)

	tb.ingest(t, 0x300, []store.EndpointWrite{{Name: "p-51", Revision: 1000, LSN: 0x200,
		Row: row(t, "p-51", 1000, map[string]string{"url": "http://a.example/51"})}}, true)
	require.NoError(t, s.Refresh(ctx))
	require.Equal(t, 51, table.Len(), "a change the stream applied after the seed is read")
}
