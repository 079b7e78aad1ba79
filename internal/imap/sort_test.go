package imap

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/third_party/imapserver"
)

func TestBaseSubject(t *testing.T) {
	for _, c := range []struct {
		in, want string
		reply    bool
	}{
		{"hello", "hello", false},
		{"Re: hello", "hello", true},
		{"RE:  Re: re:hello", "hello", true},
		{"Fwd: hello (fwd)", "hello", true},
		{"hello (FWD)  (fwd) ", "hello", true},
		{"[list] Re: hello", "hello", true},
		{"Re [2]: hello", "hello", true},
		{"[list] hello", "hello", false},
		{"[list]", "[list]", false},
		{"[fwd: Re: hello]", "hello", true},
		{"  hello\t \r\n world  ", "hello world", false},
		{"Re: [a][b] fw: [fwd: hello]", "hello", true},
		{"Re:", "", true},
		{"", "", false},
		{"Reply: x", "Reply: x", false},
	} {
		got, reply := baseSubject(c.in)
		if got != c.want || reply != c.reply {
			t.Errorf("baseSubject(%q) = %q, %v; want %q, %v", c.in, got, reply, c.want, c.reply)
		}
	}
}

func tm(num uint32, subject, id string, refs ...string) threadMsg {
	s, reply := baseSubject(subject)
	return threadMsg{num: num, seq: num, info: &sortInfo{
		sent: time.Date(2026, 1, 1, 0, 0, int(num), 0, time.UTC), subject: asciiLower(s), replyFwd: reply,
		messageID: id, refs: refs,
	}}
}

func TestThreadReferences(t *testing.T) {
	msgs := []threadMsg{
		tm(1, "hello", "a"),
		tm(2, "Re: hello", "b", "a"),
		tm(3, "Re: hello", "c", "a"),
		tm(4, "Re: hello", "d", "a", "b"),
		tm(5, "other", "e", "x"),
		tm(6, "Re: other", "f", "x"),
		tm(7, "Re: hello", "g"), // no references: joined by subject
		tm(8, "alone", ""),      // no Message-ID
		tm(9, "dup", "a"),       // duplicate Message-ID: a thread of its own
		tm(10, "loop", "l1", "l2"),
		tm(11, "loop", "l2", "l1"), // 10 under 11 already: no loop back
	}
	got := imapserver.FormatThreads(references(msgs))
	want := "(1 (2 4)(3)(7))((5)(6))(8)(9)(11 10)"
	if got != want {
		t.Errorf("REFERENCES:\n got %s\nwant %s", got, want)
	}
	// A message with no references has no parent, even one another
	// message's References gave it (RFC 5256 step 1B).
	got = imapserver.FormatThreads(references([]threadMsg{tm(1, "x", "a"), tm(2, "y", "c", "a", "b"), tm(3, "z", "b")}))
	if want := "(1)(3 2)"; got != want {
		t.Errorf("REFERENCES, a parent from another's References: got %s, want %s", got, want)
	}
	// Two root messages of the same base subject, neither a reply,
	// meet under a dummy.
	got = imapserver.FormatThreads(references([]threadMsg{tm(1, "topic", "p"), tm(2, "[x] topic", "q"), tm(3, "Re: topic", "r", "q")}))
	if want := "((1)(2 3))"; got != want {
		t.Errorf("REFERENCES by subject: got %s, want %s", got, want)
	}
}

func TestThreadOrderedSubject(t *testing.T) {
	msgs := []threadMsg{tm(1, "b", ""), tm(2, "a", ""), tm(3, "Re: b", ""), tm(4, "c", ""), tm(5, "re: a", ""), tm(6, "B", "")}
	got := imapserver.FormatThreads(orderedSubject(msgs))
	if want := "(1 (3)(6))(2 5)(4)"; got != want {
		t.Errorf("ORDEREDSUBJECT: got %s, want %s", got, want)
	}
}

