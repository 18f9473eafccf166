package relay

import (
	"net/netip"
	"time"
)

// The tests' parts of Options: an embedding application has no use for
// them.

// WithRand returns o with rand for the backoff's jitter.
func (o Options) WithRand(rand func() float64) Options {
	o.rand = rand
	return o
}

// WithBeneathGuard returns o with f asked about every address the guard
// lets through, just before the connect (see guard.Dialer).
func (o Options) WithBeneathGuard(f func(netip.AddrPort) error) Options {
	o.beneathGuard = f
	return o
}

// HasBeneathGuard reports whether o has a BeneathGuard.
func (o Options) HasBeneathGuard() bool { return o.beneathGuard != nil }

// WithIngestLinger returns o with the ingest's linger: how long the ingest
// of a live transaction waits for the ones that follow.
func (o Options) WithIngestLinger(d time.Duration) Options {
	o.ingestLinger = d
	return o
}

// WithEndpointsGateOnly returns o with an instance whose applied
// endpoints change only before an attempt that needs it: no NOTIFY, no
// poll (the gate alone).
func (o Options) WithEndpointsGateOnly() Options {
	o.endpointsGateOnly = true
	return o
}
