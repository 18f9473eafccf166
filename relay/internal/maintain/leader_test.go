package maintain

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// holdUpkeepLock takes the upkeep lock on a session of its own, as another
// instance that leads would; the returned func lets it go.
func holdUpkeepLock(t *testing.T, tb *bundle) func() {
	t.Helper()
	ctx := context.Background()
	conn, err := tb.st.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(upkeepLock))
	require.NoError(t, err)
	var once sync.Once
	release := func() {
		once.Do(func() {
			_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(upkeepLock))
			require.NoError(t, err)
			conn.Release()
		})
	}
	t.Cleanup(release)
	return release
}

// The leader's duties run where the upkeep lock is free, not while another
// session holds it; two duties of one instance that look at once both run.
func TestLeaderRunsWhereItGetsTheLock(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	ctx := context.Background()
	lead := newLeader(tb.env, new(sync.Mutex))
	var ran atomic.Int32
	f := func(context.Context) error { ran.Add(1); return nil }

	release := holdUpkeepLock(t, tb)
	require.NoError(t, lead.do(ctx, f))
	require.Zero(t, ran.Load(), "another instance leads")
	release()

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { require.NoError(t, lead.do(ctx, f)) })
	}
	wg.Wait()
	require.EqualValues(t, 2, ran.Load(), "each in turn")
	require.Zero(t, count(t, tb.st, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`),
		"the lock is let go")
}

// An upkeep runs once an interval as the leader, and looks again at its
// shorter cadence while another instance leads.
func TestUpkeepRunsOnceAnIntervalAsTheLeader(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	ctx := context.Background()
	var ran atomic.Int32
	u := newUpkeep(tb.env, newLeader(tb.env, new(sync.Mutex)), PercentilesIntervalDefault, func(context.Context) error { ran.Add(1); return nil })
	require.Equal(t, TelemetryFirstDefault, u.first)
	require.Equal(t, TelemetryIntervalDefault, u.interval)

	release := holdUpkeepLock(t, tb)
	u.round(ctx)
	require.Zero(t, ran.Load(), "another instance leads")
	release()
	u.round(ctx)
	require.EqualValues(t, 1, ran.Load(), "it leads now")
	u.round(ctx)
	require.EqualValues(t, 1, ran.Load(), "not again within the interval")
}
