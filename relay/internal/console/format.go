package console

import (
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// funcs are the templates' helpers. Everything they return is text that
// html/template escapes, except the charts (built from numbers and
// escaped labels).
var funcs = template.FuncMap{
	"ms":        formatMS,
	"msp":       formatMSPtr,
	"num":       formatCount,
	"bytes":     telemetry.FormatBytes,
	"ts":        formatTime,
	"tsp":       formatTimePtr,
	"tsms":      formatTimeMS,
	"ago":       formatAgo,
	"agop":      formatAgoPtr,
	"age":       formatAgeSeconds,
	"since":     formatSince,
	"paused":    formatPaused,
	"code":      formatCode,
	"pathesc":   url.PathEscape,
	"queryesc":  url.QueryEscape,
	"short":     shortID,
	"statusCls": statusClass,
	"label":     label,
	"deref":     func(p *int) int { return *p },
}

func itoa(n int) string { return strconv.Itoa(n) }

func pathEscape(s string) string { return url.PathEscape(s) }

// formatMS prints milliseconds: 0.42 ms, 12.3 ms, 850 ms, 1.25 s.
func formatMS(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	case v == 0:
		return "0 ms"
	}
	return fmt.Sprintf("%.2f ms", v)
}

func formatMSPtr(v *float64) string {
	if v == nil {
		return "–"
	}
	return formatMS(*v)
}

// formatNumber prints a chart tick: 0, 2.5, 40, 1.2k, 3M.
func formatNumber(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	case v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// formatCount prints a count with thousands separators: 1,204,311.
func formatCount(n any) string {
	var v int64
	switch x := n.(type) {
	case int:
		v = int64(x)
	case int64:
		v = x
	case float64:
		v = int64(x)
	default:
		return fmt.Sprint(n)
	}
	s := strconv.FormatInt(v, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// formatTime prints a time in UTC, as the commands do.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

// formatTimeMS prints a time in UTC to the millisecond, for timelines.
func formatTimeMS(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

func formatTimePtr(t *time.Time) string {
	if t == nil {
		return "–"
	}
	return formatTime(*t)
}

// formatAgo prints how long before now t was: "12 s ago", "3 min ago".
func formatAgo(now, t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	d := now.Sub(t)
	switch {
	case d < -time.Second:
		return "in " + formatSpan(-d)
	case d < time.Second:
		return "just now"
	}
	return formatSpan(d.Truncate(time.Second)) + " ago"
}

// formatSince prints how long t is before now: "4 s", "3 h 5 min".
func formatSince(now, t time.Time) string {
	return formatSpan(max(0, now.Sub(t)).Truncate(time.Second))
}

func formatAgoPtr(now time.Time, t *time.Time) string {
	if t == nil {
		return "–"
	}
	return formatAgo(now, *t)
}

func formatAgeSeconds(s *float64) string {
	if s == nil {
		return "–"
	}
	return formatSpan(time.Duration(*s * float64(time.Second)))
}

// formatSpan prints a duration coarsely: 0.42 ms, 850 ms, 4.2 s, 12 s,
// 3 min, 2 h 5 min, 3 d.
func formatSpan(d time.Duration) string {
	switch {
	case d < time.Second:
		return formatMS(float64(d) / float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		h := int(d.Hours())
		if m := int(d.Minutes()) % 60; m != 0 && h < 10 {
			return fmt.Sprintf("%d h %d min", h, m)
		}
		return fmt.Sprintf("%d h", h)
	}
	return fmt.Sprintf("%d d", int(d.Hours()/24))
}

// formatPaused prints how long a pause lasts: "until 2025-01-02 15:04:05",
// or "until resumed" for one without an end (postboxtype.PauseIndefinite).
func formatPaused(t *time.Time) string {
	if t == nil {
		return ""
	}
	if !t.Before(postboxtype.PauseIndefinite) {
		return "until resumed"
	}
	return "until " + formatTime(*t)
}

func formatCode(c *int) string {
	if c == nil {
		return "–"
	}
	return strconv.Itoa(*c)
}

// shortID is the first block of an event id, for narrow columns (the
// full id is in the link and its title).
func shortID(id string) string {
	if i := strings.IndexByte(id, '-'); i > 0 {
		return id[:i]
	}
	return id
}

// statusClass is the pill class of a delivery, breaker or alert state.
func statusClass(s any) string {
	switch fmt.Sprint(s) {
	case "delivered", "closed", "streaming", "ok":
		return "pill ok"
	case "dead_letter", "open", "firing":
		return "pill bad"
	case "failed", "half_open", "paused", "in_flight":
		return "pill warn"
	case "replayed":
		return "pill info"
	}
	return "pill"
}

// label turns a stored word into text: dead_letter → dead letter.
func label(s any) string { return strings.ReplaceAll(fmt.Sprint(s), "_", " ") }
