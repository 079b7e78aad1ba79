package imap

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// expectUnsolicited reads responses the server sends without a command
// until one contains want.
func (r *raw) expectUnsolicited(want string) []string {
	r.t.Helper()
	var got []string
	for {
		l := r.line()
		got = append(got, l)
		if strings.Contains(l, want) {
			return got
		}
		if len(got) > 50 {
			r.t.Fatalf("no %q among %q", want, got)
		}
	}
}

// quiet reports whether the server sends nothing for a while.
func (r *raw) quiet(d time.Duration) (string, bool) {
	r.c.SetReadDeadline(time.Now().Add(d))
	l, err := r.r.ReadString('\n')
	return l, err != nil
}

// TestNotify drives NOTIFY (RFC 5465): with it set, a delivery to the
// selected mailbox is reported at once with MessageNew's fetch
// attributes, a message stored in another mailbox as STATUS, a mailbox
// made or deleted as LIST, a subscription as LIST (\Subscribed), a flag
// change and an expunge by another session as FETCH and EXPUNGE, during
// IDLE too; NOTIFY NONE stops it; bad requests are refused.
func TestNotify(t *testing.T) {
	e := newEnv(t)
	r := e.raw(true)
	other := e.raw(true)
	if caps := strings.Join(r.ok("CAPABILITY"), " "); !strings.Contains(caps, " NOTIFY") {
		t.Fatalf("CAPABILITY lacks NOTIFY: %s", caps)
	}
	for cmd, want := range map[string]string{
		"NOTIFY SET (selected (MessageNew))":                      "BAD",
		"NOTIFY SET (selected (FlagChange))":                      "BAD",
		"NOTIFY SET (elsewhere (MessageNew MessageExpunge))":      "BAD",
		"NOTIFY SET (personal (AnnotationChange))":                "NO [BADEVENT (MessageNew MessageExpunge FlagChange MailboxName SubscriptionChange)]",
		"NOTIFY SET (personal (MessageNew (UID) MessageExpunge))": "BAD",
		"NOTIFY SET (selected NONE) (selected-delayed NONE)":      "BAD",
		"NOTIFY SET":   "BAD",
		"NOTIFY MAYBE": "BAD",
		"NOTIFY SET (mailboxes (MessageNew MessageExpunge))":           "BAD",
		"NOTIFY SET (subtree Lists (MessageNew MessageExpunge) extra)": "BAD",
	} {
		if _, st := r.cmd(cmd); !strings.HasPrefix(st, want) {
			t.Errorf("%s: %s, want %s", cmd, st, want)
		}
	}

	r.ok("CREATE Lists")
	r.ok("SELECT INBOX")
	u := r.ok("NOTIFY SET STATUS (selected (MessageNew (UID FLAGS) MessageExpunge FlagChange)) (personal (MessageNew MessageExpunge MailboxName SubscriptionChange))")
	if !has(u, `* STATUS "Lists" (MESSAGES 0 UIDNEXT 1 UIDVALIDITY `) || has(u, `STATUS "INBOX"`) {
		t.Fatalf("NOTIFY SET STATUS: %q", u)
	}

	e.deliver("Subject: n1\r\n\r\nnew\r\n")
	got := r.expectUnsolicited("FETCH (UID 1 FLAGS")
	if !has(got, "* 1 EXISTS") {
		t.Fatalf("after a delivery: %q", got)
	}

	msg := "Subject: l1\r\n\r\nlist\r\n"
	other.ok(fmt.Sprintf("APPEND Lists {%d+}\r\n%s", len(msg), msg))
	r.expectUnsolicited(`* STATUS "Lists" (MESSAGES 1 UIDNEXT 2 UIDVALIDITY `)

	other.ok("CREATE Fresh")
	r.expectUnsolicited(`* LIST () "/" "Fresh"`)
	other.ok("SUBSCRIBE Fresh")
	r.expectUnsolicited(`* LIST (\Subscribed) "/" "Fresh"`)
	other.ok("RENAME Fresh Renamed")
	got = r.expectUnsolicited(`* LIST (\Subscribed) "/" "Renamed" (OLDNAME ("Fresh"))`)
	if has(got, "NonExistent") {
		t.Fatalf("RENAME reported as a deletion: %q", got)
	}
	other.ok("DELETE Renamed")
	r.expectUnsolicited(`* LIST (\NonExistent) "/" "Renamed"`)

	other.ok("SELECT INBOX")
	other.ok(`STORE 1 +FLAGS (\Flagged)`)
	r.expectUnsolicited(`FLAGS (\Flagged`)
	other.ok(`STORE 1 +FLAGS (\Deleted)`)
	other.ok("EXPUNGE")
	r.expectUnsolicited("* 1 EXPUNGE")

	// During IDLE, what NOTIFY reports goes out too.
	tag := r.send("IDLE")
	if l := r.line(); !strings.HasPrefix(l, "+") {
		t.Fatalf("IDLE: %q", l)
	}
	other.ok(fmt.Sprintf("APPEND Lists {%d+}\r\n%s", len(msg), msg))
	r.expectUnsolicited(`* STATUS "Lists" (MESSAGES 2 UIDNEXT 3 UIDVALIDITY `)
	fmt.Fprintf(r.c, "DONE\r\n")
	if _, st := r.until(tag); !strings.HasPrefix(st, "OK") {
		t.Fatalf("IDLE: %s", st)
	}

	// A line other than DONE ends IDLE with BAD, and the session's IDLE
	// is over before anything else runs (it used to go on beside the
	// next command and NOTIFY's reports).
	tag = r.send("IDLE")
	if l := r.line(); !strings.HasPrefix(l, "+") {
		t.Fatalf("IDLE: %q", l)
	}
	fmt.Fprintf(r.c, "NOT-DONE\r\n")
	if _, st := r.until(tag); !strings.HasPrefix(st, "BAD") {
		t.Fatalf("IDLE ended by a line other than DONE: %s", st)
	}
	other.ok(fmt.Sprintf("APPEND Lists {%d+}\r\n%s", len(msg), msg))
	r.expectUnsolicited(`* STATUS "Lists" (MESSAGES 3 `)

	// MessageNew's BODY[] is a PEEK: a report does not mark mail read.
	r.ok("NOTIFY SET (selected (MessageNew (UID BODY[]) MessageExpunge)) (subscribed (SubscriptionChange))")
	e.deliver("Subject: peek\r\n\r\nunread\r\n")
	got = r.expectUnsolicited("unread")
	if !has(got, "BODY[] {") {
		t.Fatalf("MessageNew (BODY[]): %q", got)
	}
	if u := r.ok("UID FETCH 2 FLAGS"); has(u, `\Seen`) {
		t.Fatalf("a NOTIFY report marked the message read: %q", u)
	}
	// SUBSCRIBED tells of an unsubscription too.
	other.ok("SUBSCRIBE Lists")
	r.expectUnsolicited(`* LIST (\Subscribed) "/" "Lists"`)
	other.ok("UNSUBSCRIBE Lists")
	r.expectUnsolicited(`* LIST () "/" "Lists"`)

	// NOTIFY NONE: nothing more without a command.
	r.ok("NOTIFY NONE")
	e.deliver("Subject: n2\r\n\r\nnew\r\n")
	other.ok(fmt.Sprintf("APPEND Lists {%d+}\r\n%s", len(msg), msg))
	if l, quiet := r.quiet(500 * time.Millisecond); !quiet {
		t.Fatalf("after NOTIFY NONE the server sent %q", l)
	}
	if u := r.ok("NOOP"); !has(u, "EXISTS") {
		t.Fatalf("NOOP after NOTIFY NONE: %q", u)
	}
}
