package ingest

import (
	"sync/atomic"
	"time"
)

// leaseClock is this process's own view of its streaming lead: until
// when, by the monotonic clock, no other instance can have taken it over.
// The database sets a lease to expire at its now() plus the lease, and its
// now() is no earlier than when the request was sent: a lease acquired or
// renewed by a request sent at t holds until t + lease at least, whatever
// this process did meanwhile (a process paused by SIGSTOP, or starved of
// CPU, finds on waking that its time ran on).
type leaseClock struct {
	epoch time.Time
	until atomic.Int64 // since epoch; 0 when no lead is held
}

func newLeaseClock() *leaseClock { return &leaseClock{epoch: time.Now()} }

// renewed records a lease acquired or renewed by a request sent at sent.
func (c *leaseClock) renewed(sent time.Time, lease time.Duration) {
	c.until.Store(int64(sent.Sub(c.epoch) + lease))
}

// clear records that no lead is held.
func (c *leaseClock) clear() { c.until.Store(0) }

// holds reports whether the lead is certain for margin more.
func (c *leaseClock) holds(margin time.Duration) bool {
	return time.Since(c.epoch)+margin < time.Duration(c.until.Load())
}
