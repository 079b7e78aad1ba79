package bench

import (
	"bufio"
	"strings"
	"testing"
)

// answerCounter reads the size of an answer from the lines servers send.
func TestAnswerCounter(t *testing.T) {
	for _, c := range []struct {
		lines []string
		want  int
	}{
		{[]string{"* 100000 EXISTS", "* 0 RECENT", "* OK [UIDVALIDITY 1] x", "* FLAGS (\\Seen)"}, 100000},
		{[]string{"* 1 FETCH (FLAGS ())", "* 2 FETCH (FLAGS (\\Seen))", "* 3 FETCH (FLAGS ())"}, 3},
		{[]string{"* SEARCH"}, 0},
		{[]string{"* SEARCH 1 22 333"}, 3},
		{[]string{"* SORT 3 2 1"}, 3},
		{[]string{"* SEARCH 4 5 (MODSEQ 917162500)"}, 2},
		// An EXISTS or a FETCH of flags another session changed does not
		// count in a SEARCH's answer.
		{[]string{"* 7 EXISTS", "* 2 FETCH (FLAGS (\\Deleted))", "* SEARCH 2 7"}, 2},
		{[]string{"* SEARCHES 1 2", "* 5 EXPUNGE", "* STATUS INBOX (MESSAGES 3)"}, 0},
	} {
		var a answerCounter
		for _, l := range c.lines {
			a.add([]byte(l))
		}
		if got := a.result(); got != c.want {
			t.Errorf("%q: %d, want %d", c.lines, got, c.want)
		}
	}
}

// readLine takes literals out of a response and goes on after them.
func TestReadLineSkipsLiterals(t *testing.T) {
	in := "* 1 FETCH (BODY[] {11}\r\nab\r\ncd\r\n{x} FLAGS ())\r\n* SEARCH 1 2\r\n* 2 FETCH (BINARY[1] {3}\r\n\x00\x01} UID 2)\r\n"
	c := &RawIMAP{r: bufio.NewReader(strings.NewReader(in))}
	for _, want := range []string{"* 1 FETCH (BODY[] {11} FLAGS ())", "* SEARCH 1 2", "* 2 FETCH (BINARY[1] {3} UID 2)"} {
		got, err := c.readLine()
		if err != nil || string(got) != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
	if _, err := c.readLine(); err == nil {
		t.Error("no error at the end of the input")
	}
}

func TestStatusMessagesAndQuoting(t *testing.T) {
	for line, want := range map[string]int{
		"* STATUS INBOX (MESSAGES 231 UIDNEXT 44292)":   231,
		`* STATUS "MESSAGES 9" (UIDNEXT 5 MESSAGES 12)`: 12,
		"* STATUS INBOX (MESSAGES 0)":                   0,
		"* STATUS INBOX (UIDNEXT 4)":                    -1,
		"* LIST () \"/\" INBOX":                         -1,
	} {
		n, ok := statusMessages([]byte(line))
		if !ok {
			n = -1
		}
		if n != want {
			t.Errorf("%q: %d, want %d", line, n, want)
		}
	}
	if q, ok := imapQuoted(`p"w\x`); !ok || q != `"p\"w\\x"` {
		t.Errorf("quoted: %q %v", q, ok)
	}
	for _, bad := range []string{"a\r\nb", "pässword", "nul\x00"} {
		if _, ok := imapQuoted(bad); ok {
			t.Errorf("%q quoted", bad)
		}
	}
}
