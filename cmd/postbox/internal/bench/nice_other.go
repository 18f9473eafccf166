//go:build !linux

package bench

import "syscall"

// setNice gives process pid the nice value nice.
func setNice(pid, nice int) error { return syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice) }
