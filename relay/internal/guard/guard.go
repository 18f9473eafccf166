// Package guard is the SSRF guard: which addresses deliveries may connect
// to, and a dialer that checks each address at connect time. It imports
// nothing of postbox, so that the packages that refuse (execute), dial
// (deliver) and classify (policy) share it without importing each other.
package guard

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// BlockedError is a refused connection: the target's address is in a
// range deliveries may not reach. It names the address and its class.
type BlockedError struct {
	Addr  netip.Addr
	Class string
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("%s is %s", e.Addr, e.Class)
}

// classMetadata starts the class of the cloud metadata addresses.
const classMetadata = "the cloud metadata service"

// closedRanges stay closed whatever allow_private_targets says: link-local
// (where the cloud metadata and credential services of AWS, ECS, EKS,
// GCP, Azure and OpenStack answer), AWS's IPv6 service network and
// Alibaba's metadata address. An allowed_cidrs entry opens an address in
// one of them only when the entry lies inside that range, so a broad
// entry (0.0.0.0/0, 169.0.0.0/8) never opens a credential service by
// accident. Their IPv4-mapped forms are checked by the IPv4 address; their
// NAT64 and 6to4 forms are never opened.
var closedRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::/64"),
	netip.MustParsePrefix("100.100.100.200/32"),
}

// blockedRanges are the address classes the guard refuses, with the name
// it reports, the narrowest first. IPv4-mapped, NAT64 and 6to4 IPv6
// addresses are checked by the IPv4 address they carry.
var blockedRanges = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (this network)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.100.100.200/32"), classMetadata + " (Alibaba Cloud)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT (RFC 6598)"},
	{netip.MustParsePrefix("169.254.169.254/32"), classMetadata + " (link-local)"},
	{netip.MustParsePrefix("169.254.170.2/32"), classMetadata + " (ECS task credentials, link-local)"},
	{netip.MustParsePrefix("169.254.170.23/32"), classMetadata + " (EKS Pod Identity, link-local)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (RFC 2544)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (RFC 8215)"},
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
	{netip.MustParsePrefix("fd00:ec2::/64"), classMetadata + " (AWS service network, unique-local)"},
	{netip.MustParsePrefix("fc00::/7"), "unique-local"},
	{netip.MustParsePrefix("fe80::a9fe:a9fe/128"), classMetadata + " (OpenStack, link-local)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
}

// Guard decides which addresses deliveries may connect to.
type Guard struct {
	// AllowAll opens every class but closedRanges (allow_private_targets).
	AllowAll bool
	// Allowed opens these ranges (allowed_cidrs) despite their class; an
	// address of closedRanges only from an entry inside its range.
	Allowed []netip.Prefix
}

// Check returns a *BlockedError when addr may not be reached. AllowAll
// opens every class but closedRanges; an Allowed range opens what it
// contains, but in closedRanges only when it lies inside the closed range.
func (g Guard) Check(addr netip.Addr) error {
	addr = addr.WithZone("")
	closed, isClosed := closedRange(addr)
	for _, p := range g.Allowed {
		if !p.Contains(addr) && !(addr.Is4In6() && p.Contains(addr.Unmap())) {
			continue
		}
		if !isClosed || p.Bits() >= closed.Bits() && closed.Contains(p.Addr()) {
			return nil
		}
	}
	class := classify(addr)
	switch {
	case isClosed:
		hint := fmt.Sprintf("only an allowed_cidrs entry inside %s opens it; allow_private_targets and wider entries do not", closed)
		if _, form, ok := embedded4(addr); ok && form != formMapped {
			hint = "neither allow_private_targets nor an allowed_cidrs entry opens it in this form"
		}
		return &BlockedError{Addr: addr, Class: class + "; " + hint}
	case g.AllowAll || class == "":
		return nil
	}
	return &BlockedError{Addr: addr, Class: class}
}

// closedRange is the range of closedRanges that holds addr, or the IPv4
// address an IPv4-mapped, NAT64 or 6to4 addr carries.
func closedRange(addr netip.Addr) (netip.Prefix, bool) {
	if v4, _, ok := embedded4(addr); ok {
		addr = v4
	}
	for _, p := range closedRanges {
		if p.Contains(addr) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

var (
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4  = netip.MustParsePrefix("2002::/16")
	mapped4 = netip.MustParsePrefix("::ffff:0:0/96")
)

const formMapped = "IPv4-mapped"

// embedded4 is the IPv4 address an IPv4-mapped, NAT64 or 6to4 addr
// carries, and the name of that form.
func embedded4(addr netip.Addr) (netip.Addr, string, bool) {
	if !addr.Is6() {
		return netip.Addr{}, "", false
	}
	b := addr.As16()
	switch {
	case mapped4.Contains(addr):
		return addr.Unmap(), formMapped, true
	case nat64.Contains(addr):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), "NAT64", true
	case sixTo4.Contains(addr):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), "6to4", true
	}
	return netip.Addr{}, "", false
}

// classify names addr's blocked class, or "" when it is a public address.
func classify(addr netip.Addr) string {
	if v4, form, ok := embedded4(addr); ok {
		if c := classify(v4); c != "" {
			return c + " (" + form + ")"
		}
		if form == formMapped {
			return ""
		}
	}
	for _, r := range blockedRanges {
		if r.prefix.Contains(addr) {
			return r.class
		}
	}
	if addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return "broadcast"
	}
	return ""
}

// Dialer returns a dialer that checks every address it is about to
// connect to against the guard current at that moment, after DNS
// resolution, at connect time: a name that resolves (or re-resolves: DNS
// rebinding) to a blocked address is refused before any packet is sent.
//
// beneath, when not nil, is asked after the guard passed an address and
// before the connect: tests give it a tripwire that refuses (and reports)
// anything but loopback, so a guard that regressed still dials nothing.
func Dialer(guard func() Guard, beneath func(netip.AddrPort) error) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("guard: unexpected address %q: %w", address, err)
			}
			if err := guard().Check(ap.Addr()); err != nil {
				return err
			}
			if beneath != nil {
				return beneath(ap)
			}
			return nil
		},
	}
	return d.DialContext
}
