package main

import "github.com/postbox-relay/postbox/cmd/postbox/internal/bench"

// peakRSS is the relay's peak resident set in MB, as the bench reads it.
func peakRSS(pid int) float64 { return bench.PeakRSS(pid) }
