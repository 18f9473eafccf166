package wal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// drained is an Acker with nothing in flight.
type drained struct{}

func (drained) Durable(flushed pglogrepl.LSN) pglogrepl.LSN { return flushed }
func (drained) Drained() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// TestWalsenderNiceWeighsTheSessionsWalsender: a session given
// WalsenderNice gives its walsender that nice value, and the walsender's
// autogroup too where the kernel groups sessions, before it streams. A
// process that is not a walsender, or is not this session's, is refused.
func TestWalsenderNiceWeighsTheSessionsWalsender(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	table, err := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx, pool, table))
	slot, pub := pgtest.UniqueName("slot"), pgtest.UniqueName("pub")
	require.NoError(t, EnsurePublication(ctx, pool, pub, table))
	_, err = CreateSlot(ctx, dbURL, slot)
	require.NoError(t, err)

	stream := NewStream(Options[struct{}]{ConnString: dbURL, Slot: slot, Publication: pub, Table: table, WalsenderNice: 3, Logger: zerolog.Nop()})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	started, done := make(chan Session, 1), make(chan error, 1)
	plan := func(Session) (pglogrepl.LSN, pglogrepl.LSN, error) { return 0, 0, nil }
	go func() {
		done <- stream.Run(runCtx, plan, NewQueue[struct{}](100, 1<<20), drained{}, func(s Session) { started <- s })
	}()
	var sess Session
	select {
	case sess = <-started:
	case err := <-done:
		t.Fatalf("the session ended before it streamed: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the session did not start")
	}
	st, err := Slot(ctx, pool, slot)
	require.NoError(t, err)
	require.True(t, st.Active)
	require.Equal(t, 3, niceOf(t, st.ActivePID), "the walsender's own nice")
	if on, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); err == nil && strings.TrimSpace(string(on)) == "1" {
		group, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", st.ActivePID))
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(strings.TrimSpace(string(group)), "nice 3"), "its autogroup: %s", group)
	}
	require.ErrorContains(t, LocalWalsender(st.ActivePID, 1), "not this session's")

	// The session names its walsender, whose CPU is read only as its.
	require.Equal(t, st.ActivePID, sess.Walsender.PID)
	require.NotZero(t, sess.Walsender.ClientPort)
	cpu, err := sess.Walsender.CPU()
	require.NoError(t, err)
	require.Equal(t, 3, cpu.Nice)
	require.Positive(t, cpu.Ran, "it has run")
	_, err = Walsender{PID: st.ActivePID, ClientPort: 1}.CPU()
	require.ErrorContains(t, err, "not this session's")
	_, err = Walsender{}.CPU()
	require.ErrorIs(t, err, errNoPID)

	sleep := exec.Command("sleep", "60")
	require.NoError(t, sleep.Start())
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	require.ErrorContains(t, LocalWalsender(sleep.Process.Pid, 0), "not a walsender")
	require.Equal(t, 0, niceOf(t, sleep.Process.Pid), "left untouched")
	require.ErrorContains(t, LocalWalsender(1<<22+1, 0), "not on this machine")

	cancel()
	require.NoError(t, <-done)
}

// niceOf is pid's nice value.
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	c, err := proc.ReadCPU(pid)
	require.NoError(t, err)
	return c.Nice
}

// TestWeighWalsenderNamesWhyItCouldNot: when the session could not learn
// its walsender's pid, the warning that walsender_nice was not applied
// says why (the lookup's error), not only that the pid is missing; a
// session with no pid and no error says the server did not name it.
func TestWeighWalsenderNamesWhyItCouldNot(t *testing.T) {
	var logged strings.Builder
	ss := &session[struct{}]{opts: Options[struct{}]{WalsenderNice: -5}, log: zerolog.New(&logged)}
	ss.weighWalsender(Walsender{}, errors.New("ask for the walsender's pid: permission denied"))
	require.Contains(t, logged.String(), "could not weigh the walsender")
	require.Contains(t, logged.String(), "permission denied")
	require.Contains(t, logged.String(), `"walsender_nice":-5`)

	logged.Reset()
	ss.weighWalsender(Walsender{}, nil)
	require.Contains(t, logged.String(), errNoPID.Error())
}
