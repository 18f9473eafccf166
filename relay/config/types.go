package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as "15s", "5m", "168h" or "0s".
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseDuration(n.Value)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// ParseDuration accepts Go durations ("90s", "1h30m") and a bare "0".
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want e.g. 30s, 5m, 1h)", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("invalid duration %q: negative", s)
	}
	return v, nil
}

// Rate is a token-bucket rate: N events per Per, written "100/m", "10/s",
// "1000/h". The zero Rate means unlimited.
type Rate struct {
	N   int
	Per time.Duration
}

// IsZero reports whether the rate is unlimited.
func (r Rate) IsZero() bool { return r.N == 0 }

// PerSecond is the rate in events per second.
func (r Rate) PerSecond() float64 {
	if r.IsZero() {
		return 0
	}
	return float64(r.N) / r.Per.Seconds()
}

func (r Rate) String() string {
	if r.IsZero() {
		return "unlimited"
	}
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[r.Per]
	if unit == "" {
		unit = r.Per.String()
	}
	return strconv.Itoa(r.N) + "/" + unit
}

// ParseRate parses "100/m", "10/s", "1000/h" (also "/sec", "/min", "/hour",
// or a duration such as "5/10s").
func ParseRate(s string) (Rate, error) {
	n, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("invalid rate %q (want e.g. 100/m, 10/s, 1000/h)", s)
	}
	count, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || count <= 0 {
		return Rate{}, fmt.Errorf("invalid rate %q: the count must be a positive integer", s)
	}
	var d time.Duration
	switch strings.TrimSpace(per) {
	case "s", "sec", "second":
		d = time.Second
	case "m", "min", "minute":
		d = time.Minute
	case "h", "hour":
		d = time.Hour
	default:
		d, err = time.ParseDuration(strings.TrimSpace(per))
		if err != nil || d <= 0 {
			return Rate{}, fmt.Errorf("invalid rate %q (want e.g. 100/m, 10/s, 1000/h)", s)
		}
	}
	return Rate{N: count, Per: d}, nil
}

// UnmarshalYAML parses a rate string.
func (r *Rate) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseRate(n.Value)
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// MarshalYAML writes the rate as "N/unit".
func (r Rate) MarshalYAML() (any, error) { return r.String(), nil }

// ByteSize is a size in bytes, written as a number or with a unit:
// "1MiB", "512KiB", "1MB".
type ByteSize int64

// UnmarshalYAML parses a size.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return err
	}
	*b = ByteSize(v)
	return nil
}

// ParseByteSize parses "1048576", "1MiB", "64KiB", "1MB", "2GB".
func ParseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("invalid size %q (want e.g. 1MiB, 512KiB, 1048576)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}

// RedactPath names the segments of an endpoint's URL path that are
// recorded as "***": for a partner whose URL path carries its token
// (Slack's /services/T/B/SECRET, Telegram's /botTOKEN/sendMessage). It is
// written `true` (every segment) or as a list of 1-based positions, at
// most RedactPathMax ("[4]" for Slack's). A bit set, so that it can key a
// cache and costs nothing to copy.
type RedactPath uint64

// RedactPathMax is the highest segment position redact_path can name.
const RedactPathMax = 63

// redactAll is the bit of `redact_path: true`; bit i is position i.
const redactAll RedactPath = 1

// UnmarshalYAML parses true, false or a list of positions.
func (r *RedactPath) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b, err := strconv.ParseBool(n.Value)
		if err != nil {
			return fmt.Errorf("want true (every segment) or a list of segment positions such as [4], got %q", n.Value)
		}
		*r = 0
		if b {
			*r = redactAll
		}
		return nil
	}
	var positions []int
	if err := n.Decode(&positions); err != nil {
		return errors.New("want true (every segment) or a list of segment positions such as [4]")
	}
	var out RedactPath
	for _, p := range positions {
		if p < 1 || p > RedactPathMax {
			return fmt.Errorf("segment position %d is not 1 to %d", p, RedactPathMax)
		}
		out |= 1 << p
	}
	*r = out
	return nil
}

// MarshalYAML writes true, false or the positions.
func (r RedactPath) MarshalYAML() (any, error) {
	if r <= redactAll {
		return r == redactAll, nil
	}
	var out []int
	for p := 1; p <= RedactPathMax; p++ {
		if r&(1<<p) != 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

// Segment reports whether the 1-based segment position i is redacted.
func (r RedactPath) Segment(i int) bool {
	return r == redactAll || i >= 1 && i <= RedactPathMax && r&(1<<i) != 0
}

// Redacted is the escaped URL path p ("/a/b%2Fc/d") with the segments r
// names replaced by "***"; empty segments stay empty.
func (r RedactPath) Redacted(p string) string {
	if r == 0 || p == "" {
		return p
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range segs {
		if s != "" && r.Segment(i+1) {
			segs[i] = "***"
		}
	}
	lead := ""
	if strings.HasPrefix(p, "/") {
		lead = "/"
	}
	return lead + strings.Join(segs, "/")
}
