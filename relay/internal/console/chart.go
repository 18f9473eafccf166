package console

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"
)

// Series is one line of a line chart, or one layer of a stacked bar chart.
type Series struct {
	Name string
	// Class colours it (a class of the shared style.css, relay/internal/webstatic: c-ok, c-bad, c-p50, …).
	Class string
	// Values are one per point of the chart's X; NaN is a gap.
	Values []float64
}

// Chart is a time chart drawn on the server as SVG: evenly spaced points
// (one a minute, one per five minutes), a Y axis from zero with round
// ticks, time labels below, a legend above, and a native tooltip per point.
type Chart struct {
	// Label names the chart for screen readers.
	Label string
	// X are the points' times (the start of each minute or bin).
	X      []time.Time
	Series []Series
	// Format prints a Y value (ticks and tooltips); plain numbers when nil.
	Format func(float64) string
	// Empty is shown instead of the plot when no series has a value.
	Empty string
}

// Chart geometry, in the SVG's own units (it scales to its box).
const (
	chartW      = 960
	chartH      = 240
	chartLeft   = 64 // room for the Y labels
	chartRight  = 12
	chartTop    = 30 // room for the legend
	chartBottom = 26 // room for the time labels
)

// Bars draws the series stacked, one bar per point.
func (c Chart) Bars() template.HTML {
	n := len(c.X)
	tops := make([]float64, n)
	for _, s := range c.Series {
		for i := 0; i < n && i < len(s.Values); i++ {
			if v := s.Values[i]; !math.IsNaN(v) && v > 0 {
				tops[i] += v
			}
		}
	}
	return c.draw(maxOf(tops), func(b *strings.Builder, x func(float64) float64, y func(float64) float64) {
		slot := x(1) - x(0)
		w := math.Max(1, slot*0.72)
		for i := range n {
			base := 0.0
			fmt.Fprintf(b, `<g class="pt"><title>%s</title>`, esc(c.tooltip(i)))
			fmt.Fprintf(b, `<rect class="hover" x="%.1f" y="%d" width="%.1f" height="%d"/>`, x(float64(i))-slot/2, chartTop, slot, chartH-chartTop-chartBottom)
			for _, s := range c.Series {
				if i >= len(s.Values) || math.IsNaN(s.Values[i]) || s.Values[i] <= 0 {
					continue
				}
				v := s.Values[i]
				y0, y1 := y(base), y(base+v)
				fmt.Fprintf(b, `<rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`,
					esc(s.Class), x(float64(i))-w/2, y1, w, math.Max(y0-y1, 0.5))
				base += v
			}
			b.WriteString(`</g>`)
		}
	})
}

// Lines draws each series as a line; NaN values break it.
func (c Chart) Lines() template.HTML {
	top := 0.0
	for _, s := range c.Series {
		top = math.Max(top, maxOf(s.Values))
	}
	return c.draw(top, func(b *strings.Builder, x func(float64) float64, y func(float64) float64) {
		for _, s := range c.Series {
			var pts [][2]float64
			flush := func() {
				switch len(pts) {
				case 0:
				case 1: // a lone point between gaps: a dot
					fmt.Fprintf(b, `<circle class="%s dot" cx="%.1f" cy="%.1f" r="2.5"/>`, esc(s.Class), pts[0][0], pts[0][1])
				default:
					fmt.Fprintf(b, `<polyline class="%s line" points="`, esc(s.Class))
					for j, p := range pts {
						if j > 0 {
							b.WriteByte(' ')
						}
						fmt.Fprintf(b, "%.1f,%.1f", p[0], p[1])
					}
					b.WriteString(`"/>`)
				}
				pts = pts[:0]
			}
			for i, v := range s.Values {
				if i >= len(c.X) || math.IsNaN(v) {
					flush()
					continue
				}
				pts = append(pts, [2]float64{x(float64(i)), y(v)})
			}
			flush()
		}
		// A column per point carries its tooltip.
		slot := x(1) - x(0)
		for i := range c.X {
			fmt.Fprintf(b, `<g class="pt"><title>%s</title><rect class="hover" x="%.1f" y="%d" width="%.1f" height="%d"/></g>`,
				esc(c.tooltip(i)), x(float64(i))-slot/2, chartTop, slot, chartH-chartTop-chartBottom)
		}
	})
}

