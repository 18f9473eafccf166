package bench

import (
	"os"
	"syscall"
	"time"
)

// datasync is fdatasync(2), what PostgreSQL's default wal_sync_method
// calls on Linux.
func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// threadSleep sleeps d in the kernel, on the calling thread: the pause
// watcher's locked thread, which a runtime timer would leave.
func threadSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_ = syscall.Nanosleep(&ts, nil)
}
