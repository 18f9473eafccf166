// Package proc reads and sets what weighs a process on this machine's
// CPUs: its time on a CPU and waiting for one, its nice value, and how
// the kernel schedules this process's own threads. The relay weighs and
// watches its walsender with it (walsender_nice, the doctor's check, the
// walsender's metrics) and schedules itself (cpu_scheduling); the bench,
// the bare client's.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"
)

// CPU is a process's time on a CPU and waiting for one, from
// /proc/PID/schedstat, and its nice value (ReadCPU).
type CPU struct {
	Ran, Waited time.Duration
	Nice        int
}

// StatFields reads a /proc stat file, a process's (/proc/PID/stat) or a
// thread's (/proc/PID/task/TID/stat), and returns its fields from the
// third on, after the command name: proc(5)'s field n is at index n-3
// (0 the state, 16 the nice value, 38 the scheduling policy). The name,
// in parentheses, may hold spaces and parentheses of its own, so the
// fields start after the file's last ')'.
func StatFields(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: no command name in %q", path, b)
	}
	return strings.Fields(string(b[i+1:])), nil
}
