package admin

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"
)

// Line is one series of a chart: a name, a colour and a value per step.
type Line struct {
	Name   string
	Color  string
	Values []float64
}

// chart geometry, in SVG user units (the SVG scales to its box).
const (
	chartW, chartH = 600.0, 170.0
	chartLeft      = 40.0 // room for the y labels
	chartBottom    = 18.0 // room for the x labels
	chartTop       = 26.0 // room for the title and the legend
)

// Chart draws series over the last len(Values) minutes as an inline SVG:
// drawn on the server, so the console needs no chart library and the
// picture is the same in any browser. It is pure: the same input gives the
// same bytes.
// With legend, the lines' names are drawn beside the title (for a few
// short names; a page lists many lines below the chart instead).
func Chart(title string, lines []Line, legend bool) template.HTML {
	n := 0
	top := 0.0
	for _, l := range lines {
		n = max(n, len(l.Values))
		for _, v := range l.Values {
			top = max(top, v)
		}
	}
	top = niceCeil(top)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`, chartW, chartH, template.HTMLEscapeString(title))
	plotW, plotH := chartW-chartLeft-14, chartH-chartBottom-chartTop
	y := func(v float64) float64 { return chartTop + plotH - v/top*plotH }
	fmt.Fprintf(&b, `<text x="4" y="14" class="title">%s</text>`, template.HTMLEscapeString(title))
	// The legend, right-aligned on the title's line, when lines must be
	// told apart.
	if legend {
		lx := chartW - 4
		for i := len(lines) - 1; i >= 0; i-- {
			l := lines[i]
			fmt.Fprintf(&b, `<text x="%.1f" y="14" class="legend">%s</text>`, lx, template.HTMLEscapeString(l.Name))
			lx -= 6.2*float64(len(l.Name)) + 4
			fmt.Fprintf(&b, `<rect x="%.1f" y="6" width="9" height="9" rx="2" fill="%s"/>`, lx-9, template.HTMLEscapeString(l.Color))
			lx -= 22
		}
	}
	x := func(i int) float64 {
		if n <= 1 {
			return chartLeft
		}
		return chartLeft + float64(i)/float64(n-1)*plotW
	}
	// Grid: zero, half and top.
	for _, f := range []float64{0, 0.5, 1} {
		gy := y(top * f)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`, chartLeft, gy, chartLeft+plotW, gy)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="ylab">%s</text>`, chartLeft-4, gy+4, shortNumber(top*f))
	}
	if n > 1 {
		for _, lab := range []struct {
			i    int
			text string
		}{{0, fmt.Sprintf("-%dm", n-1)}, {n / 2, fmt.Sprintf("-%dm", n-1-n/2)}, {n - 1, "now"}} {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="xlab">%s</text>`, min(x(lab.i), chartW-14), chartH-4, lab.text)
		}
	}
	for _, l := range lines {
		if len(l.Values) == 0 {
			continue
		}
		var pts strings.Builder
		for i, v := range l.Values {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(i), y(v))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`,
			template.HTMLEscapeString(l.Color), strings.TrimSpace(pts.String()), template.HTMLEscapeString(l.Name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// niceCeil rounds a chart's top up to 1, 2 or 5 times a power of ten (at
// least 1, so an idle chart still has a scale).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// shortNumber writes a count as a chart label: 950, 1.2k, 3.4M.
func shortNumber(v float64) string {
	switch {
	case v >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case v >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", v/1e3)) + "k"
	default:
		return trimZero(fmt.Sprintf("%.1f", v))
	}
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

// Bytes writes a size for people: 1.5 GB, 340 MB, 12 kB (SI units, as
// disk tools print them).
func Bytes(n int64) string {
	f := float64(n)
	for _, u := range []string{"B", "kB", "MB", "GB", "TB"} {
		if f < 1000 || u == "TB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return trimZero(fmt.Sprintf("%.1f", f)) + " " + u
		}
		f /= 1000
	}
	return ""
}

// Since writes a duration for people, to the second: 3m20s, 2h5m, 4d1h.
func Since(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}
