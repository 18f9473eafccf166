// Package proc reads and sets what weighs a process on this machine's
// CPUs: its time on a CPU and waiting for one, its nice value, and how
// the kernel schedules this process's own threads. The relay weighs and
// watches its walsender with it (walsender_nice, the doctor's check, the
// walsender's metrics) and schedules itself (cpu_scheduling); the bench,
// the bare client's.
package proc

import "time"

// CPU is a process's time on a CPU and waiting for one, from
// /proc/PID/schedstat, and its nice value (ReadCPU).
type CPU struct {
	Ran, Waited time.Duration
	Nice        int
}
