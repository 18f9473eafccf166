package proc

import (
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGoneProvesOnlyWhatThisHostCanSee: a process of this host, boot and
// pid namespace is gone when its pid is free, another's (a recycled pid:
// another start time) or a zombie's; one that runs is not, nor is one
// named by another host, boot or namespace, nor one named without a boot
// id.
func TestGoneProvesOnlyWhatThisHostCanSee(t *testing.T) {
	t.Parallel()
	me := Self()
	require.True(t, me.Provable(), "%+v", me)
	require.False(t, Gone(me), "this process runs")

	run := func() (*exec.Cmd, Process) {
		cmd := exec.Command("sleep", "60")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		p := me
		p.PID = cmd.Process.Pid
		var err error
		p.Start, _, err = started(p.PID)
		require.NoError(t, err)
		return cmd, p
	}
	cmd, p := run()
	require.False(t, Gone(p), "it runs")
	recycled := p
	recycled.Start--
	require.True(t, Gone(recycled), "its pid is another process's")
	for _, other := range []func(*Process){
		func(p *Process) { p.Host += "-other" },
		func(p *Process) { p.BootID = "00000000-0000-0000-0000-000000000000" },
		func(p *Process) { p.PIDNS = "pid:[1]" },
		func(p *Process) { p.BootID = "" },
	} {
		q := recycled
		other(&q)
		require.False(t, Gone(q), "%+v proves nothing here", q)
	}

	require.NoError(t, cmd.Process.Kill())
	require.Eventually(t, func() bool { _, state, err := started(p.PID); return err == nil && state == "Z" }, 10*time.Second, 10*time.Millisecond)
	require.True(t, Gone(p), "a zombie runs no more")
	_ = cmd.Wait()
	require.True(t, Gone(p), "its pid is free")
}
