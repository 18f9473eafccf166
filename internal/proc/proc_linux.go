package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SetNice gives process pid the nice value nice where it counts: its own,
// which weighs it among the processes of its scheduling group, and, where
// the kernel groups sessions (sched_autogroup_enabled), its autogroup's,
// which weighs the group against the others. PostgreSQL makes each of its
// processes a session leader, so a walsender's autogroup is it alone, and
// without the group's nice its own changes nothing.
func SetNice(pid, nice int) error {
	err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice)
	if on, rerr := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); rerr == nil && strings.TrimSpace(string(on)) == "1" {
		if werr := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(nice)), 0); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return err
}

// ReadCPU reads process pid's CPU.
func ReadCPU(pid int) (CPU, error) {
	var c CPU
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return c, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return c, fmt.Errorf("/proc/%d/schedstat: %q", pid, b)
	}
	ran, err1 := strconv.ParseInt(f[0], 10, 64)
	waited, err2 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return c, fmt.Errorf("/proc/%d/schedstat: %w", pid, err)
	}
	c.Ran, c.Waited = time.Duration(ran), time.Duration(waited)
	fields, err := StatFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return c, err
	}
	// The nice value is field 19.
	if len(fields) < 19-2 {
		return c, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	c.Nice, err = strconv.Atoi(fields[19-3])
	return c, err
}

// self is this process's Process, read once: none of it changes while the
// process runs but the host's name, which instances register at start.
var self = sync.OnceValue(func() Process {
	p := Process{Host: host(), PID: os.Getpid()}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return p
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return p
	}
	start, _, err := started(p.PID)
	if err != nil {
		return p
	}
	p.BootID, p.PIDNS, p.Start = strings.TrimSpace(string(boot)), ns, start
	return p
})

// Self is this process, as Gone will judge it from another.
func Self() Process { return self() }

// Gone reports whether p is proven to run no more: it ran on this host,
// under this boot of its kernel and in this pid namespace, and its pid is
// free, or is another process's (started at another time), or a zombie's
// (which runs no code and holds no connection). Anything else (another
// host, boot or namespace, a process that cannot be read) proves nothing,
// and Gone reports false.
func Gone(p Process) bool {
	me := Self()
	if !p.Provable() || !me.Provable() || p.Host != me.Host || p.BootID != me.BootID || p.PIDNS != me.PIDNS {
		return false
	}
	if p.PID == me.PID {
		return p.Start != me.Start
	}
	// kill(pid, 0) sees every process of the namespace, also those /proc
	// hides from other users (hidepid), where a missing /proc/PID would
	// read as gone.
	if err := syscall.Kill(p.PID, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	start, state, err := started(p.PID)
	if err != nil {
		return false
	}
	return start != p.Start || state == "Z" || state == "X"
}

// started reads process pid's start time (stat field 22) and state (field
// 3).
func started(pid int) (start int64, state string, err error) {
	f, err := StatFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", err
	}
	if len(f) < 22-2 {
		return 0, "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err = strconv.ParseInt(f[22-3], 10, 64)
	return start, f[0], err
}
