//go:build unix && !linux

package pgtest

import "syscall"

// serverAttr starts the server as cred (nil: as this process) in a process
// group of its own. Only Linux has a parent-death signal: elsewhere a
// server whose test process was killed outright (not stopped, not timed
// out) lingers until it is stopped by hand.
func serverAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