// SORT, ESORT and THREAD over a session (RFC 5256, RFC 5267 §3).
func TestSortAndThreadCommands(t *testing.T) {
	e := newEnv(t)
	msgs := []struct{ from, to, subject, date, extra, body string }{
		{"Zed <zed@x.example>", "bob@x.example", "Re: apples", "Mon, 02 Mar 2026 10:00:00 +0000", "In-Reply-To: <m3@x>\r\n", "ccc"},
		{"amy@x.example", "Carl <carl@x.example>", "bananas", "Sun, 01 Mar 2026 10:00:00 +0000", "Message-ID: <m2@x>\r\n", "a"},
		{"Bob <bob@x.example>", "amy@x.example", "apples", "Sat, 28 Feb 2026 10:00:00 +0000", "Message-ID: <m3@x>\r\n", "bbbbbbbbbb"},
		{"=?utf-8?q?=C3=89mile?= <emile@x.example>", "zed@x.example", "[list] Cherries", "", "", "dd"},
	}
	for _, m := range msgs {
		h := fmt.Sprintf("From: %s\r\nTo: %s\r\nSubject: %s\r\n%s", m.from, m.to, m.subject, m.extra)
		if m.date != "" {
			h += "Date: " + m.date + "\r\n"
		}
		e.deliver(h + "\r\n" + m.body + "\r\n")
		time.Sleep(10 * time.Millisecond) // distinct internal dates
	}
	r := e.raw(true)
	if u := r.ok("CAPABILITY"); !has(u, " SORT ") || !has(u, "SORT=DISPLAY") || !has(u, "ESORT") || !has(u, "THREAD=REFERENCES") || !has(u, "THREAD=ORDEREDSUBJECT") {
		t.Errorf("capabilities: %q", u)
	}
	r.ok("SELECT INBOX")
	for cmd, want := range map[string]string{
		"SORT (SUBJECT) UTF-8 ALL":                        "* SORT 1 3 2 4", // 1 and 3 tie: mailbox order
		"SORT (REVERSE SUBJECT) UTF-8 ALL":                "* SORT 4 2 1 3", // ties are not reversed
		"SORT (DATE) US-ASCII ALL":                        "* SORT 3 2 1 4",
		"SORT (ARRIVAL) UTF-8 ALL":                        "* SORT 1 2 3 4",
		"SORT (REVERSE ARRIVAL) UTF-8 ALL":                "* SORT 4 3 2 1",
		"SORT (FROM) UTF-8 ALL":                           "* SORT 2 3 4 1",
		"SORT (TO) UTF-8 ALL":                             "* SORT 3 1 2 4",
		"SORT (DISPLAYFROM) UTF-8 ALL":                    "* SORT 2 3 1 4", // amy@, Bob, Zed, Émile (ASCII case map)
		"SORT (CC SUBJECT) UTF-8 ALL":                     "* SORT 1 3 2 4",
		"SORT (SUBJECT) UTF-8 FROM bob":                   "* SORT 3",
		"UID SORT (REVERSE DATE) UTF-8 ALL":               "* SORT 4 1 2 3",
		"SORT RETURN (MIN MAX COUNT) (SUBJECT) UTF-8 ALL": `* ESEARCH (TAG "t`,
		"SORT RETURN () (REVERSE ARRIVAL) UTF-8 ALL":      "ALL 4,3,2,1",
		"UID SORT RETURN (ALL) (ARRIVAL) UTF-8 ALL":       "UID ALL 1:4",
		"THREAD ORDEREDSUBJECT UTF-8 ALL":                 "* THREAD (3 1)(2)(4)",
		"THREAD REFERENCES UTF-8 ALL":                     "* THREAD (3 1)(2)(4)",
		"UID THREAD REFERENCES UTF-8 SUBJECT bananas":     "* THREAD (2)",
		"THREAD REFERENCES UTF-8 SUBJECT nothing":         "* THREAD",
	} {
		u := r.ok(cmd)
		if !has(u, want) {
			t.Errorf("%s:\n got %q\nwant %q", cmd, u, want)
		}
	}
	// RFC 7162 §3.1.5: with a MODSEQ key, the highest mod-sequence ends
	// the answer.
	if u := r.ok("SORT (ARRIVAL) UTF-8 MODSEQ 1"); !has(u, "* SORT 1 2 3 4 (MODSEQ ") {
		t.Errorf("SORT with MODSEQ: %q", u)
	}
	if u := r.ok("SORT RETURN (COUNT) (ARRIVAL) UTF-8 MODSEQ 1"); !has(u, "COUNT 4 MODSEQ ") {
		t.Errorf("ESORT with MODSEQ: %q", u)
	}
	if u := r.ok("SORT (ARRIVAL) UTF-8 ALL"); has(u, "MODSEQ") {
		t.Errorf("SORT without MODSEQ: %q", u)
	}
	// With MIN alone, the MODSEQ is MIN's message's, not the highest of
	// all (message 1 is changed last, so it has the highest).
	r.ok(`STORE 1 +FLAGS.SILENT (\Flagged)`)
	var ms4 string
	for _, l := range r.ok("FETCH 4 (MODSEQ)") {
		fmt.Sscanf(l, "* 4 FETCH (MODSEQ (%s", &ms4)
	}
	ms4 = strings.TrimRight(ms4, ")")
	if u := r.ok("SORT RETURN (MIN) (REVERSE ARRIVAL) UTF-8 MODSEQ 1"); ms4 == "" || !has(u, "MIN 4 MODSEQ "+ms4) {
		t.Errorf("ESORT MIN with MODSEQ: %q, want message 4's MODSEQ %s", u, ms4)
	}
	if u := r.ok("SORT RETURN (MIN MAX COUNT) (SUBJECT) UTF-8 ALL"); !has(u, "MIN 1 MAX 4 COUNT 4") {
		t.Errorf("ESORT MIN/MAX are the first and last in sort order: %q", u)
	}
	// SIZE follows RFC822.SIZE.
	sizes := map[string]string{}
	for _, l := range r.ok("FETCH 1:4 RFC822.SIZE") {
		var seq, size string
		fmt.Sscanf(l, "* %s FETCH (RFC822.SIZE %s", &seq, &size)
		sizes[seq] = strings.TrimSuffix(size, ")")
	}
	sorted := r.ok("SORT (SIZE) UTF-8 ALL")
	if len(sorted) != 1 {
		t.Fatalf("SORT (SIZE): %q", sorted)
	}
	prev := -1
	for _, f := range strings.Fields(strings.TrimPrefix(sorted[0], "* SORT ")) {
		n, _ := strconv.Atoi(sizes[f])
		if n < prev {
			t.Errorf("SORT (SIZE) %q against sizes %v", sorted[0], sizes)
		}
		prev = n
	}
	for _, bad := range []string{"SORT (NOSUCH) UTF-8 ALL", "SORT (REVERSE) UTF-8 ALL", "SORT () UTF-8 ALL", "SORT (SUBJECT) ALL", "THREAD NOSUCH UTF-8 ALL", "SORT RETURN (SAVE) (DATE) UTF-8 ALL"} {
		if _, st := r.cmd(bad); !has([]string{st}, "BAD") {
			t.Errorf("%s: %s, want BAD", bad, st)
		}
	}
	if _, st := r.cmd("SORT (DATE) KOI8-R ALL"); !has([]string{st}, "NO [BADCHARSET") {
		t.Errorf("unknown charset: %s", st)
	}
}

