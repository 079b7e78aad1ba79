package main

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

// wellFormed checks that s parses as XML and counts its elements by name.
func wellFormed(t *testing.T, s string) map[string]int {
	t.Helper()
	count := map[string]int{}
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return count
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, s)
		}
		if e, ok := tok.(xml.StartElement); ok {
			count[e.Name.Local]++
		}
	}
}

// Grouped bars: one bar per cell, plus the legend's squares and the
// background.
func TestBars(t *testing.T) {
	tab, err := read(strings.NewReader("condition\tstatic\trandom\tdynamic\neven\t100\t110\t120\nslow\t60\t\t130\n"))
	if err != nil {
		t.Fatal(err)
	}
	svg, err := drawBars(tab, "a <title>", "msg/s")
	if err != nil {
		t.Fatal(err)
	}
	if n := wellFormed(t, svg)["rect"]; n != 1+3+5 {
		t.Fatalf("%d rects, want 9 (background, 3 legend, 5 bars)", n)
	}
}

// Lines: a gap (empty cell) splits a series into two polylines; marks are
// dashed lines; a bad cell is an error.
func TestLines(t *testing.T) {
	tab, err := read(strings.NewReader("t\tmsg/s\terrors\n0\t10\t0\n1\t12\t\n2\t0\t5\n3\t11\t0\n"))
	if err != nil {
		t.Fatal(err)
	}
	svg, err := drawLines(tab, "timeline", "s", "per second", marks{"1:kill", "2.5:restart"})
	if err != nil {
		t.Fatal(err)
	}
	c := wellFormed(t, svg)
	if c["polyline"] != 3 || strings.Count(svg, "stroke-dasharray") != 2 {
		t.Fatalf("%d polylines (want 3), %d marks (want 2)\n%s", c["polyline"], strings.Count(svg, "stroke-dasharray"), svg)
	}
	if _, err := drawLines(tab, "", "", "", marks{"kill"}); err == nil {
		t.Fatal("a mark without X: no error")
	}
	tab.rows[0][1] = "ten"
	if _, err := drawLines(tab, "", "", "", nil); err == nil {
		t.Fatal("a cell that is not a number: no error")
	}
	if _, err := read(strings.NewReader("only\n")); err == nil {
		t.Fatal("a table without rows: no error")
	}
}
