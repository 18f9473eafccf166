package bench

import (
	"os"
	"syscall"
)

// datasync is fdatasync(2), what PostgreSQL's default wal_sync_method
// calls on Linux.
func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
