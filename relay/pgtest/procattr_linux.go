package pgtest

import "syscall"

// serverAttr starts the server as cred (nil: as this process) in a process
// group of its own, and asks the kernel to send it SIGQUIT, PostgreSQL's
// immediate shutdown, when the thread that started it exits.
func serverAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
}
