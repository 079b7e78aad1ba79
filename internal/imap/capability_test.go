package imap

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Every capability the server lists after login answers one real command
// the way its RFC says (docs/imap.md's table, RFC by RFC), and nothing is
// listed that this test does not know: a capability added to the list
// needs its probe here. The extensions' own tests go deeper.
func TestEveryCapabilityAnswers(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: Ann <ann@example.org>\r\nTo: u@example.org\r\nSubject: hello\r\nMessage-ID: <m1@example.org>\r\n\r\nFirst message.\r\n")
	e.deliver("From: Bob <bob@example.org>\r\nSubject: Re: hello\r\nIn-Reply-To: <m1@example.org>\r\n\r\nA reply.\r\n")

	pre := e.raw(false)
	u := pre.ok("CAPABILITY")
	before := strings.Fields(strings.TrimPrefix(line(u, "* CAPABILITY"), "* CAPABILITY "))
	for _, c := range []string{"IMAP4rev2", "IMAP4rev1", "SASL-IR", "LITERAL+", "ID", "ENABLE", "AUTH=PLAIN"} {
		if !slices.Contains(before, c) {
			t.Errorf("before login: %v, want %s", before, c)
		}
	}
	// SASL-IR (RFC 4959): the initial response on the AUTHENTICATE line.
	ir := base64.StdEncoding.EncodeToString([]byte("\x00" + testUser + "\x00" + testPass))
	if _, st := pre.cmd("AUTHENTICATE PLAIN " + ir); !strings.HasPrefix(st, "OK") {
		t.Errorf("SASL-IR: %s", st)
	}

	r := e.raw(true)
	u = r.ok("CAPABILITY")
	caps := strings.Fields(strings.TrimPrefix(line(u, "* CAPABILITY"), "* CAPABILITY "))
	r.ok("SELECT INBOX")
	lit := func(s string) string { return fmt.Sprintf("{%d+}\r\n%s", len(s), s) }
	msg := "Subject: probe\r\n\r\nprobe body\r\n"
	// Each probe runs on r (INBOX selected) unless it needs its own
	// connection; want is what the answer (untagged responses and the
	// tagged OK) must hold.
	probes := map[string]struct{ cmd, want string }{
		"IMAP4rev1":             {"NOOP", ""},
		"LITERAL+":              {"SEARCH SUBJECT " + lit("hello"), "* SEARCH 1 2"},
		"ID":                    {`ID ("name" "probe")`, `* ID ("name" "Quill"`},
		"ENABLE":                {"ENABLE CONDSTORE", "* ENABLED CONDSTORE"},
		"UTF8=ACCEPT":           {"ENABLE UTF8=ACCEPT", "* ENABLED UTF8=ACCEPT"},
		"NAMESPACE":             {"NAMESPACE", `* NAMESPACE (("" "/")) NIL NIL`},
		"UIDPLUS":               {"APPEND Archive " + lit(msg), "[APPENDUID "},
		"ESEARCH":               {"SEARCH RETURN (MIN COUNT) ALL", "MIN 1 COUNT 2"},
		"LIST-EXTENDED":         {`LIST (SUBSCRIBED) "" INBOX RETURN (CHILDREN)`, `\HasNoChildren \Subscribed) "/" INBOX`},
		"LIST-STATUS":           {`LIST "" INBOX RETURN (STATUS (MESSAGES))`, "* STATUS INBOX (MESSAGES 2)"},
		"STATUS=SIZE":           {"STATUS INBOX (SIZE)", "* STATUS INBOX (SIZE "},
		"BINARY":                {"FETCH 1 (BINARY.SIZE[1])", "BINARY.SIZE[1] 16"},
		"CHILDREN":              {`LIST "" "%"`, `* LIST (\HasNoChildren) "/" INBOX`},
		"SPECIAL-USE":           {`LIST (SPECIAL-USE) "" "*"`, `\Sent) "/" "Sent"`},
		"CREATE-SPECIAL-USE":    {`CREATE Kept (USE (\Archive))`, "[MAILBOXID ("},
		"CONDSTORE":             {"FETCH 1 (MODSEQ)", "* 1 FETCH (MODSEQ ("},
		"PREVIEW":               {"FETCH 1 (PREVIEW)", `PREVIEW "First message."`},
		"SORT":                  {"SORT (REVERSE ARRIVAL) UTF-8 ALL", "* SORT 2 1"},
		"SORT=DISPLAY":          {"SORT (DISPLAYFROM) UTF-8 ALL", "* SORT 1 2"},
		"ESORT":                 {"SORT RETURN (MIN MAX) (REVERSE ARRIVAL) UTF-8 ALL", "MIN 2 MAX 1"},
		"CONTEXT=SORT":          {"SORT RETURN (PARTIAL 1:1) (REVERSE ARRIVAL) UTF-8 ALL", "PARTIAL (1:1 2)"},
		"CONTEXT=SEARCH":        {"SEARCH RETURN (PARTIAL 2:2) ALL", "PARTIAL (2:2 2)"},
		"QUOTA":                 {"GETQUOTAROOT INBOX", "* QUOTAROOT INBOX"},
		"QUOTA=RES-STORAGE":     {"GETQUOTAROOT INBOX", "* QUOTAROOT INBOX"},
		"QUOTA=RES-MESSAGE":     {"GETQUOTAROOT INBOX", "* QUOTAROOT INBOX"},
		"MULTIAPPEND":           {"APPEND Archive " + lit(msg) + " " + lit(msg), "[APPENDUID "},
		"CATENATE":              {"APPEND Archive CATENATE (TEXT " + lit(msg) + ")", "[APPENDUID "},
		"OBJECTID":              {"STATUS INBOX (MAILBOXID)", "MAILBOXID (F"},
		"THREAD=ORDEREDSUBJECT": {"THREAD ORDEREDSUBJECT UTF-8 ALL", "* THREAD (1 2)"},
		"THREAD=REFERENCES":     {"THREAD REFERENCES UTF-8 ALL", "* THREAD (1 2)"},
		"NOTIFY":                {"NOTIFY SET (SELECTED (MessageNew MessageExpunge))", ""},
		"MOVE":                  {"MOVE 2 Trash", "[COPYUID "},
	}
	// MOVE last: it takes a message from INBOX.
	order := slices.Clone(caps)
	slices.SortStableFunc(order, func(a, b string) int {
		if a == "MOVE" {
			return 1
		}
		if b == "MOVE" {
			return -1
		}
		return 0
	})
	for _, c := range order {
		switch {
		case c == "IMAP4rev2":
			if u := e.raw(true).ok("ENABLE IMAP4rev2"); !has(u, "* ENABLED IMAP4rev2") {
				t.Errorf("IMAP4rev2: %q", u)
			}
		case c == "SASL-IR":
			// Probed before login.
		case c == "UNSELECT":
			o := e.raw(true)
			o.ok("SELECT INBOX")
			o.ok("UNSELECT")
			if _, st := o.cmd("FETCH 1 (UID)"); !strings.HasPrefix(st, "BAD") {
				t.Errorf("UNSELECT: FETCH after it is %s, want BAD (no mailbox selected)", st)
			}
		case c == "IDLE":
			o := e.raw(true)
			o.ok("SELECT INBOX")
			tag := o.send("IDLE")
			if l := o.line(); !strings.HasPrefix(l, "+ ") {
				t.Errorf("IDLE: %q, want a continuation", l)
			}
			fmt.Fprintf(o.c, "DONE\r\n")
			if _, st := o.until(tag); !strings.HasPrefix(st, "OK") {
				t.Errorf("IDLE: %s", st)
			}
		case c == "QRESYNC":
			if u := e.raw(true).ok("ENABLE QRESYNC"); !has(u, "* ENABLED QRESYNC") {
				t.Errorf("QRESYNC: %q", u)
			}
		case c == "COMPRESS=DEFLATE":
			// The rest of the session is deflated; TestCompressDeflate
			// speaks it.
			if _, st := e.raw(true).cmd("COMPRESS DEFLATE"); !strings.HasPrefix(st, "OK") {
				t.Errorf("COMPRESS=DEFLATE: %s", st)
			}
		case c == "SEARCHRES":
			r.ok("SEARCH RETURN (SAVE) FROM bob")
			if u := r.ok("FETCH $ (UID)"); len(u) != 1 || !strings.HasPrefix(u[0], "* 2 FETCH (UID") {
				t.Errorf("SEARCHRES: FETCH $ gave %q, want message 2", u)
			}
		case strings.HasPrefix(c, "APPENDLIMIT="):
			if u := r.ok("STATUS INBOX (APPENDLIMIT)"); !has(u, "APPENDLIMIT "+strings.TrimPrefix(c, "APPENDLIMIT=")) {
				t.Errorf("%s: STATUS gave %q", c, u)
			}
		default:
			p, ok := probes[c]
			if !ok {
				t.Errorf("capability %s is listed but has no probe here", c)
				continue
			}
			// The answer is the untagged responses and the tagged OK
			// (APPENDUID, MAILBOXID are response codes of the OK).
			u, st := r.cmd(p.cmd)
			if !strings.HasPrefix(st, "OK") || !has(append(u, st), p.want) {
				t.Errorf("%s: %s gave %q %s, want OK and %s", c, strings.SplitN(p.cmd, "\r\n", 2)[0], u, st, p.want)
			}
		}
	}
	// RFC 3516 §4.4: APPEND takes a binary literal.
	bin := "Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n\r\n\x00\x01\x02"
	if _, st := r.cmd(fmt.Sprintf("APPEND Archive ~{%d+}\r\n%s", len(bin), bin)); !strings.Contains(st, "[APPENDUID ") {
		t.Errorf("APPEND of a binary literal: %s", st)
	}
	// Not offered, so unknown or malformed: RFC 4314 ACL, RFC 5464
	// METADATA, RFC 9394 PARTIAL (negative ranges, FETCH PARTIAL).
	for _, cmd := range []string{"GETACL INBOX", "MYRIGHTS INBOX", `GETMETADATA "" /shared/comment`,
		"SEARCH RETURN (PARTIAL -1:-2) ALL", "FETCH 1:* (FLAGS) (PARTIAL 1:2)"} {
		if _, st := r.cmd(cmd); !strings.HasPrefix(st, "BAD") {
			t.Errorf("%s: %s, want BAD (not offered)", cmd, st)
		}
	}
}
