//go:build !linux

package bench

import "os"

// datasync is fsync(2) where fdatasync(2) is not at hand.
func datasync(f *os.File) error { return f.Sync() }
