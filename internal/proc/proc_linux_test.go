package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSetNiceWeighsTheProcessAndItsAutogroup: a process that leads a
// session of its own, as a PostgreSQL backend does, gets the nice value
// as its own and, where the kernel groups sessions, as its autogroup's.
func TestSetNiceWeighsTheProcessAndItsAutogroup(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	c, err := ReadCPU(pid)
	require.NoError(t, err)
	require.Equal(t, 0, c.Nice, "started at the default")

	require.NoError(t, SetNice(pid, 7))
	c, err = ReadCPU(pid)
	require.NoError(t, err)
	require.Equal(t, 7, c.Nice)
	if on, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); err == nil && strings.TrimSpace(string(on)) == "1" {
		group, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", pid))
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(strings.TrimSpace(string(group)), "nice 7"), "autogroup: %s", group)
	}

	require.Error(t, SetNice(1<<22+1, 7), "no such process")
	_, err = ReadCPU(1<<22 + 1)
	require.Error(t, err, "no such process")
}
