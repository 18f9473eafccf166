//go:build !linux

package bench

import (
	"errors"
	"syscall"
)

// setNice gives process pid the nice value nice.
func setNice(pid, nice int) error { return syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice) }

// niceOf needs Linux's /proc.
func niceOf(int) (int, error) { return 0, errors.New("reading a process's nice value needs Linux") }
