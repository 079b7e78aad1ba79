package bench

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// The generator is a pure function of i: both servers of a comparison,
// and every run, get the same bytes; the mailbox has the shape the
// benchmarks describe.
func TestLargeMessageShape(t *testing.T) {
	if !bytes.Equal(LargeMessage(12345), LargeMessage(12345)) {
		t.Fatal("LargeMessage(12345) differs between calls")
	}
	const n = 3000
	senders, subjects := map[string]bool{}, map[string]bool{}
	header := regexp.MustCompile(`^From: (Sender \d+ <s\d+@example\.org>)\r\nSubject: (topic \d+)\r\nDate: [^\r]+\r\n\r\n`)
	for i := range n {
		m := LargeMessage(i)
		if len(m) < 2000 || len(m) > 2200 {
			t.Fatalf("message %d is %d bytes, want about 2 KB", i, len(m))
		}
		h := header.FindSubmatch(m)
		if h == nil {
			t.Fatalf("message %d: header %q", i, m[:120])
		}
		senders[string(h[1])], subjects[string(h[2])] = true, true
		if !bytes.HasSuffix(m, fmt.Appendf(nil, " 0123456789\r\nword%d\r\n", i)) {
			t.Fatalf("message %d does not end with its word: %q", i, m[len(m)-40:])
		}
		if bytes.ContainsAny(m, "\x00") || bytes.Count(m, []byte("\n")) != bytes.Count(m, []byte("\r\n")) {
			t.Fatalf("message %d is not CRLF text", i)
		}
	}
	if len(senders) != LargeSenders || len(subjects) != LargeSubjects {
		t.Errorf("%d senders and %d subjects, want %d and %d", len(senders), len(subjects), LargeSenders, LargeSubjects)
	}
	if !LargeArrival(1).After(LargeArrival(0)) || LargeArrival(7).Sub(LargeArrival(2)).Seconds() != 5 {
		t.Errorf("arrivals %v, %v", LargeArrival(0), LargeArrival(1))
	}
}

// The answers a correct server gives on 100,000 messages are those Quill
// and Dovecot's default search gave in docs/benchmarks.md.
func TestLargeWant(t *testing.T) {
	cmds := LargeCommands(100000)
	want := LargeWant(100000, cmds)
	got := map[string]int{}
	for k, c := range cmds {
		got[c.Line] = want[k]
	}
	for line, n := range map[string]int{
		"SELECT INBOX":                     100000,
		"FETCH 1:* (FLAGS)":                100000,
		"SEARCH UNSEEN":                    100000,
		"SORT (ARRIVAL) US-ASCII ALL":      100000,
		"SORT (REVERSE ARRIVAL) UTF-8 ALL": 100000,
		`SEARCH SUBJECT "topic 7"`:         11100,
		"SEARCH TEXT word12345":            1,
		`SEARCH FROM "sender 42"`:          1031,
		`SEARCH BODY "ord1234"`:            11,
		"SEARCH BODY consectetur":          100000,
	} {
		if got[line] != n {
			t.Errorf("%s: want %d, LargeWant says %d", line, n, got[line])
		}
	}
	if len(got) != 10 {
		t.Errorf("commands: %v", got)
	}
	// A small mailbox has its own unique word, found once.
	small := LargeCommands(300)
	if w := LargeWant(300, small); !strings.Contains(small[6].Line, "TEXT word150") || w[6] != 1 || w[8] != 11 || w[5] != 11 {
		t.Errorf("300 messages: %q %q want %v", small[6].Line, small[8].Line, w)
	}
}

func TestLargeAppendArgs(t *testing.T) {
	if got := string(LargeAppendArgs([]byte("APPEND INBOX "), 3600, 2048, true)); got != `APPEND INBOX "02-Mar-2026 11:00:00 +0000" {2048+}` {
		t.Errorf("LITERAL+: %q", got)
	}
	if got := string(LargeAppendArgs(nil, 0, 7, false)); got != `"02-Mar-2026 10:00:00 +0000" {7}` {
		t.Errorf("synchronizing: %q", got)
	}
}
