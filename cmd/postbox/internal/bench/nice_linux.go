package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// setNice gives process pid the nice value nice, both where it counts:
// its own, which weighs it among the processes of its scheduling group,
// and, where the kernel groups sessions, its autogroup's, which weighs
// the group. A PostgreSQL backend leads a session of its own, so its
// autogroup is it alone.
func setNice(pid, nice int) error {
	err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice)
	if on, rerr := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); rerr == nil && strings.TrimSpace(string(on)) == "1" {
		if werr := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(nice)), 0); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return err
}