// FuzzThreadReferences threads messages whose ids, references and
// subjects come from the fuzzer (loops, duplicates, self-references):
// every message comes out exactly once, and threading ends.
func FuzzThreadReferences(f *testing.F) {
	f.Add([]byte("abc\x00ba\x01cb\x02aa"), "Re: x")
	f.Add([]byte("aaaa\x00\x00\x00"), "[fwd: y]")
	f.Fuzz(func(t *testing.T, data []byte, subject string) {
		var msgs []threadMsg
		for i := 0; i+1 < len(data) && len(msgs) < 64; i += 2 {
			id := string(rune('a' + data[i]%8))
			var refs []string
			for j := 0; j < int(data[i+1]%4); j++ {
				if k := i + 2 + j; k < len(data) {
					refs = append(refs, string(rune('a'+data[k]%8)))
				}
			}
			subj := subject
			if data[i]%3 == 0 {
				subj = "Re: " + subject
			}
			msgs = append(msgs, tm(uint32(len(msgs)+1), subj, id, refs...))
		}
		for _, threads := range [][]imapserver.Thread{references(msgs), orderedSubject(msgs)} {
			seen := map[uint32]int{}
			var walk func([]imapserver.Thread)
			walk = func(ts []imapserver.Thread) {
				for _, th := range ts {
					if th.Num != 0 {
						seen[th.Num]++
					} else if len(th.Children) < 2 {
						t.Fatalf("a dummy with %d children: %s", len(th.Children), imapserver.FormatThreads(ts))
					}
					walk(th.Children)
				}
			}
			walk(threads)
			for _, m := range msgs {
				if seen[m.num] != 1 {
					t.Fatalf("message %d appears %d times in %s", m.num, seen[m.num], imapserver.FormatThreads(threads))
				}
			}
		}
	})
}

// SORT by ARRIVAL or SIZE reads no message: both keys are in the index.
func TestSortByArrivalReadsNoMessage(t *testing.T) {
	e, cs := newCountingEnv(t)
	for i := range 3 {
		e.deliver(fmt.Sprintf("Subject: %d\r\n\r\n%s\r\n", i, strings.Repeat("x", 10*(3-i))))
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	if u := r.ok("SORT (REVERSE ARRIVAL) UTF-8 ALL"); !has(u, "* SORT 3 2 1") {
		t.Errorf("SORT (REVERSE ARRIVAL): %q", u)
	}
	if u := r.ok("SORT (SIZE) UTF-8 ALL"); !has(u, "* SORT 3 2 1") {
		t.Errorf("SORT (SIZE): %q", u)
	}
	if n := cs.bodies.Load(); n != 0 {
		t.Errorf("%d messages read for SORT by ARRIVAL and SIZE, want 0", n)
	}
	r.ok("SORT (SUBJECT) UTF-8 ALL")
	if n := cs.bodies.Load(); n != 3 {
		t.Errorf("%d messages read for SORT by SUBJECT, want 3", n)
	}
}

// BenchmarkThreadChain threads a chain of replies, each naming every
// message before it (up to maxRefs): linear, not quadratic, in its length.
func BenchmarkThreadChain(b *testing.B) {
	const n = 50000
	msgs := make([]threadMsg, n)
	for i := range msgs {
		var refs []string
		for j := max(0, i-maxRefs); j < i; j++ {
			refs = append(refs, fmt.Sprint(j))
		}
		msgs[i] = tm(uint32(i+1), "Re: chain", fmt.Sprint(i), refs...)
	}
	b.ResetTimer()
	for range b.N {
		references(msgs)
	}
}
