package wal

import (
	"fmt"
	"os"
	"strconv"
	"strings"
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