// draw lays out the axes, grid, legend and time labels around plot.
func (c Chart) draw(top float64, plot func(b *strings.Builder, x, y func(float64) float64)) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		chartW, chartH, esc(c.Label))
	c.legend(&b)
	if len(c.X) == 0 || top <= 0 {
		empty := c.Empty
		if empty == "" {
			empty = "no data in this window"
		}
		fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, chartH-chartBottom, chartW-chartRight, chartH-chartBottom)
		fmt.Fprintf(&b, `<text class="empty" x="%d" y="%d" text-anchor="middle">%s</text></svg>`,
			(chartLeft+chartW-chartRight)/2, (chartTop+chartH-chartBottom)/2, esc(empty))
		return template.HTML(b.String())
	}
	step := niceStep(top / 4)
	ymax := math.Ceil(top/step) * step
	plotW := float64(chartW - chartLeft - chartRight)
	plotH := float64(chartH - chartTop - chartBottom)
	n := float64(len(c.X))
	x := func(i float64) float64 { return float64(chartLeft) + (i+0.5)*plotW/n }
	y := func(v float64) float64 { return float64(chartH-chartBottom) - v/ymax*plotH }
	for v := 0.0; v <= ymax+step/2; v += step {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, chartLeft, y(v), chartW-chartRight, y(v))
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">%s</text>`, chartLeft-8, y(v)+4, esc(c.format(v)))
	}
	c.timeLabels(&b, x)
	plot(&b, x, y)
	fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, chartH-chartBottom, chartW-chartRight, chartH-chartBottom)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func (c Chart) legend(b *strings.Builder) {
	x := chartLeft
	for _, s := range c.Series {
		fmt.Fprintf(b, `<rect class="%s" x="%d" y="8" width="12" height="12" rx="2"/>`, esc(s.Class), x)
		fmt.Fprintf(b, `<text class="legend" x="%d" y="18">%s</text>`, x+18, esc(s.Name))
		x += 30 + 8*len(s.Name)
	}
}

// timeStepChoices are the spacings of time labels, the first that leaves
// at most eight labels is used.
var timeStepChoices = []time.Duration{time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute,
	30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}

func (c Chart) timeLabels(b *strings.Builder, x func(float64) float64) {
	first, last := c.X[0], c.X[len(c.X)-1]
	span := last.Sub(first)
	step := timeStepChoices[len(timeStepChoices)-1]
	for _, s := range timeStepChoices {
		if span/s <= 8 {
			step = s
			break
		}
	}
	for i, t := range c.X {
		if t.Truncate(step) != t {
			continue
		}
		fmt.Fprintf(b, `<line class="tickmark" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, x(float64(i)), chartH-chartBottom, x(float64(i)), chartH-chartBottom+4)
		fmt.Fprintf(b, `<text class="tick" x="%.1f" y="%d" text-anchor="middle">%s</text>`, x(float64(i)), chartH-8, t.UTC().Format("15:04"))
	}
}

func (c Chart) tooltip(i int) string {
	parts := []string{c.X[i].UTC().Format("15:04") + " UTC"}
	for _, s := range c.Series {
		v := "–"
		if i < len(s.Values) && !math.IsNaN(s.Values[i]) {
			v = c.format(s.Values[i])
		}
		parts = append(parts, s.Name+" "+v)
	}
	return strings.Join(parts, " · ")
}

func (c Chart) format(v float64) string {
	if c.Format != nil {
		return c.Format(v)
	}
	return formatNumber(v)
}

// niceStep rounds a raw tick spacing up to 1, 2, 2.5 or 5 times a power
// of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

func maxOf(vs []float64) float64 {
	m := 0.0
	for _, v := range vs {
		if !math.IsNaN(v) && v > m {
			m = v
		}
	}
	return m
}

// esc escapes text for SVG markup.
func esc(s string) string { return template.HTMLEscapeString(s) }
