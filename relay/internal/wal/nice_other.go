//go:build !linux

package wal

import "errors"

// LocalWalsender needs Linux's /proc.
func LocalWalsender(int, int) error {
	return errors.New("telling a walsender here needs Linux's /proc")
}
