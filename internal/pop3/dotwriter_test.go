package pop3

import (
	"bytes"
	"strings"
	"testing"
)

func TestDotWriter(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ".\r\n"},
		{"a\r\n", "a\r\n.\r\n"},
		{"a", "a\r\n.\r\n"},
		{".", "..\r\n.\r\n"},
		{".\r\n", "..\r\n.\r\n"},
		{"a\r\n.\r\nb", "a\r\n..\r\nb\r\n.\r\n"},
		{"..x\r\n.y\r\nz.\r\n", "...x\r\n..y\r\nz.\r\n.\r\n"},
		{"\r\n\r\n", "\r\n\r\n.\r\n"},
		// Bare LF becomes CRLF, so a following "." is seen by the client
		// as the start of a line, and is stuffed.
		{"a\n.b\n", "a\r\n..b\r\n.\r\n"},
		{"\n", "\r\n.\r\n"},
		// A bare CR does not end a line.
		{"a\rb\r\n", "a\rb\r\n.\r\n"},
		{"a\r.b", "a\r.b\r\n.\r\n"},
		// A final CR is completed to CRLF, not doubled.
		{"a\r", "a\r\n.\r\n"},
		{"\xff\x00\x80.\r\n.\xfe", "\xff\x00\x80.\r\n..\xfe\r\n.\r\n"},
	} {
		// Every split of the input into two writes gives the same bytes,
		// since RETR copies in arbitrary chunks.
		for cut := 0; cut <= len(tc.in); cut++ {
			var out bytes.Buffer
			dw := newDotWriter(&out)
			for _, part := range []string{tc.in[:cut], tc.in[cut:]} {
				if n, err := dw.Write([]byte(part)); err != nil || n != len(part) {
					t.Fatalf("Write(%q) = %d, %v", part, n, err)
				}
			}
			if err := dw.Close(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("dot-stuffing %q (cut at %d) = %q, want %q", tc.in, cut, out.String(), tc.want)
			}
		}
	}
}

func TestCopyTop(t *testing.T) {
	const msg = "A: 1\r\nB: 2\r\n\r\nl1\r\nl2\r\nl3"
	for _, tc := range []struct {
		msg   string
		lines int
		want  string
	}{
		{msg, 0, "A: 1\r\nB: 2\r\n\r\n"},
		{msg, 2, "A: 1\r\nB: 2\r\n\r\nl1\r\nl2\r\n"},
		{msg, 3, msg},
		{msg, 10, msg},
		{"A: 1\nB: 2\n\nl1\nl2\n", 1, "A: 1\nB: 2\n\nl1\n"},
		{"A: 1\r\nno body", 0, "A: 1\r\nno body"},
		{"", 5, ""},
		// A header line longer than the read buffer that ends in CRLF
		// is not mistaken for the blank line.
		{strings.Repeat("h", 5000) + "\r\n\r\nbody\r\nmore\r\n", 1, strings.Repeat("h", 5000) + "\r\n\r\nbody\r\n"},
		{"A: 1\r\n\r\n" + strings.Repeat("b", 9000) + "\r\nnext\r\n", 1, "A: 1\r\n\r\n" + strings.Repeat("b", 9000) + "\r\n"},
	} {
		var out bytes.Buffer
		if err := copyTop(&out, &chunkReader{s: tc.msg, n: 3}, tc.lines); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("copyTop(%.30q, %d) = %.60q, want %.60q", tc.msg, tc.lines, out.String(), tc.want)
		}
	}
}
