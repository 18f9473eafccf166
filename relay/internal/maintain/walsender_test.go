package maintain

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/internal/proc"
)

// The watch warns after a minute of readings that found the walsender
// starved, once an hour while it stays so, and says when it keeps up
// again; a new walsender, or none, starts it over.
func TestWalsenderWatch(t *testing.T) {
	t.Parallel()
	var w walsenderWatch
	now := time.Unix(1_800_000_000, 0)
	c := proc.CPU{}
	step := 15 * time.Second
	// next advances 15 s in which the walsender ran ran and waited waited.
	next := func(pid int, ran, waited time.Duration) walsenderVerdict {
		now = now.Add(step)
		c.Ran += ran
		c.Waited += waited
		v, over, gotRan, gotWaited := w.read(pid, c, true, now)
		if v != walsenderQuiet {
			require.Equal(t, step, over)
			require.Equal(t, ran, gotRan)
			require.Equal(t, waited, gotWaited)
		}
		return v
	}
	starved := func(pid int) walsenderVerdict { return next(pid, 3*time.Second, 4*time.Second) }
	fine := func(pid int) walsenderVerdict { return next(pid, 3*time.Second, time.Second) }

	require.Equal(t, walsenderQuiet, starved(7), "the first reading has nothing to compare with")
	for range walsenderStarvedReadings - 1 {
		require.Equal(t, walsenderQuiet, starved(7), "a burst does not warn")
	}
	require.Equal(t, walsenderWarn, starved(7), "a minute does")
	require.Equal(t, walsenderQuiet, starved(7), "once")
	for range int(walsenderWarnEvery/step) - 2 {
		require.Equal(t, walsenderQuiet, starved(7))
	}
	require.Equal(t, walsenderWarn, starved(7), "again after an hour")
	require.Equal(t, walsenderRecovered, fine(7))
	require.Equal(t, walsenderQuiet, fine(7))

	// Idle: waiting as long as it runs, but hardly running (under 2%).
	for range 2 * walsenderStarvedReadings {
		require.Equal(t, walsenderQuiet, next(7, 100*time.Millisecond, 200*time.Millisecond))
	}

	// A new walsender (a new session) starts over, as does none.
	for range walsenderStarvedReadings - 1 {
		require.Equal(t, walsenderQuiet, starved(7))
	}
	require.Equal(t, walsenderQuiet, starved(8), "a new pid: a first reading")
	v, _, _, _ := w.read(0, proc.CPU{}, false, now)
	require.Equal(t, walsenderQuiet, v, "none here")
	for range walsenderStarvedReadings {
		require.Equal(t, walsenderQuiet, starved(8), "after none, a first reading and three")
	}
	require.Equal(t, walsenderWarn, starved(8))

	// The same pid with less CPU than before is another process.
	c = proc.CPU{}
	require.Equal(t, walsenderQuiet, starved(8), "the counters went back: a first reading")
}

// The warning names the walsender, what it ran and waited, and the fix:
// batch scheduling where postbox has it off, the weight where the walsender
// has none, more CPU where it has one.
func TestWalsenderWatchLogsTheFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		nice  int
		batch bool
		fix   string
	}{{0, true, "walsender_nice: -10"}, {-10, true, "the walsender is weighed already"}, {0, false, "cpu_scheduling: batch"}} {
		var buf bytes.Buffer
		log := zerolog.New(&buf)
		var w walsenderWatch
		now := time.Unix(1_800_000_000, 0)
		c := proc.CPU{Nice: tc.nice}
		for range walsenderStarvedReadings + 1 {
			w.observe(log, 42, c, true, tc.batch, now)
			now = now.Add(15 * time.Second)
			c.Ran += 3 * time.Second
			c.Waited += 4 * time.Second
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		require.Len(t, lines, 1, buf.String())
		require.Contains(t, lines[0], `"level":"warn"`)
		require.Contains(t, lines[0], "WALSENDER STARVED")
		require.Contains(t, lines[0], `"pid":42`)
		require.Contains(t, lines[0], tc.fix)
	}
}

// The watch, running, reads the walsender every interval and warns once it
// was starved for its number of readings.
func TestWalsenderWatchWarnsWhileRunning(t *testing.T) {
	t.Parallel()
	tb := setup(t, nil)
	var c proc.CPU
	w := newWalsenderWatch(tb.env, func() (int, proc.CPU, bool) {
		c.Ran += 3 * time.Second
		c.Waited += 4 * time.Second
		return 42, c, true
	})
	require.Equal(t, WalsenderFirstDefault, w.first)
	require.Equal(t, WalsenderIntervalDefault, w.interval)
	w.first, w.interval = 0, time.Millisecond
	require.NoError(t, w.Start(context.Background()))
	defer w.Stop()
	require.Eventually(t, func() bool { return strings.Contains(tb.log.String(), "WALSENDER STARVED") }, wait, tick)
}
