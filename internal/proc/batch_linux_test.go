package proc

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSetBatchReachesEveryThread: in a process of its own (this test's
// binary again), SetBatch schedules every thread as batch, and the threads
// the runtime starts after it inherit the policy; SetBatch(false) undoes
// it. This process is left as it was.
func TestSetBatchReachesEveryThread(t *testing.T) {
	if os.Getenv("PROC_TEST_SET_BATCH") == "1" {
		if err := setBatchThenStartThreads(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("every thread batch")
		os.Exit(0)
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSetBatchReachesEveryThread$")
	cmd.Env = append(os.Environ(), "PROC_TEST_SET_BATCH=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "every thread batch")

	batch, err := allBatch()
	require.NoError(t, err)
	require.False(t, batch, "this process's threads")
}

// setBatchThenStartThreads is the child's part.
func setBatchThenStartThreads() error {
	if err := SetBatch(true); err != nil {
		return err
	}
	before, err := threads()
	if err != nil {
		return err
	}
	// Goroutines locked to their threads while they wait make the
	// runtime start more threads.
	var locked, wg sync.WaitGroup
	release := make(chan struct{})
	for range 32 {
		locked.Add(1)
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			locked.Done()
			<-release
		})
	}
	locked.Wait()
	after, err := threads()
	if err == nil && len(after) <= len(before) {
		err = fmt.Errorf("%d threads before, %d after: none started", len(before), len(after))
	}
	var batch bool
	if err == nil {
		batch, err = allBatch()
	}
	close(release)
	wg.Wait()
	if err == nil && !batch {
		err = fmt.Errorf("a thread started after SetBatch is not batch")
	}
	if err != nil {
		return err
	}
	// And back.
	if err := SetBatch(false); err != nil {
		return err
	}
	if batch, err = allBatch(); err == nil && batch {
		err = fmt.Errorf("still batch after SetBatch(false)")
	}
	return err
}

// allBatch reports whether every thread of this process is scheduled as
// SCHED_BATCH.
func allBatch() (bool, error) {
	tids, err := threads()
	if err != nil {
		return false, err
	}
	for _, tid := range tids {
		p, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
		if errno == syscall.ESRCH {
			continue // it ended
		}
		if errno != 0 {
			return false, fmt.Errorf("read thread %d's policy: %w", tid, errno)
		}
		if p != schedBatch {
			return false, nil
		}
	}
	return true, nil
}
