package wal

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LocalWalsender checks that process pid on this machine is the walsender
// whose client connected from clientPort, or over a Unix socket when
// clientPort is 0 (as pg_stat_replication reports it): PostgreSQL titles
// it "postgres: walsender USER HOST(PORT) …", "[local]" for a socket
// (update_process_title, on by default).
func LocalWalsender(pid, clientPort int) error {
	title, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("the walsender (pid %d) is not on this machine", pid)
	}
	t := strings.ReplaceAll(string(title), "\x00", " ")
	if !strings.Contains(t, "walsender") {
		return fmt.Errorf("process %d here is not a walsender: the server runs elsewhere, or its update_process_title is off", pid)
	}
	client := "[local]"
	if clientPort != 0 {
		client = "(" + strconv.Itoa(clientPort) + ")"
	}
	if !strings.Contains(t, client) {
		return fmt.Errorf("walsender %d here is not this session's: its title does not name %s", pid, client)
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

// ProcessCPU reads process pid's CPU.
func ProcessCPU(pid int) (CPU, error) {
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
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return c, err
	}
	// The fields after the command's closing parenthesis start at field 3;
	// the nice value is field 19.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 19-2 {
		return c, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	c.Nice, err = strconv.Atoi(fields[19-3])
	return c, err
}
