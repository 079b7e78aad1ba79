package imap

import (
	"fmt"
	"strings"
	"testing"
)

// TestContextSearchSort drives CONTEXT=SEARCH and CONTEXT=SORT (RFC 5267
// §4): PARTIAL windows of SEARCH (mailbox order) and SORT (sort order);
// UPDATE contexts that report ADDTO and REMOVEFROM as messages come, go
// and change flags, through this session and another; NOUPDATE for
// message numbers; BAD for a reused tag and for PARTIAL with ALL;
// CANCELUPDATE and the end of the selection stop the updates.
func TestContextSearchSort(t *testing.T) {
	e := newEnv(t)
	for _, s := range []string{"e", "d", "c", "b", "a"} {
		e.deliver(fmt.Sprintf("Subject: %s\r\n\r\nbody\r\n", s))
	}
	r := e.raw(true)
	other := e.raw(true)
	if caps := strings.Join(r.ok("CAPABILITY"), " "); !strings.Contains(caps, " CONTEXT=SEARCH") || !strings.Contains(caps, " CONTEXT=SORT") {
		t.Fatalf("CAPABILITY lacks CONTEXT=SEARCH or CONTEXT=SORT: %s", caps)
	}
	r.ok("SELECT INBOX")
	other.ok("SELECT INBOX")

	answer := func(cmd string) (string, string) {
		t.Helper()
		tag := r.send(cmd)
		u, st := r.until(tag)
		return strings.Join(u, "\n"), tag + " " + st
	}
	for cmd, want := range map[string]string{
		"UID SEARCH RETURN (PARTIAL 2:3) ALL":                     "UID PARTIAL (2:3 2:3)",
		"UID SEARCH RETURN (PARTIAL 4:10 COUNT) ALL":              "UID COUNT 5 PARTIAL (4:10 4:5)",
		"UID SEARCH RETURN (PARTIAL 9:10) ALL":                    "UID PARTIAL (9:10 NIL)",
		"UID SEARCH RETURN (PARTIAL 3:1) ALL":                     "UID PARTIAL (1:3 1:3)",
		"SEARCH RETURN (CONTEXT PARTIAL 1:1) ALL":                 ") PARTIAL (1:1 1)",
		"UID SORT RETURN (PARTIAL 1:2) (SUBJECT) UTF-8 ALL":       "UID PARTIAL (1:2 5,4)",
		"UID SORT RETURN (PARTIAL 4:9) (SUBJECT) UTF-8 ALL":       "UID PARTIAL (4:9 2,1)",
		"UID SORT RETURN (COUNT PARTIAL 2:2) (SUBJECT) UTF-8 ALL": "UID COUNT 5 PARTIAL (2:2 4)",
	} {
		u, st := answer(cmd)
		if !strings.Contains(u, want) || strings.Contains(u, " ALL ") || !strings.Contains(st, " OK") {
			t.Errorf("%s: %q %s, want %q", cmd, u, st, want)
		}
	}
	for _, cmd := range []string{"UID SEARCH RETURN (PARTIAL 1:2 ALL) ALL", "UID SEARCH RETURN (PARTIAL 0:2) ALL",
		"UID SEARCH RETURN (PARTIAL 1:*) ALL", "UID SEARCH RETURN (PARTIAL 1:2 PARTIAL 3:4) ALL", "CANCELUPDATE"} {
		if _, st := answer(cmd); !strings.Contains(st, " BAD") {
			t.Errorf("%s: %s, want BAD", cmd, st)
		}
	}

	// UPDATE of a SEARCH: positions are 0, sets in mailbox order.
	u, st := answer("UID SEARCH RETURN (UPDATE COUNT) FLAGGED")
	search := strings.Fields(st)[0]
	if !strings.Contains(u, "UID COUNT 0") || !strings.Contains(st, " OK") {
		t.Fatalf("UPDATE COUNT: %q %s", u, st)
	}
	other.ok(`UID STORE 2 +FLAGS (\Flagged)`)
	if u := r.ok("NOOP"); !has(u, fmt.Sprintf(`* ESEARCH (TAG "%s") UID ADDTO (0 2)`, search)) {
		t.Fatalf("after another session flagged UID 2: %q", u)
	}
	if u := r.ok(`UID STORE 3:4 +FLAGS.SILENT (\Flagged)`); !has(u, fmt.Sprintf(`* ESEARCH (TAG "%s") UID ADDTO (0 3:4)`, search)) {
		t.Fatalf("after this session flagged UIDs 3:4: %q", u)
	}
	other.ok(`UID STORE 2 -FLAGS (\Flagged)`)
	if u := r.ok("NOOP"); !has(u, fmt.Sprintf(`* ESEARCH (TAG "%s") UID REMOVEFROM (0 2)`, search)) {
		t.Fatalf("after another session unflagged UID 2: %q", u)
	}
	if _, st := answer(fmt.Sprintf("CANCELUPDATE %q", search)); !strings.Contains(st, " OK") {
		t.Fatalf("CANCELUPDATE: %s", st)
	}
	other.ok(`UID STORE 5 +FLAGS (\Flagged)`)
	if u := r.ok("NOOP"); has(u, "ESEARCH") {
		t.Fatalf("after CANCELUPDATE: %q", u)
	}

	// UPDATE of a SORT: positions in sort order.
	u, st = answer("UID SORT RETURN (UPDATE) (SUBJECT) UTF-8 UNSEEN")
	sorted := strings.Fields(st)[0]
	if !strings.Contains(u, "UID ALL 5,4,3,2,1") {
		t.Fatalf("SORT UPDATE: %q %s", u, st)
	}
	// A tag in use by an updating search cannot be used again.
	fmt.Fprintf(r.c, "%s UID SEARCH RETURN (UPDATE) ALL\r\n", sorted)
	if _, st := r.until(sorted); !strings.HasPrefix(st, "BAD") {
		t.Fatalf("a reused tag: %s", st)
	}
	other.ok(`UID STORE 3 +FLAGS (\Seen)`)
	if u := r.ok("NOOP"); !has(u, fmt.Sprintf(`* ESEARCH (TAG "%s") UID REMOVEFROM (3 3)`, sorted)) {
		t.Fatalf("after UID 3 was seen: %q", u)
	}
	e.deliver("Subject: bb\r\n\r\nbody\r\n")
	if u := r.ok("NOOP"); !has(u, "* 6 EXISTS") || !has(u, fmt.Sprintf(`* ESEARCH (TAG "%s") UID ADDTO (3 6)`, sorted)) {
		t.Fatalf("after a delivery: %q", u)
	}
	other.ok(`UID STORE 1 +FLAGS (\Deleted)`)
	other.ok("EXPUNGE")
	if u := r.ok("NOOP"); !has(u, fmt.Sprintf(`* ESEARCH (TAG "%s") UID REMOVEFROM (5 1)`, sorted)) {
		t.Fatalf("after an expunge: %q", u)
	}

	// Message numbers: refused with NOUPDATE, the answer still given.
	u, st = answer("SEARCH RETURN (UPDATE COUNT) ALL")
	if !strings.Contains(u, "* NO [NOUPDATE \"") || !strings.Contains(u, "COUNT 5") || !strings.Contains(st, " OK") {
		t.Fatalf("UPDATE with message numbers: %q %s", u, st)
	}

	// Contexts end with the selection.
	r.ok("UNSELECT")
	r.ok("SELECT INBOX")
	other.ok(`UID STORE 4 +FLAGS (\Seen)`)
	if u := r.ok("NOOP"); has(u, "ESEARCH") {
		t.Fatalf("after a new SELECT: %q", u)
	}

	// An expunge seen while EXPUNGE may not be sent (after a FETCH) is
	// reported at once: the message is gone for the context, though the
	// session still numbers it; a NOT over its header does not bring it
	// back.
	u, st = answer("UID SEARCH RETURN (UPDATE) NOT SUBJECT zzz")
	notZ := strings.Fields(st)[0]
	if !strings.Contains(u, "UID ALL 2:6") {
		t.Fatalf("NOT SUBJECT: %q %s", u, st)
	}
	other.ok(`UID STORE 6 +FLAGS (\Deleted)`)
	other.ok("UID EXPUNGE 6")
	if f := r.ok("FETCH 1 FLAGS"); has(f, "EXPUNGE") || !has(f, fmt.Sprintf(`* ESEARCH (TAG "%s") UID REMOVEFROM (0 6)`, notZ)) {
		t.Fatalf("FETCH after an expunge elsewhere: %q", f)
	}
	if u := r.ok("NOOP"); !has(u, "EXPUNGE") || has(u, "ESEARCH") {
		t.Fatalf("NOOP after the expunge: %q", u)
	}

	// SAVE keeps its meaning beside UPDATE; $ cannot be followed.
	r.ok(fmt.Sprintf("CANCELUPDATE %q", notZ))
	u, _ = answer("UID SEARCH RETURN (SAVE MIN UPDATE) ALL")
	if !strings.Contains(u, "MIN 2") {
		t.Fatalf("SAVE MIN UPDATE: %q", u)
	}
	if u := r.ok("UID SEARCH $"); !has(u, "* SEARCH 2") || has(u, "* SEARCH 2 ") {
		t.Fatalf("$ after SAVE MIN UPDATE: %q", u)
	}
	if u, _ := answer("UID SEARCH RETURN (UPDATE) $"); !strings.Contains(u, "NOUPDATE") {
		t.Fatalf("UPDATE over $: %q", u)
	}
}
