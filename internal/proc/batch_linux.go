package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// The policies of sched(7) a process may choose for itself.
const (
	schedOther = 0
	schedBatch = 3
)

// SetBatch schedules every thread of this process as SCHED_BATCH (batch
// true) or as the default SCHED_OTHER (false). A batch thread the kernel
// wakes takes a CPU that is free, or waits for its turn, instead of
// preempting the process running there. Threads started later inherit the
// policy of the one that starts them, so once each thread has it, the
// process keeps it. Any process may choose either for its own threads; it
// changes nothing while a CPU is free.
func SetBatch(batch bool) error {
	policy, name := schedOther, "other"
	if batch {
		policy, name = schedBatch, "batch"
	}
	// A thread may start while the list is read: go round until a round
	// finds every thread done.
	done := map[int]bool{}
	for round := 0; round < 10; round++ {
		tids, err := threads()
		if err != nil {
			return err
		}
		changed := false
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			if err := setPolicy(tid, policy); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("schedule thread %d as %s: %w", tid, name, err)
			}
			done[tid], changed = true, true
		}
		if !changed {
			return nil
		}
	}
	return fmt.Errorf("schedule as %s: threads kept starting", name)
}

// threads lists this process's threads.
func threads() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

func setPolicy(tid, policy int) error {
	var param struct{ priority int32 } // sched_priority: 0 for both policies
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(tid), uintptr(policy), uintptr(unsafe.Pointer(&param)))
	if errno != 0 {
		return errno
	}
	return nil
}
