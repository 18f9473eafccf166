package guard_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/guard"
)

// tripwired is a dialer under the guard g returns, over a tripwire that
// counts and refuses every address the guard lets through, in the dialer's
// check before its connect: whatever a test dials, nothing leaves the
// machine, and the count says whether the guard or the tripwire refused.
func tripwired(g func() guard.Guard) (func(context.Context, string, string) (net.Conn, error), *atomic.Int32) {
	reached := new(atomic.Int32)
	return guard.Dialer(g, func(ap netip.AddrPort) error {
		reached.Add(1)
		return errors.New("tripwire: the guard let " + ap.String() + " through")
	}), reached
}

func TestGuardRefusesEveryPrivateClass(t *testing.T) {
	t.Parallel()
	var g guard.Guard
	dial, reached := tripwired(func() guard.Guard { return g })
	for addr, class := range map[string]string{
		"0.0.0.0":                "unspecified",
		"127.0.0.1":              "loopback",
		"127.255.0.9":            "loopback",
		"10.1.2.3":               "private (RFC 1918)",
		"172.16.0.1":             "private (RFC 1918)",
		"172.31.255.254":         "private (RFC 1918)",
		"192.168.1.1":            "private (RFC 1918)",
		"100.64.0.1":             "carrier-grade NAT",
		"100.127.255.254":        "carrier-grade NAT",
		"169.254.169.254":        "the cloud metadata service",
		"169.254.1.1":            "link-local",
		"169.254.170.2":          "the cloud metadata service (ECS task credentials",
		"169.254.170.23":         "the cloud metadata service (EKS Pod Identity",
		"100.100.100.200":        "the cloud metadata service (Alibaba Cloud)",
		"fd00:ec2::23":           "the cloud metadata service (AWS service network",
		"fe80::a9fe:a9fe":        "the cloud metadata service (OpenStack",
		"224.0.0.1":              "multicast",
		"239.255.255.250":        "multicast",
		"240.0.0.1":              "reserved",
		"255.255.255.255":        "reserved",
		"::":                     "unspecified",
		"::1":                    "loopback",
		"fe80::1":                "link-local",
		"fc00::1":                "unique-local",
		"fd12:3456::1":           "unique-local",
		"fd00:ec2::254":          "the cloud metadata service",
		"ff02::1":                "multicast",
		"::ffff:127.0.0.1":       "loopback (IPv4-mapped)",
		"::ffff:10.0.0.1":        "private (RFC 1918) (IPv4-mapped)",
		"::ffff:169.254.169.254": "the cloud metadata service (link-local) (IPv4-mapped)",
		"64:ff9b::a00:1":         "private (RFC 1918) (NAT64)",
		"2002:7f00:1::1":         "loopback (6to4)",
		"::a00:1":                "IPv4-compatible",
		"::808:808":              "IPv4-compatible",
		"64:ff9b:1::a00:1":       "local-use NAT64",
		"2001:0:4136:e378::1":    "Teredo",
		"fec0::1":                "site-local",
	} {
		err := g.Check(netip.MustParseAddr(addr))
		var be *guard.BlockedError
		require.True(t, errors.As(err, &be), "%s should be blocked", addr)
		require.Contains(t, be.Error(), class, addr)
		_, err = dial(context.Background(), "tcp", net.JoinHostPort(addr, "80"))
		require.True(t, errors.As(err, &be), "%s is refused by the dialer's check: %v", addr, err)
	}
	require.Zero(t, reached.Load(), "the guard refused every class itself: nothing reached the tripwire")
	for _, public := range []string{"93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "172.32.0.1", "100.128.0.1"} {
		require.NoError(t, g.Check(netip.MustParseAddr(public)), public)
	}
}

func TestGuardOpensDeliberately(t *testing.T) {
	t.Parallel()
	g := guard.Guard{Allowed: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}}
	require.NoError(t, g.Check(netip.MustParseAddr("10.20.3.4")))
	require.NoError(t, g.Check(netip.MustParseAddr("::ffff:10.20.3.4")))
	require.Error(t, g.Check(netip.MustParseAddr("10.21.0.1")))
	require.NoError(t, guard.Guard{AllowAll: true}.Check(netip.MustParseAddr("127.0.0.1")))
	require.NoError(t, guard.Guard{AllowAll: true}.Check(netip.MustParseAddr("10.0.0.8")))
}

// allow_private_targets opens private ranges, never the cloud metadata
// service in any of its forms: only an allowed_cidrs entry does.
func TestAllowPrivateTargetsKeepsTheMetadataServiceClosed(t *testing.T) {
	t.Parallel()
	all := guard.Guard{AllowAll: true}
	for _, addr := range []string{"169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254", "64:ff9b::a9fe:a9fe"} {
		err := all.Check(netip.MustParseAddr(addr))
		var be *guard.BlockedError
		require.True(t, errors.As(err, &be), "%s stays blocked", addr)
		require.Contains(t, be.Error(), "allowed_cidrs", addr)
	}
	// The dialer refuses them in its check before the connect: the
	// tripwire beneath it is never reached, so nothing is dialled.
	dial, reached := tripwired(func() guard.Guard { return all })
	for _, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "[::ffff:169.254.169.254]:80"} {
		_, err := dial(context.Background(), "tcp", addr)
		var be *guard.BlockedError
		require.True(t, errors.As(err, &be), "%s: %v", addr, err)
	}
	require.Zero(t, reached.Load(), "allow_private_targets: the guard refused them itself")
	require.Error(t, all.Check(netip.MustParseAddr("169.254.1.1")), "nor any other link-local address")
	// An entry naming it opens it: the dialer's check passes it on, to the
	// tripwire, which refuses it before the connect.
	explicit := guard.Guard{AllowAll: true, Allowed: []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}}
	require.NoError(t, explicit.Check(netip.MustParseAddr("169.254.169.254")))
	open, passed := tripwired(func() guard.Guard { return explicit })
	_, err := open(context.Background(), "tcp", "169.254.169.254:80")
	var be *guard.BlockedError
	require.False(t, errors.As(err, &be), "opened: %v", err)
	require.ErrorContains(t, err, "tripwire")
	require.Equal(t, int32(1), passed.Load())
}

