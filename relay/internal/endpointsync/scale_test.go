package endpointsync_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpointsync"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// memSyncer is a Syncer over n rows applied as the stream decodes them,
// with no database: Apply and Held need none.
func memSyncer(tb testing.TB, n int) *endpointsync.Syncer {
	tb.Helper()
	resolved, err := config.Default().Resolve()
	require.NoError(tb, err)
	resolved.EndpointTable = config.NewEndpointTable()
	var cfg atomic.Pointer[config.Config]
	cfg.Store(resolved)
	env := service.NewEnv(&cfg)
	env.Log = zerolog.Nop()
	s := endpointsync.New(env, resolved.EndpointTable, nil)
	for i := range n {
		s.Apply(partner(i, int64(i+1), "true"))
	}
	return s
}

// partner is a change of endpoint p-i to revision, enabled or not.
func partner(i int, revision int64, enabled string) wal.EndpointChange {
	name := fmt.Sprintf("p-%d", i)
	return wal.EndpointChange{Name: name, Inserted: true, Revision: revision, Row: map[string]*string{
		"name": text(name), "url": text(fmt.Sprintf("https://partner-%d.example/postback/v%d", i, revision)),
		"headers": text(fmt.Sprintf(`{"X-Partner": "%d"}`, i)), "timeout": text("00:00:10"),
		"enabled": text(enabled), "revision": text(itoa(revision)),
	}}
}

// TestHeldOneChangeResolvesOne: after the held endpoints were computed
// once, a change to one row resolves that row alone, and its hold shows
// at once.
func TestHeldOneChangeResolvesOne(t *testing.T) {
	// Not parallel: it counts the package's resolutions.
	const n = 2000
	s := memSyncer(t, n)
	before := endpointsync.HeldResolutions()
	require.Empty(t, s.Held())
	require.Equal(t, int64(n), endpointsync.HeldResolutions()-before, "the first computation resolves every row")

	before = endpointsync.HeldResolutions()
	s.Apply(partner(7, n+1, "false"))
	require.Equal(t, []string{"p-7"}, s.Held())
	s.Apply(partner(9, n+2, "false"))
	s.Apply(partner(7, n+3, "true"))
	require.Equal(t, []string{"p-9"}, s.Held())
	require.Empty(t, s.Invalid())
	require.Equal(t, int64(3), endpointsync.HeldResolutions()-before, "three changes resolve three rows, none of the others")
}

// BenchmarkApplyOneChangeAmong100k is the streaming instance's cost of
// one endpoint change among 100,000 rows: applied, and the held
// endpoints the next claim reads.
func BenchmarkApplyOneChangeAmong100k(b *testing.B) {
	const n = 100000
	s := memSyncer(b, n)
	s.Held()
	b.ResetTimer()
	for i := range b.N {
		s.Apply(partner(i%n, int64(n+1+i), "true"))
		s.Held()
	}
}

// TestTableKeepsRowsSmall: the rows applied are kept as their text, a
// few hundred bytes each, in a few objects for all of them, and read back
// as parsed.
func TestTableKeepsRowsSmall(t *testing.T) {
	// Not parallel: it measures the heap.
	const n = 20000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memSyncer(t, n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	perRow := float64(after.HeapAlloc-before.HeapAlloc) / n
	objects := int64(after.HeapObjects) - int64(before.HeapObjects)
	t.Logf("%.0f bytes a row, %d objects for %d rows", perRow, objects, n)
	require.Less(t, perRow, 400.0, "bytes of heap per row applied (parsed and kept whole, a row took 850)")
	// Each object is work for every cycle of the collector: kept as an
	// entry, a name and a text each, the rows made each cycle long, and
	// the deliveries of the time waited for it.
	require.Less(t, objects, int64(n/100), "heap objects for the rows applied (an entry, a name and a text a row: 3 a row)")

	te, ok := s.Table().Get("p-42")
	require.True(t, ok)
	require.Equal(t, "https://partner-42.example/postback/v43", *te.Settings.URL)
	require.Equal(t, map[string]string{"X-Partner": "42"}, te.Settings.Headers)
	require.Equal(t, int64(43), te.Revision)
	require.True(t, te.Enabled)
	runtime.KeepAlive(s)
}

// BenchmarkGCBeside100k is a whole collection with 100,000 rows applied:
// what each cycle of the relay's collector marks beside the rows, the
// pause its deliveries of the time wait out on two cores.
func BenchmarkGCBeside100k(b *testing.B) {
	s := memSyncer(b, 100000)
	s.Held()
	for b.Loop() {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapObjects), "heap-objects")
	runtime.KeepAlive(s)
}
