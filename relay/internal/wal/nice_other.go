//go:build !linux

package wal

import "errors"

var errLinuxOnly = errors.New("telling a walsender here and weighing it need Linux's /proc")

// LocalWalsender needs Linux's /proc.
func LocalWalsender(int, int) error { return errLinuxOnly }

func setNice(int, int) error { return errLinuxOnly }

// ProcessCPU needs Linux's /proc.
func ProcessCPU(int) (CPU, error) { return CPU{}, errLinuxOnly }