// The link-local, metadata and AWS service ranges stay closed whatever
// allow_private_targets and a broad allowed_cidrs entry say, in every form
// of the address; an entry inside the closed range opens what it names and
// nothing else of it. All at the dialer's check: a refused address never
// reaches the tripwire beneath it (so nothing was dialled), and an opened
// one reaches the tripwire, which refuses it before its connect.
func TestClosedRangesOpenOnlyFromInside(t *testing.T) {
	t.Parallel()
	var current atomic.Pointer[guard.Guard]
	dial, reached := tripwired(func() guard.Guard { return *current.Load() })
	refused := func(g guard.Guard, addrs ...string) {
		t.Helper()
		current.Store(&g)
		before := reached.Load()
		for _, a := range addrs {
			_, err := dial(context.Background(), "tcp", net.JoinHostPort(a, "80"))
			var be *guard.BlockedError
			require.True(t, errors.As(err, &be), "%+v should refuse %s: %v", g, a, err)
		}
		require.Equal(t, before, reached.Load(), "%+v: refused before the tripwire, nothing dialled", g)
	}
	opened := func(g guard.Guard, addrs ...string) {
		t.Helper()
		current.Store(&g)
		for _, a := range addrs {
			before := reached.Load()
			_, err := dial(context.Background(), "tcp", net.JoinHostPort(a, "80"))
			var be *guard.BlockedError
			require.False(t, errors.As(err, &be), "%+v should open %s: %v", g, a, err)
			require.Equal(t, before+1, reached.Load(), "%s passed the guard, to the tripwire", a)
		}
	}
	cidrs := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, c := range s {
			out = append(out, netip.MustParsePrefix(c))
		}
		return out
	}
	closed := []string{
		"169.254.169.254", "169.254.170.2", "169.254.170.23", "169.254.1.1", "169.254.255.255",
		"fe80::1", "fe80::1%lo", "fe80::a9fe:a9fe", "febf::1",
		"fd00:ec2::254", "fd00:ec2::23", "fd00:ec2::1", "fd00:ec2::ffff:ffff:ffff:ffff",
		"100.100.100.200",
		"::ffff:169.254.170.2", "::ffff:100.100.100.200",
		"64:ff9b::a9fe:aa02", "2002:a9fe:aa02::1", "64:ff9b::6464:64c8",
	}
	refused(guard.Guard{}, closed...)
	refused(guard.Guard{AllowAll: true}, closed...)
	refused(guard.Guard{Allowed: cidrs("0.0.0.0/0", "::/0")}, closed...)
	refused(guard.Guard{Allowed: cidrs("169.0.0.0/8", "100.64.0.0/10", "100.100.0.0/16", "fe80::/9", "fd00::/8", "fc00::/7")}, closed...)
	refused(guard.Guard{AllowAll: true, Allowed: cidrs("0.0.0.0/0", "::/0", "169.254.0.0/15", "64:ff9b::/96", "2002::/16", "::ffff:0:0/96")}, closed...)

	// An entry inside a closed range opens what it names, and only that.
	one := guard.Guard{AllowAll: true, Allowed: cidrs("169.254.170.2/32")}
	opened(one, "169.254.170.2", "::ffff:169.254.170.2")
	refused(one, "169.254.170.23", "169.254.169.254", "64:ff9b::a9fe:aa02", "2002:a9fe:aa02::1")
	opened(guard.Guard{Allowed: cidrs("fd00:ec2::23/128", "100.100.100.200/32")}, "fd00:ec2::23", "100.100.100.200")
	refused(guard.Guard{Allowed: cidrs("fd00:ec2::23/128", "100.100.100.200/32")}, "fd00:ec2::254")
	opened(guard.Guard{Allowed: cidrs("169.254.0.0/16", "fe80::/10")}, "169.254.1.1", "169.254.169.254", "fe80::1%lo")

	// Outside the closed ranges, both settings open as before.
	for _, g := range []guard.Guard{{AllowAll: true}, {Allowed: cidrs("0.0.0.0/0", "::/0")}} {
		for _, a := range []string{"10.0.0.8", "100.64.0.1", "100.100.100.201", "fd12::1", "::ffff:192.168.1.1"} {
			require.NoError(t, g.Check(netip.MustParseAddr(a)), "%+v %s", g, a)
		}
	}
}

// TestGuardedDialerRefusesBeforeConnecting: the metadata service and a
// private address are refused by the dialer's check, which runs before the
// socket connects; the tripwire beneath it is never reached (it would
// refuse them too), so no packet leaves for them whatever happens.
func TestGuardedDialerRefusesBeforeConnecting(t *testing.T) {
	t.Parallel()
	dial, reached := tripwired(func() guard.Guard { return guard.Guard{} })
	for _, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "10.0.0.8:443", "[::ffff:169.254.169.254]:80"} {
		_, err := dial(context.Background(), "tcp", addr)
		var be *guard.BlockedError
		require.True(t, errors.As(err, &be), "%s: %v", addr, err)
	}
	require.Zero(t, reached.Load(), "the guard refused them itself")
}
