package bench

import (
	"fmt"
	"strings"
	"time"
)

// The large-mailbox workload (issue 13, "Search that scales"): one INBOX of
// n generated messages and the commands a client sends on it. The Go
// benchmarks BenchmarkLargeMailbox and BenchmarkLargeMailboxDovecot
// (internal/imap) and `quill bench --workload search` use the same
// messages and commands, so their figures and answers compare.

// largeBody is the text every large-mailbox message shares (about 2 KB).
var largeBody = strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit. 0123456789\r\n", 30)

// Shape of the large mailbox: how many distinct senders and subjects its
// messages have.
const (
	LargeSenders  = 97
	LargeSubjects = 1000
)

// largeEpoch is the arrival time of message 0; message i arrives i
// seconds later.
var largeEpoch = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// LargeMessage is message i (from 0) of the large mailbox: about 2 KB,
// from one of 97 senders, with one of 1,000 subjects, and ending with a
// word, word<i>, that no other message has.
func LargeMessage(i int) []byte {
	return fmt.Appendf(nil, "From: %s\r\nSubject: %s\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\n\r\n%sword%d\r\n",
		largeFrom(i), largeSubject(i), largeBody, i)
}

func largeFrom(i int) string {
	return fmt.Sprintf("Sender %d <s%d@example.org>", i%LargeSenders, i%LargeSenders)
}

func largeSubject(i int) string { return fmt.Sprintf("topic %d", i%LargeSubjects) }

// LargeArrival is message i's arrival (its INTERNALDATE): one second
// after message i-1's, so that arrival order is message order.
func LargeArrival(i int) time.Time { return largeEpoch.Add(time.Duration(i) * time.Second) }

// LargeCommand is one command of the large-mailbox workload.
type LargeCommand struct {
	// Line is the command as sent, without tag and CRLF.
	Line string
	// match reports whether the generated message i (its parts lower-cased)
	// is in the answer; nil for commands whose answer is every message.
	match func(m largeParts) bool
}

// largeParts are a generated message's parts, lower-cased, as the
// workload's SEARCH keys look at them.
type largeParts struct {
	from, subject, body, whole string
}

func largePartsOf(i int) largeParts {
	whole := strings.ToLower(string(LargeMessage(i)))
	_, body, _ := strings.Cut(whole, "\r\n\r\n")
	return largeParts{
		from:    strings.ToLower(largeFrom(i)),
		subject: strings.ToLower(largeSubject(i)),
		body:    body,
		whole:   whole,
	}
}

// LargeCommands are what a client does on an INBOX of n large-mailbox
// messages, in the order they are timed: open it, list its flags, find
// the unread, sort by arrival both ways, and search for text, a string
// inside words, a subject, a sender and a word every message holds. For
// n above 12,345 the unique word is word12345 (as in every published
// figure); below, word<n/2>.
func LargeCommands(n int) []LargeCommand {
	uniq := 12345
	if n <= uniq {
		uniq = n / 2
	}
	word := fmt.Sprintf("word%d", uniq)
	inside := fmt.Sprintf("ord%d", uniq/10) // starts and ends inside words
	contains := func(field func(largeParts) string, s string) func(largeParts) bool {
		s = strings.ToLower(s)
		return func(m largeParts) bool { return strings.Contains(field(m), s) }
	}
	whole := func(m largeParts) string { return m.whole }
	body := func(m largeParts) string { return m.body }
	return []LargeCommand{
		{Line: "SELECT INBOX"},
		{Line: "FETCH 1:* (FLAGS)"},
		{Line: "SEARCH UNSEEN"},
		{Line: "SORT (ARRIVAL) US-ASCII ALL"},
		{Line: "SORT (REVERSE ARRIVAL) UTF-8 ALL"},
		{Line: `SEARCH SUBJECT "topic 7"`, match: contains(func(m largeParts) string { return m.subject }, "topic 7")},
		{Line: "SEARCH TEXT " + word, match: contains(whole, word)},
		{Line: `SEARCH FROM "sender 42"`, match: contains(func(m largeParts) string { return m.from }, "sender 42")},
		{Line: `SEARCH BODY "` + inside + `"`, match: contains(body, inside)},
		{Line: "SEARCH BODY consectetur", match: contains(body, "consectetur")},
	}
}

// LargeWant returns, for each of cmds, the number of messages its answer
// holds on an INBOX of the first n large-mailbox messages, all unread:
// what a correct server answers (SELECT: EXISTS; FETCH: one response per
// message; SEARCH and SORT: the numbers listed).
func LargeWant(n int, cmds []LargeCommand) []int {
	want := make([]int, len(cmds))
	for c, cmd := range cmds {
		if cmd.match == nil {
			want[c] = n
		}
	}
	for i := range n {
		m := largePartsOf(i)
		for c, cmd := range cmds {
			if cmd.match != nil && cmd.match(m) {
				want[c]++
			}
		}
	}
	return want
}

// LargeAppendArgs appends to dst the arguments of APPEND for message i:
// its INTERNALDATE and the literal's header, "{size+}" with LITERAL+ or
// "{size}" without (the caller then waits for the continuation before
// sending the message).
func LargeAppendArgs(dst []byte, i, size int, literalPlus bool) []byte {
	dst = fmt.Appendf(dst, `"%s" {%d`, LargeArrival(i).Format("02-Jan-2006 15:04:05 -0700"), size)
	if literalPlus {
		dst = append(dst, '+')
	}
	return append(dst, '}')
}
