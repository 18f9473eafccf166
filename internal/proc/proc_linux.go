package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
