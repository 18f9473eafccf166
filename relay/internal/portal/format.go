package portal

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"time"
)

var funcs = template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"tsp": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"tsms":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
	"ms":       formatMS,
	"msp":      func(v *float64) string { return formatMSPtr(v) },
	"code":     func(c *int) string { return formatCode(c) },
	"queryesc": url.QueryEscape,
	"statusCls": func(s string) string {
		switch s {
		case "delivered":
			return "pill ok"
		case "dead_letter", "replayed":
			return "pill bad"
		case "failed", "in_flight", "pending":
			return "pill warn"
		}
		return "pill"
	},
	"label": label,
	"pct": func(v float64) string {
		return strconv.FormatFloat(v*100, 'f', 1, 64) + " %"
	},
}

func formatMS(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.1f ms", v)
	}
}

func formatMSPtr(v *float64) string {
	if v == nil {
		return "–"
	}
	return formatMS(*v)
}

func formatCode(c *int) string {
	if c == nil {
		return "–"
	}
	return strconv.Itoa(*c)
}

// label is a status or state as a partner reads it.
func label(s string) string {
	switch s {
	case "dead_letter":
		return "dead letter"
	case "in_flight":
		return "in flight"
	case "failed":
		return "awaiting retry"
	case "replayed":
		return "dead letter, sent again"
	case "half_open":
		return "half open"
	}
	return s
}
