//go:build !linux

package bench

import (
	"os"
	"time"
)

// datasync is fsync(2) where fdatasync(2) is not at hand.
func datasync(f *os.File) error { return f.Sync() }

// threadSleep is time.Sleep where there is no /proc to watch a thread by:
// the pause watcher returns before it sleeps there.
func threadSleep(d time.Duration) { time.Sleep(d) }
