//go:build !linux

package proc

import (
	"errors"
	"os"
	"syscall"
)

// SetNice gives process pid the nice value nice: there are no autogroups
// to weigh outside Linux.
func SetNice(pid, nice int) error { return syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice) }

// ReadCPU needs Linux's /proc.
func ReadCPU(int) (CPU, error) {
	return CPU{}, errors.New("reading a process's CPU needs Linux's /proc")
}

// SetBatch needs Linux's SCHED_BATCH.
func SetBatch(bool) error { return errors.ErrUnsupported }

// Self is this process: without Linux's boot id nothing proves it gone
// later (see Process.Provable).
func Self() Process { return Process{Host: host(), PID: os.Getpid()} }

// Gone proves nothing outside Linux: it reports false.
func Gone(Process) bool { return false }
