package maintain

import (
	"bytes"
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// wait bounds a test's wait for a service's effect; tick is how often it
// looks, and the interval the services run at in tests.
const (
	wait = 10 * time.Second
	tick = 10 * time.Millisecond
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// newStore is a store on a fresh, migrated database.
func newStore(t *testing.T) *store.Store {
	t.Helper()
	ctx := context.Background()
	pool, err := store.Open(ctx, pgtest.NewDatabase(t), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	return &store.Store{Pool: pool, Table: table, Slot: "test"}
}

// bundle is what a test of a maintenance service looks at.
type bundle struct {
	env *service.Env
	st  *store.Store
	log *lockedBuffer
}

// setup is an Env of instance "me" on a fresh database, with the default
// configuration as edit changes it (edit may be nil).
func setup(t *testing.T, edit func(*config.Config)) *bundle {
	t.Helper()
	st := newStore(t)
	resolved, err := config.Default().Resolve()
	require.NoError(t, err)
	if edit != nil {
		edit(resolved)
	}
	var cfg atomic.Pointer[config.Config]
	cfg.Store(resolved)
	env := service.NewEnv(&cfg)
	log := &lockedBuffer{}
	env.Store, env.Owner, env.Log, env.Metrics = st, "me", zerolog.New(log), telemetry.NewMetrics()
	return &bundle{env: env, st: st, log: log}
}

// queue ingests n pending events for endpoint ep, each with its delivery.
func queue(t *testing.T, s *store.Store, n int) {
	t.Helper()
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = store.NewEvent{OutboxRow: store.OutboxRow{Event: state.Event{EventID: outbox.NewEventID(), Endpoint: "ep", Payload: []byte(`{}`)}}, Status: postboxtype.DeliveryPending}
	}
	ingest(t, s, evs)
}

// ingest writes evs as the ingest does.
func ingest(t *testing.T, s *store.Store, evs []store.NewEvent) {
	t.Helper()
	ctx := context.Background()
	ic, err := s.AcquireIngest(ctx, "ingest")
	require.NoError(t, err)
	defer ic.Release()
	_, err = ic.Insert(ctx, evs, false)
	require.NoError(t, err)
	require.NoError(t, ic.Commit(ctx, 0, false))
}

// count runs a SELECT count(*) statement.
func count(t *testing.T, s *store.Store, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// lockedBuffer is a log sink the test reads while a service writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestMaintainerStopJoinsEveryService: Stop returns once every service's
// goroutines have (the connection for life closed too), and a second
// Start is refused. Not parallel: it counts goroutines.
func TestMaintainerStopJoinsEveryService(t *testing.T) {
	tb := setup(t, nil)
	ctx := context.Background()
	before := goleak.IgnoreCurrent()
	m := New(tb.env, Deps{
		Streaming:    func() bool { return false },
		Queued:       func() {},
		Reload:       func(*config.Config) error { return nil },
		WalsenderCPU: func() (int, proc.CPU, bool) { return 0, proc.CPU{}, false },
	})
	require.NoError(t, m.Start(ctx))
	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM postbox.instances WHERE id = 'me'`) == 1
	}, wait, tick, "the heartbeat ran")
	require.ErrorIs(t, m.Start(ctx), service.ErrStarted)
	m.Stop()
	goleak.VerifyNone(t, before)
	require.Eventually(t, func() bool {
		return count(t, tb.st, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'postbox liveness' AND datname = current_database()`) == 0
	}, wait, tick, "the connection for life is closed")
}
