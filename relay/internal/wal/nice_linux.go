package wal

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// walsenderHere checks that process pid on this machine is the walsender
// of the connection whose client end is local: PostgreSQL titles it
// "postgres: walsender USER HOST(PORT) …" (update_process_title, on by
// default), PORT being that end's. A connection over a Unix socket is
// titled "[local]" and has no port to compare.
func walsenderHere(pid int, local net.Addr) error {
	title, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("the walsender (pid %d) is not on this machine", pid)
	}
	t := strings.ReplaceAll(string(title), "\x00", " ")
	if !strings.Contains(t, "walsender") {
		return fmt.Errorf("process %d here is not a walsender: the server runs elsewhere, or its update_process_title is off", pid)
	}
	if tcp, ok := local.(*net.TCPAddr); ok && !strings.Contains(t, "("+strconv.Itoa(tcp.Port)+")") {
		return fmt.Errorf("walsender %d here is not this session's: its title does not name port %d", pid, tcp.Port)
	}
	return nil
}

// setNice gives process pid the nice value nice where it counts: its own,
// which weighs it among the processes of its scheduling group, and, where
// the kernel groups sessions (sched_autogroup_enabled), its autogroup's,
// which weighs the group against the others. PostgreSQL makes each of its
// processes a session leader, so a walsender's autogroup is it alone, and
// without the group's nice its own changes nothing.
func setNice(pid, nice int) error {
	err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice)
	if on, rerr := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); rerr == nil && strings.TrimSpace(string(on)) == "1" {
		if werr := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(nice)), 0); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return err
}
