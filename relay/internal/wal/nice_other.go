//go:build !linux

package wal

import (
	"errors"
	"net"
	"time"
)

// walsenderHere cannot tell a walsender from another process without
// Linux's /proc: walsender_nice is for Linux.
func walsenderHere(int, net.Addr) error {
	return errors.New("walsender_nice works on Linux only")
}

func setNice(int, int) error { return errors.New("walsender_nice works on Linux only") }

// LocalWalsender needs Linux's /proc.
func LocalWalsender(int, int) error { return errors.New("telling a walsender here needs Linux") }

// CPU is a process's time on a CPU and waiting for one, and its nice value.
type CPU struct {
	Ran, Waited time.Duration
	Nice        int
}

// ProcessCPU needs Linux's /proc.
func ProcessCPU(int) (CPU, error) { return CPU{}, errors.New("reading a process's CPU needs Linux") }
