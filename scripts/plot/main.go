// Command plot draws the figures of the cluster experiments in
// docs/benchmarks.md as SVG (scripts/bench-placement.sh,
// scripts/bench-failover.sh): a small, dependency-free drawer, so a figure
// is redrawn from its data with the Go toolchain alone (no gnuplot on the
// CI machine, and the file diffs as text).
//
// It reads a table from standard input: tab-separated, a header line, the
// first column the x value or group name, every other column a series.
//
//	go run ./scripts/plot -bars -title T -y "messages/s" <bars.tsv >fig.svg
//	go run ./scripts/plot -title T -x s -y "messages/s" -mark "30:kill" <series.tsv >fig.svg
//
// Without -bars the series are lines over a numeric x; -mark X:LABEL
// (repeatable) draws a labelled vertical line at X. Empty cells are gaps.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Geometry in SVG units (the picture scales to its box).
const (
	width, height = 760.0, 340.0
	left, right   = 60.0, 20.0
	top, bottom   = 48.0, 44.0
)

// palette colours the series in order.
var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"}

type table struct {
	header []string
	rows   [][]string
}

type marks []string

func (m *marks) String() string     { return strings.Join(*m, ",") }
func (m *marks) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	bars := flag.Bool("bars", false, "grouped bars: one group per row, one bar per series")
	title := flag.String("title", "", "title above the plot")
	xLabel := flag.String("x", "", "label of the x axis")
	yLabel := flag.String("y", "", "label of the y axis")
	var ms marks
	flag.Var(&ms, "mark", "X:LABEL, a labelled vertical line (lines only; repeatable)")
	flag.Parse()
	t, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	var svg string
	if *bars {
		svg, err = drawBars(t, *title, *yLabel)
	} else {
		svg, err = drawLines(t, *title, *xLabel, *yLabel, ms)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	fmt.Print(svg)
}

func read(r io.Reader) (table, error) {
	var t table
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			continue
		}
		cells := strings.Split(line, "\t")
		if t.header == nil {
			t.header = cells
			continue
		}
		t.rows = append(t.rows, cells)
	}
	if err := sc.Err(); err != nil {
		return t, err
	}
	if len(t.header) < 2 || len(t.rows) == 0 {
		return t, fmt.Errorf("want a header of at least two columns and one row, got %d columns and %d rows", len(t.header), len(t.rows))
	}
	return t, nil
}

// value is cell c of row r, ok false for an empty or missing cell.
func value(row []string, c int) (float64, bool, error) {
	if c >= len(row) || strings.TrimSpace(row[c]) == "" {
		return 0, false, nil
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(row[c]), 64)
	if err != nil {
		return 0, false, fmt.Errorf("cell %q: %w", row[c], err)
	}
	return v, true, nil
}

// niceCeil rounds a scale's top up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func label(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// frame opens the SVG and draws the title, the y axis with its grid and
// the legend.
func frame(b *strings.Builder, title, yLabel string, yTop float64, series []string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%.0f" y="18" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	plotH := height - top - bottom
	for i := 0; i <= 4; i++ {
		v := yTop * float64(i) / 4
		y := top + plotH - v/yTop*plotH
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, width-right, y)
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, label(v))
	}
	fmt.Fprintf(b, `<text transform="translate(14 %.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+plotH/2, html.EscapeString(yLabel))
	// The legend on the line under the title, left to right: a square,
	// then the name (a width estimated from its length: an error leaves
	// a gap between items, never between a square and its name).
	x := left
	for i, name := range series {
		fmt.Fprintf(b, `<rect x="%.1f" y="24" width="10" height="10" fill="%s"/>`+"\n", x, palette[i%len(palette)])
		fmt.Fprintf(b, `<text x="%.1f" y="33">%s</text>`+"\n", x+14, html.EscapeString(name))
		x += 14 + 7*float64(len(name)) + 18
	}
}

func drawBars(t table, title, yLabel string) (string, error) {
	series := t.header[1:]
	yTop := 0.0
	for _, row := range t.rows {
		for c := 1; c < len(t.header); c++ {
			v, _, err := value(row, c)
			if err != nil {
				return "", err
			}
			yTop = max(yTop, v)
		}
	}
	yTop = niceCeil(yTop)
	var b strings.Builder
	frame(&b, title, yLabel, yTop, series)
	plotW, plotH := width-left-right, height-top-bottom
	groupW := plotW / float64(len(t.rows))
	barW := groupW * 0.8 / float64(len(series))
	for g, row := range t.rows {
		gx := left + float64(g)*groupW + groupW*0.1
		for s := range series {
			v, ok, _ := value(row, s+1)
			if !ok {
				continue
			}
			h := v / yTop * plotH
			x := gx + float64(s)*barW
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				x, top+plotH-h, barW*0.9, h, palette[s%len(palette)], html.EscapeString(row[0]), html.EscapeString(series[s]), label(v))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`+"\n", x+barW*0.45, top+plotH-h-3, label(v))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", gx+groupW*0.4, height-bottom+18, html.EscapeString(row[0]))
	}
	b.WriteString("</svg>\n")
	return b.String(), nil
}

func drawLines(t table, title, xLabel, yLabel string, ms marks) (string, error) {
	series := t.header[1:]
	xs := make([]float64, len(t.rows))
	xMin, xMax, yTop := math.Inf(1), math.Inf(-1), 0.0
	for r, row := range t.rows {
		x, ok, err := value(row, 0)
		if err != nil || !ok {
			return "", fmt.Errorf("row %d: x %q is not a number", r+1, row[0])
		}
		xs[r] = x
		xMin, xMax = min(xMin, x), max(xMax, x)
		for c := 1; c < len(t.header); c++ {
			v, _, err := value(row, c)
			if err != nil {
				return "", err
			}
			yTop = max(yTop, v)
		}
	}
	if xMax <= xMin {
		xMax = xMin + 1
	}
	yTop = niceCeil(yTop)
	var b strings.Builder
	frame(&b, title, yLabel, yTop, series)
	plotW, plotH := width-left-right, height-top-bottom
	px := func(x float64) float64 { return left + (x-xMin)/(xMax-xMin)*plotW }
	py := func(v float64) float64 { return top + plotH - v/yTop*plotH }
	// x ticks at a round step, about ten of them.
	step := niceCeil((xMax - xMin) / 10)
	for x := math.Ceil(xMin/step) * step; x <= xMax; x += step {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(x), height-bottom+16, label(x))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", left+plotW/2, height-6, html.EscapeString(xLabel))
	for i, m := range ms {
		xs, name, ok := strings.Cut(m, ":")
		x, err := strconv.ParseFloat(xs, 64)
		if !ok || err != nil {
			return "", fmt.Errorf("-mark %q: want X:LABEL", m)
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#555" stroke-dasharray="4 3"/>`+"\n", px(x), top, px(x), top+plotH)
		// Labels alternate between two heights, so close marks stay legible.
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" fill="#333">%s</text>`+"\n", px(x)+3, top+12+float64(i%2)*12, html.EscapeString(name))
	}
	for s := range series {
		var pts strings.Builder
		flush := func() {
			if pts.Len() > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"/>`+"\n", palette[s%len(palette)], strings.TrimSpace(pts.String()))
				pts.Reset()
			}
		}
		for r, row := range t.rows {
			v, ok, _ := value(row, s+1)
			if !ok {
				flush()
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(xs[r]), py(v))
		}
		flush()
	}
	b.WriteString("</svg>\n")
	return b.String(), nil
}
