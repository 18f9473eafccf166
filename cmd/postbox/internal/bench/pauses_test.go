package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// watchChildEnv makes the test binary a child that watches its host until
// its standard input closes, then prints the pauses it saw as JSON.
const watchChildEnv = "POSTBOX_TEST_HOST_WATCH_CHILD"

// TestHostWatchChild is the child's part of TestHostWatchSeesTheMachineStandStill.
func TestHostWatchChild(t *testing.T) {
	if os.Getenv(watchChildEnv) == "" {
		t.Skip("run by TestHostWatchSeesTheMachineStandStill")
	}
	w := watchHost()
	start := time.Now()
	fmt.Println("watching")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	w.stopWatch()
	p := w.between(start, time.Now())
	require.NotNil(t, p, "the watch thread's statistics")
	require.NoError(t, json.NewEncoder(os.Stdout).Encode(p))
}

// TestHostWatchSeesTheMachineStandStill stops a process with SIGSTOP, as
// a throttled VM's host stops its vCPUs: none of its threads runs or
// waits for a CPU meanwhile. Its watch must count that stop as a pause
// at least about as long. The machine itself may stand still too, when
// the tests around keep both CPUs busy on a throttled VM: such a pause,
// about 100 ms, adds to the stop when it falls just before or after it,
// and counts on its own elsewhere; none comes near the stop's length.
func TestHostWatchSeesTheMachineStandStill(t *testing.T) {
	if _, err := os.Stat("/proc/thread-self/schedstat"); err != nil {
		t.Skip("no scheduler statistics per thread here")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostWatchChild$", "-test.v")
	cmd.Env = append(os.Environ(), watchChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "watching" {
	}

	time.Sleep(300 * time.Millisecond)
	const stopped = 250 * time.Millisecond
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(stopped)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, stdin.Close())

	var got *HostPauses
	for lines.Scan() {
		var p HostPauses
		if json.Unmarshal(lines.Bytes(), &p) == nil {
			got = &p
		}
	}
	require.NoError(t, cmd.Wait())
	require.NotNil(t, got, "the child printed its pauses")
	t.Logf("stopped for %s: %+v", stopped, *got)
	require.GreaterOrEqual(t, got.Count, 1, "the stop")
	// The signals' own delivery and the watch's tick blur the edges by a
	// few milliseconds; the machine's own pauses can lengthen it.
	stop := float64(stopped.Milliseconds())
	require.GreaterOrEqual(t, got.LongestMS, stop-60, "as long as the stop")
	require.LessOrEqual(t, got.LongestMS, stop+250, "the stop, with at most a pause of the machine on either side")
	require.GreaterOrEqual(t, got.TotalMS, got.LongestMS)
}

func TestStandingStillIsWhatSleepAndWaitDoNotExplain(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	require.Equal(t, 95*ms, standingStill(105*ms, 5*ms, 5*ms), "a late wake the run delay does not explain")
	require.Zero(t, standingStill(105*ms, 5*ms, 100*ms), "a thread kept from a CPU by others")
	require.Zero(t, standingStill(4*ms, 5*ms, 0), "an early wake")
	d, ok := runDelay([]byte("1200000000 350000000 4242\n"))
	require.True(t, ok)
	require.Equal(t, 350*time.Millisecond, d)
	_, ok = runDelay([]byte("12\n"))
	require.False(t, ok, "a short line")
	_, ok = runDelay(nil)
	require.False(t, ok, "a failed read")

	t0 := time.Now()
	w := &hostWatch{watching: true, pauses: []hostPause{{t0, 50 * ms}, {t0.Add(time.Second), 120 * ms}, {t0.Add(2 * time.Second), 60 * ms}}}
	require.Equal(t, &HostPauses{Count: 2, LongestMS: 120, TotalMS: 170}, w.between(t0, t0.Add(2*time.Second)), "the pauses that began in the run")
	require.Nil(t, (&hostWatch{}).between(t0, t0.Add(time.Hour)), "nothing watched")
	require.Nil(t, (*hostWatch)(nil).between(t0, t0.Add(time.Hour)))
}
