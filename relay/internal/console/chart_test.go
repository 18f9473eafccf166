package console

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNiceStep(t *testing.T) {
	t.Parallel()
	for raw, want := range map[float64]float64{0.3: 0.5, 1: 1, 1.2: 2, 2.2: 2.5, 3: 5, 7: 10, 12: 20, 240: 250, 0: 1} {
		require.InDelta(t, want, niceStep(raw), 1e-9, "raw %g", raw)
	}
}

// wellFormed parses the chart as XML: every element closed, every
// attribute quoted, text escaped.
func wellFormed(t *testing.T, svg string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err != nil {
			require.Equal(t, "EOF", err.Error(), "chart is not well-formed XML:\n%s", svg)
			return
		}
	}
}

func minutes(n int) []time.Time {
	start := time.Date(2025, 1, 2, 14, 0, 0, 0, time.UTC)
	out := make([]time.Time, n)
	for i := range out {
		out[i] = start.Add(time.Duration(i) * time.Minute)
	}
	return out
}

func TestBarsStackEachMinute(t *testing.T) {
	t.Parallel()
	ok := make([]float64, 60)
	bad := make([]float64, 60)
	ok[10], bad[10], ok[59] = 120, 3, 7
	svg := string(Chart{Label: "per <minute>", X: minutes(60), Series: []Series{
		{Name: "delivered", Class: "c-ok", Values: ok}, {Name: "failed", Class: "c-bad", Values: bad}}}.Bars())
	wellFormed(t, svg)
	require.Contains(t, svg, `aria-label="per &lt;minute&gt;"`)
	require.Equal(t, 60, strings.Count(svg, `<g class="pt">`), "a tooltip column per minute")
	require.Equal(t, 3+2, strings.Count(svg, `class="c-ok"`)+strings.Count(svg, `class="c-bad"`), "three bars and two legend swatches")
	require.Contains(t, svg, "<title>14:10 UTC · delivered 120 · failed 3</title>")
	require.Contains(t, svg, ">14:00</text>", "time labels on round times")
	require.Contains(t, svg, ">14:50</text>")
	require.Contains(t, svg, ">150</text>", "the Y axis tops out at a round tick above 123")
}

func TestLinesBreakAtGaps(t *testing.T) {
	t.Parallel()
	v := []float64{1, 2, math.NaN(), 4, 5, 6, math.NaN(), 8}
	svg := string(Chart{X: minutes(len(v)), Series: []Series{{Name: "p50", Class: "c-p50", Values: v}}, Format: formatMS}.Lines())
	wellFormed(t, svg)
	require.Equal(t, 2, strings.Count(svg, "<polyline"), "two runs of points")
	require.Equal(t, 1, strings.Count(svg, "<circle"), "a lone point is a dot")
	require.Contains(t, svg, "<title>14:02 UTC · p50 –</title>")
	require.Contains(t, svg, "<title>14:07 UTC · p50 8.00 ms</title>")
}

func TestEmptyChartSaysSo(t *testing.T) {
	t.Parallel()
	svg := string(Chart{X: minutes(60), Series: []Series{{Name: "a&b", Class: "c-ok", Values: make([]float64, 60)}}, Empty: "nothing <yet>"}.Bars())
	wellFormed(t, svg)
	require.Contains(t, svg, "nothing &lt;yet&gt;")
	require.Contains(t, svg, ">a&amp;b</text>")
	require.NotContains(t, svg, "<g class=\"pt\">")
}
