package imap

import (
	"regexp"
	"strings"
	"testing"
)

var objectIDRe = regexp.MustCompile(`(MAILBOXID|EMAILID) \(([A-Za-z0-9_-]+)\)`)

// firstID returns the first MAILBOXID or EMAILID in lines, or "".
func firstID(lines []string) string {
	for _, l := range lines {
		if m := objectIDRe.FindStringSubmatch(l); m != nil {
			return m[2]
		}
	}
	return ""
}

// OBJECTID (RFC 8474): MAILBOXID in CREATE, SELECT, STATUS and LIST-STATUS,
// kept by RENAME and new for a mailbox made again; EMAILID kept by COPY
// and MOVE and searchable; THREADID NIL.
func TestObjectID(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: a@example.org\r\nSubject: obj\r\n\r\nbody\r\n")
	e.deliver("From: b@example.org\r\nSubject: other\r\n\r\nbody 2\r\n")
	r := e.raw(true)
	if u := r.ok("CAPABILITY"); !has(u, " OBJECTID") {
		t.Errorf("capabilities: %q", u)
	}
	_, st := r.cmd("CREATE Projects")
	created := firstID([]string{st})
	if !strings.HasPrefix(st, "OK [MAILBOXID (F") || created == "" {
		t.Fatalf("CREATE: %q, want OK [MAILBOXID (...)]", st)
	}
	if got := firstID(r.ok("SELECT Projects")); got != created {
		t.Errorf("SELECT gave MAILBOXID %q, CREATE %q", got, created)
	}
	if got := firstID(r.ok("STATUS Projects (MESSAGES MAILBOXID)")); got != created {
		t.Errorf("STATUS gave MAILBOXID %q, CREATE %q", got, created)
	}
	if got := firstID(r.ok(`LIST "" Projects RETURN (STATUS (MAILBOXID))`)); got != created {
		t.Errorf("LIST-STATUS gave MAILBOXID %q, CREATE %q", got, created)
	}
	// A trailing delimiter only declares children: the id is the
	// mailbox's all the same (RFC 8474 §4.1).
	_, st = r.cmd("CREATE Parent/")
	if id := firstID([]string{st}); id == "" || id != firstID(r.ok("STATUS Parent (MAILBOXID)")) {
		t.Errorf("CREATE Parent/: %q", st)
	}
	inbox := firstID(r.ok("EXAMINE INBOX"))
	if inbox == "" || inbox == created {
		t.Errorf("INBOX MAILBOXID %q (Projects %q)", inbox, created)
	}
	r.ok("RENAME Projects Work")
	if got := firstID(r.ok("STATUS Work (MAILBOXID)")); got != created {
		t.Errorf("after RENAME: MAILBOXID %q, want %q kept", got, created)
	}
	r.ok("DELETE Work")
	_, st = r.cmd("CREATE Work")
	if again := firstID([]string{st}); again == "" || again == created {
		t.Errorf("a mailbox made again has MAILBOXID %q, the deleted one had %q", again, created)
	}

	r.ok("SELECT INBOX")
	u := r.ok("FETCH 1:2 (EMAILID THREADID)")
	if !has(u, "THREADID NIL") {
		t.Errorf("FETCH THREADID: %q, want NIL", u)
	}
	first := firstID(u)
	if first == "" || !strings.HasPrefix(first, "M") {
		t.Fatalf("FETCH EMAILID: %q", u)
	}
	second := firstID(u[1:])
	if second == "" || second == first {
		t.Errorf("two different messages have EMAILIDs %q and %q", first, second)
	}
	if got := r.ok("SEARCH EMAILID " + first); !has(got, "* SEARCH 1") || has(got, "* SEARCH 1 2") {
		t.Errorf("SEARCH EMAILID: %q", got)
	}
	if got := r.ok("SEARCH THREADID T1"); !has(got, "* SEARCH") || has(got, "* SEARCH 1") {
		t.Errorf("SEARCH THREADID matches nothing: %q", got)
	}
	if _, st := r.cmd("SEARCH EMAILID bad/id"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("SEARCH EMAILID bad/id: %s, want BAD", st)
	}
	r.ok("COPY 1 Work")
	r.ok("MOVE 2 Work")
	r.ok("SELECT Work")
	u = r.ok("FETCH 1:2 (EMAILID)")
	if got := firstID(u); got != first {
		t.Errorf("COPY: EMAILID %q, the source's %q", got, first)
	}
	if got := firstID(u[1:]); got != second {
		t.Errorf("MOVE: EMAILID %q, the source's %q", got, second)
	}
}

// One message delivered to two users has an EMAILID in each account that
// does not give the other away.
func TestEmailIDPerUser(t *testing.T) {
	m := &msgState{id: "x"}
	raw := []byte("Subject: same\r\n\r\nbody\r\n")
	if emailObjectID("a@example.org", raw, m) == emailObjectID("b@example.org", raw, m) {
		t.Error("two users share an EMAILID")
	}
	if emailObjectID("a@example.org", raw, m) != emailObjectID("A@example.org", raw, m) {
		t.Error("the user's case changes the EMAILID")
	}
}
