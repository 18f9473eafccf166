package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// setNice gives process pid the nice value nice, both where it counts, as
// the relay does for its own walsender (walsender_nice): its own, and its
// autogroup's where the kernel groups sessions; a PostgreSQL backend leads
// a session of its own.
func setNice(pid, nice int) error {
	err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice)
	if on, rerr := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); rerr == nil && strings.TrimSpace(string(on)) == "1" {
		if werr := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(nice)), 0); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return err
}

// niceOf is process pid's nice value, field 19 of /proc/pid/stat.
func niceOf(pid int) (int, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis start at field 3.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 19-2 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	return strconv.Atoi(fields[19-3])
}
