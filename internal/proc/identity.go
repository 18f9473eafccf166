package proc

import "os"

// Process names a process so that another on the same machine can tell,
// later, whether it still runs: its pid alone may have been given to
// another process since (pid reuse), so the kernel's boot, the pid
// namespace the pid is counted in and the process's start time go with it.
// Registered by each instance, it lets a restarted instance prove that its
// predecessor is gone (Gone).
type Process struct {
	Host string
	// BootID is the kernel's boot id (Linux's
	// /proc/sys/kernel/random/boot_id); "" where there is none to read,
	// and then nothing about the process can be proven.
	BootID string
	// PIDNS is the pid namespace PID is counted in (/proc/self/ns/pid's
	// link): two containers on one kernel count pids apart.
	PIDNS string
	PID   int
	// Start is when the process started, in clock ticks after boot
	// (proc(5) stat field 22).
	Start int64
}

// Provable reports whether p names a process precisely enough that Gone
// can ever prove it gone.
func (p Process) Provable() bool {
	return p.BootID != "" && p.PIDNS != "" && p.PID > 0 && p.Start > 0
}

// host is os.Hostname, "" when it fails.
func host() string {
	h, _ := os.Hostname()
	return h
}
