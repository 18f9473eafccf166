//go:build !linux

package wal

import (
	"errors"
	"net"
)

// walsenderHere cannot tell a walsender from another process without
// Linux's /proc: walsender_nice is for Linux.
func walsenderHere(int, net.Addr) error {
	return errors.New("walsender_nice works on Linux only")
}

func setNice(int, int) error { return errors.New("walsender_nice works on Linux only") }
