package imap

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Edge cases after Dovecot's imaptest fetch-body script.
func TestFetchSectionsEdgeCases(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: User1 <user1@domain.org>\r\nDate: Sat, 24 Mar 2007 23:00:00 +0200\r\nSubject: s1\r\n\r\nbody1\r\n\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	for cmd, want := range map[string]string{
		"FETCH 1 BODY.PEEK[HEADER.FIELDS (FROM)]":         "BODY[HEADER.FIELDS (\"FROM\")] {34}\r\nFrom: User1 <user1@domain.org>\r\n\r\n)",
		"FETCH 1 BODY.PEEK[HEADER.FIELDS (xyz)]":          "BODY[HEADER.FIELDS (\"xyz\")] {2}\r\n\r\n)",
		"FETCH 1 BODY.PEEK[HEADER.FIELDS.NOT (date)]":     "{47}\r\nFrom: User1 <user1@domain.org>\r\nSubject: s1\r\n\r\n)",
		"FETCH 1 BODY.PEEK[TEXT]<3.3>":                    "BODY[TEXT]<3> {3}\r\ny1\r",
		"FETCH 1 BODY.PEEK[TEXT]<100.3>":                  "BODY[TEXT]<100> {0}\r\n)",
		"FETCH 1 RFC822.HEADER":                           "RFC822.HEADER {",
		"FETCH 1 (FLAGS BODY.PEEK[1])":                    "BODY[1] {9}\r\nbody1\r\n\r\n)",
		"FETCH 1 FAST":                                    "RFC822.SIZE 95",
		"FETCH 1 RFC822.TEXT":                             `FLAGS (\Seen \Recent)`,
		"UID FETCH 1 (BODY.PEEK[HEADER] BODY.PEEK[TEXT])": "UID 1",
	} {
		u := r.ok(cmd)
		if !has(u, want) {
			t.Errorf("%s:\n got %q\nwant %q", cmd, u, want)
		}
	}
}

// A partial BINARY fetch names its origin in the reply (RFC 3516 §4.2),
// and a BODY[] of a part that holds NUL bytes sends none of them in its
// plain literal (RFC 9051 §4.3): they go out as 0x80, the size unchanged,
// while BINARY[] still gives the bytes as they are.
func TestBinaryOriginAndNoNULsInBody(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: a@example.org\r\nSubject: bin\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n" +
		"--b\r\nContent-Type: text/plain\r\n\r\nhello there\r\n" +
		"--b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n\r\nab\x00cd\r\n--b--\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	if u := r.ok("FETCH 1 (BINARY.PEEK[1]<6.5>)"); !has(u, "BINARY[1]<6> ~{5}\r\nthere") {
		t.Errorf("partial BINARY: %q, want the origin <6> named", u)
	}
	if u := r.ok("FETCH 1 (BINARY.PEEK[1])"); !has(u, "BINARY[1] ~{11}\r\nhello there") {
		t.Errorf("whole BINARY: %q", u)
	}
	u := r.ok("FETCH 1 (BODY.PEEK[2])")
	if strings.Contains(strings.Join(u, ""), "\x00") || !has(u, "BODY[2] {5}\r\nab\x80cd") {
		t.Errorf("BODY[2] of a part with a NUL: %q, want it as 0x80", u)
	}
	if u := r.ok("FETCH 1 (BINARY.PEEK[2])"); !has(u, "BINARY[2] ~{5}\r\nab\x00cd") {
		t.Errorf("BINARY[2]: %q, want the NUL as it is", u)
	}
}

// BINARY undoes the transfer encoding and nothing else (RFC 3516 §4.2): a
// Latin-1 part keeps its bytes, a part in a charset nobody knows is still
// served, and a transfer encoding the server cannot decode fails the FETCH
// with NO [UNKNOWN-CTE], for BINARY.SIZE as well.
func TestBinaryDecodesTransferEncodingOnly(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: a@example.org\r\nSubject: cte\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n" +
		"--b\r\nContent-Type: text/plain; charset=iso-8859-1\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\ncaf=E9\r\n" +
		"--b\r\nContent-Type: text/plain; charset=x-nobody-knows\r\n\r\nplain text\r\n" +
		"--b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: x-uuencode\r\n\r\nbegin 644 x\r\n" +
		"--b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64 \r\n\r\nAAEC \r\nAwQ=\r\n--b--\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	if u := r.ok("FETCH 1 (BINARY.PEEK[1] BINARY.SIZE[1])"); !has(u, "BINARY[1] ~{4}\r\ncaf\xe9") || !has(u, "BINARY.SIZE[1] 4") {
		t.Errorf("a Latin-1 part: %q, want its 4 bytes as they are", u)
	}
	if u := r.ok("FETCH 1 (BINARY.PEEK[2] BINARY.SIZE[2])"); !has(u, "BINARY[2] ~{10}\r\nplain text") || !has(u, "BINARY.SIZE[2] 10") {
		t.Errorf("a part in an unknown charset: %q", u)
	}
	if u := r.ok("FETCH 1 (BINARY.PEEK[4])"); !has(u, "BINARY[4] ~{5}\r\n\x00\x01\x02\x03\x04") {
		t.Errorf("base64 with blanks: %q", u)
	}
	for _, item := range []string{"BINARY.PEEK[3]", "BINARY.SIZE[3]", "BINARY.PEEK[1] BINARY.SIZE[3]"} {
		if u, st := r.cmd("FETCH 1 (" + item + ")"); !strings.Contains(st, "NO [UNKNOWN-CTE]") || len(u) != 0 {
			t.Errorf("FETCH 1 (%s) of an x-uuencode part: %q %q, want NO [UNKNOWN-CTE] and no FETCH", item, u, st)
		}
	}
	if u := r.ok("FETCH 1 (BODY.PEEK[3])"); !has(u, "BODY[3] {11}\r\nbegin 644 x") {
		t.Errorf("BODY[3] of the part BINARY cannot decode: %q", u)
	}
}

// A keyword the session has not seen is announced with FLAGS and
// PERMANENTFLAGS before the FETCH that shows it, to the session that
// stored it and to another that sees the change; a bare NIL in STORE is
// no flags, and NIL in a flag list is the client's error (issue 13 item 6).
func TestNewKeywordAnnouncedFirstAndNILIsNoFlag(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: a@example.org\r\nSubject: k\r\n\r\nbody\r\n")
	r, other := e.raw(true), e.raw(true)
	r.ok("SELECT INBOX")
	other.ok("SELECT INBOX")
	u := r.ok("STORE 1 +FLAGS (project-x)")
	flags, perm, fetch := index(u, "* FLAGS ("), index(u, "* OK [PERMANENTFLAGS ("), index(u, "* 1 FETCH (FLAGS")
	if flags < 0 || perm < 0 || fetch < 0 || !(flags < fetch && perm < fetch) || !strings.Contains(u[flags], "project-x") ||
		!strings.Contains(u[perm], `project-x \*`) {
		t.Errorf("STORE of a new keyword: %q, want FLAGS and PERMANENTFLAGS with it before the FETCH", u)
	}
	if u := r.ok("STORE 1 +FLAGS (project-x)"); index(u, "* FLAGS") >= 0 {
		t.Errorf("a keyword already known announced again: %q", u)
	}
	u = other.ok("NOOP")
	flags, fetch = index(u, "* FLAGS ("), index(u, "* 1 FETCH (")
	if flags < 0 || fetch < 0 || flags > fetch || !strings.Contains(u[flags], "project-x") {
		t.Errorf("the other session: %q, want FLAGS with the keyword before the FETCH", u)
	}
	// A keyword swapped for another: the count of flags stays, the set
	// does not.
	u = r.ok("STORE 1 FLAGS (other-y)")
	if f, fe := index(u, "* FLAGS ("), index(u, "* 1 FETCH"); f < 0 || fe < 0 || f > fe || !strings.Contains(u[f], "other-y") {
		t.Errorf("STORE FLAGS (other-y) in place of project-x: %q, want FLAGS before the FETCH", u)
	}
	r.ok("STORE 1 FLAGS (project-x)")
	if u := r.ok("STORE 1 +FLAGS NIL"); has(u, "NIL") {
		t.Errorf("STORE +FLAGS NIL: %q, want no flag named NIL", u)
	}
	if _, st := r.cmd("STORE 1 +FLAGS (NIL)"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("STORE +FLAGS (NIL): %s, want BAD", st)
	}
	if u := r.ok("FETCH 1 FLAGS"); has(u, "NIL") || !has(u, "project-x") {
		t.Errorf("flags after the NIL stores: %q", u)
	}
	if u := r.ok(`LIST "" "&'"`); len(u) != 0 {
		t.Errorf(`LIST with a pattern that is not modified UTF-7: %q, want no mailbox (issue 13 item 2)`, u)
	}
}

// index is the position of the first line starting with prefix, or -1.
func index(lines []string, prefix string) int {
	for i, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

// RFC 7162 §3.1: the first command that enables CONDSTORE implicitly is
// answered with the mailbox's HIGHESTMODSEQ, once; SEARCH RETURN (MIN) or
// (MAX) with a MODSEQ criterion gives the MODSEQ of the messages it names
// (§3.1.5), not of every match (issue 13 item 3).
func TestCondStoreEnabledImplicitly(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 3; i++ {
		e.deliver(fmt.Sprintf("Subject: %d\r\n\r\n%d\r\n", i, i))
	}
	for _, c := range []struct{ first, want string }{
		{"FETCH 1 (MODSEQ)", "* OK [HIGHESTMODSEQ 4]"},
		{"SEARCH MODSEQ 1", "* OK [HIGHESTMODSEQ 4]"},
		{`STORE 3 (UNCHANGEDSINCE 9) +FLAGS (\Seen)`, "* OK [HIGHESTMODSEQ 5]"},
	} {
		r := e.raw(true)
		r.ok("SELECT INBOX")
		if u := r.ok(c.first); !has(u, c.want) {
			t.Errorf("%s as the first CONDSTORE command: %q, want %s", c.first, u, c.want)
		}
		if u := r.ok("FETCH 1 (MODSEQ)"); index(u, "* OK [HIGHESTMODSEQ") >= 0 {
			t.Errorf("HIGHESTMODSEQ sent again after CONDSTORE was enabled: %q", u)
		}
		r.ok("LOGOUT")
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	r.ok(`STORE 1 +FLAGS (\Flagged)`) // message 1 now has the highest MODSEQ
	for cmd, want := range map[string]string{
		"SEARCH RETURN (MIN) MODSEQ 1":     "MIN 1 MODSEQ 6",
		"SEARCH RETURN (MAX) MODSEQ 1":     "MAX 3 MODSEQ 5",
		"SEARCH RETURN (MIN MAX) MODSEQ 1": "MIN 1 MAX 3 MODSEQ 6",
		"SEARCH RETURN (MAX) MODSEQ 4":     "MAX 3 MODSEQ 5",
		"SEARCH RETURN (COUNT) MODSEQ 1":   "COUNT 3 MODSEQ 6",
	} {
		if u := r.ok(cmd); !has(u, want) {
			t.Errorf("%s: %q, want %s", cmd, u, want)
		}
	}
}

// RFC 7162 §3.1: once CONDSTORE is enabled, every FETCH response that
// reports a flag change carries the UID and the MODSEQ: a STORE's (by
// sequence number, .SILENT included) and a FETCH's that set \Seen. A FETCH
// that changes nothing and asks for neither is left as it was, and so is
// a STORE before CONDSTORE.
func TestCondStoreFlagChangesCarryUID(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 3; i++ {
		e.deliver(fmt.Sprintf("Subject: %d\r\n\r\n%d\r\n", i, i))
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	if u := r.ok(`STORE 1 +FLAGS (\Answered)`); !has(u, `* 1 FETCH (FLAGS (\Answered`) {
		t.Errorf("STORE before CONDSTORE: %q", u)
	}
	r.ok("ENABLE CONDSTORE")
	for _, c := range []struct{ cmd, want string }{
		{`STORE 1 +FLAGS (\Flagged)`, `* 1 FETCH (UID 1 FLAGS (\Answered \Flagged`},
		{`STORE 2 +FLAGS.SILENT (\Draft)`, `* 2 FETCH (UID 2 MODSEQ (`},
		{`UID STORE 3 +FLAGS (\Answered)`, `* 3 FETCH (UID 3 FLAGS (\Answered`},
		{"FETCH 2 (BODY[TEXT])", `* 2 FETCH (UID 2 FLAGS (\Draft \Seen`},
		{`STORE 1 (UNCHANGEDSINCE 99) -FLAGS (\Answered)`, `* 1 FETCH (UID 1 FLAGS (\Flagged`},
		{"FETCH 1 (FLAGS)", `* 1 FETCH (FLAGS (\Flagged`},
		{"FETCH 3 (BODY.PEEK[TEXT])", `* 3 FETCH (BODY[TEXT] {3}`},
	} {
		u := r.ok(c.cmd)
		if len(u) != 1 || !strings.HasPrefix(u[0], c.want) || (!strings.Contains(c.cmd, "PEEK") && !strings.Contains(u[0], " MODSEQ (")) {
			t.Errorf("%s under CONDSTORE: %q, want %s... with MODSEQ", c.cmd, u, c.want)
		}
	}
}

// ENVELOPE keeps an address's obsolete source route as its adl, and
// SEARCH FROM/TO/CC match an address written with comments inside it as
// it reads once parsed (issue 13 item 4).
func TestEnvelopeRouteAndSearchThroughComments(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: Ann <@relay1.example,@relay2.example:ann@example.org>\r\n" +
		"To: <user (the user)@ (a comment) example.org>\r\nCc: plain@example.net\r\nSubject: routed\r\n\r\nx\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	u := r.ok("FETCH 1 ENVELOPE")
	if !has(u, `(("Ann" "@relay1.example,@relay2.example" "ann" "example.org"))`) {
		t.Errorf("ENVELOPE: %q, want the route as the From address's adl", u)
	}
	if !has(u, `((NIL NIL "user" "example.org"))`) {
		t.Errorf("ENVELOPE To: %q", u)
	}
	for _, q := range []string{"TO user@example.org", "FROM ann@example.org", "CC plain@example.net", "TO \"the user\""} {
		if u := r.ok("SEARCH " + q); !has(u, "* SEARCH 1") {
			t.Errorf("SEARCH %s: %q, want message 1", q, u)
		}
	}
	if u := r.ok("SEARCH TO nobody@example.org"); has(u, "* SEARCH 1") {
		t.Errorf("SEARCH TO nobody: %q", u)
	}
}

// ENVELOPE's date is the Date field as written, unfolded (RFC 9051
// §7.5.2; imaptest's fetch-envelope script has a wrong weekday kept): not
// a reformatted parse, which corrected the weekday, dropped a comment and
// gave NIL for a date it could not read. No Date field is NIL.
func TestEnvelopeDateAsWritten(t *testing.T) {
	e := newEnv(t)
	for _, d := range []string{"Date: Sat, 01 Feb 2007 01:02:03 +0200\r\n", "Date: 1 Feb 2007 01:02:03 +0200\r\n  (CET)\r\n",
		"Date: the day after tomorrow\r\n", ""} {
		e.deliver(d + "From: a@example.org\r\nSubject: d\r\n\r\nbody\r\n")
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	u := r.ok("FETCH 1:4 (ENVELOPE)")
	for _, want := range []string{`* 1 FETCH (ENVELOPE ("Sat, 01 Feb 2007 01:02:03 +0200" "d" `, `* 2 FETCH (ENVELOPE ("1 Feb 2007 01:02:03 +0200 (CET)" "d" `,
		`* 3 FETCH (ENVELOPE ("the day after tomorrow" "d" `, `* 4 FETCH (ENVELOPE (NIL "d" `} {
		if !has(u, want) {
			t.Errorf("ENVELOPE: %q, want %s...", u, want)
		}
	}
}

// Subscriptions are to names, independent of mailboxes (RFC 9051 §6.3.7,
// RFC 5258; issue 13 item 5): CREATE does not subscribe, DELETE keeps the
// subscription (LIST (SUBSCRIBED) shows it \NonExistent \Subscribed),
// RECURSIVEMATCH gives CHILDINFO, LSUB % shows the \Noselect parent of a
// subscribed child, UNSUBSCRIBE of a name with no mailbox is OK, and a
// name subscribed before it exists is subscribed once made.
func TestSubscriptionsIndependentOfMailboxes(t *testing.T) {
	e := newEnv(t)
	r := e.raw(true)
	r.ok("CREATE Lists/golang")
	if u := r.ok(`LIST (SUBSCRIBED) "" "Lists/*"`); len(u) != 0 {
		t.Errorf("CREATE subscribed: %q", u)
	}
	r.ok("SUBSCRIBE Lists/golang")
	r.ok("DELETE Lists/golang")
	if u := r.ok(`LIST (SUBSCRIBED) "" "Lists/*"`); !has(u, `* LIST (\NonExistent \HasNoChildren \Subscribed) "/" "Lists/golang"`) {
		t.Errorf("a deleted mailbox's subscription: %q, want \\NonExistent \\Subscribed", u)
	}
	if u := r.ok(`LIST "" "Lists/*"`); len(u) != 0 {
		t.Errorf("plain LIST shows a subscription with no mailbox: %q", u)
	}
	if u := r.ok(`LIST (SUBSCRIBED RECURSIVEMATCH) "" "%"`); !strings.Contains(line(u, `"Lists"`), `(CHILDINFO ("SUBSCRIBED"))`) ||
		strings.Contains(line(u, `"Lists"`), `\Subscribed`) {
		t.Errorf("RECURSIVEMATCH: %q, want CHILDINFO for Lists", u)
	}
	if u := r.ok(`LSUB "" "%"`); !strings.Contains(line(u, `"Lists"`), `\Noselect`) {
		t.Errorf(`LSUB "%%": %q, want Lists as a \Noselect parent`, u)
	}
	if u := r.ok(`LSUB "" "Lists/*"`); !has(u, `"Lists/golang"`) || has(u, `\Noselect) "/" "Lists/golang"`) {
		t.Errorf("LSUB of the subscribed name: %q", u)
	}
	if _, st := r.cmd("UNSUBSCRIBE Never/made"); !strings.HasPrefix(st, "OK") {
		t.Errorf("UNSUBSCRIBE of a name with no mailbox: %s, want OK", st)
	}
	r.ok("SUBSCRIBE Later")
	r.ok("CREATE Later")
	if u := r.ok(`LIST (SUBSCRIBED) "" Later`); !has(u, `* LIST (\HasNoChildren \Subscribed) "/" "Later"`) {
		t.Errorf("a name subscribed before CREATE: %q", u)
	}
	r.ok("UNSUBSCRIBE Lists/golang")
	if u := r.ok(`LSUB "" "*"`); has(u, "Lists") {
		t.Errorf("after UNSUBSCRIBE: %q", u)
	}
	// A subscription made before a RENAME brought a mailbox to the name
	// belongs to that mailbox: one UNSUBSCRIBE ends it, and a DELETE
	// after it leaves nothing subscribed.
	r.ok("SUBSCRIBE Target")
	r.ok("CREATE Source")
	r.ok("RENAME Source Target")
	if u := r.ok(`LIST (SUBSCRIBED) "" Target`); !has(u, `\Subscribed) "/" "Target"`) {
		t.Errorf("after RENAME onto a subscribed name: %q", u)
	}
	r.ok("UNSUBSCRIBE Target")
	r.ok("DELETE Target")
	if u := r.ok(`LIST (SUBSCRIBED) "" Target`); len(u) != 0 {
		t.Errorf("an unsubscribed name came back after DELETE: %q", u)
	}
	// The subscriptions are in the profile: they survive a restart.
	r.ok("SUBSCRIBE Gone/soon")
	e.restart()
	r = e.raw(true)
	if u := r.ok(`LSUB "" "Gone/*"`); !has(u, `"Gone/soon"`) {
		t.Errorf("after a restart: %q", u)
	}
}

// A parent is listed for its subscribed descendants (RECURSIVEMATCH's
// CHILDINFO, LSUB's \Noselect) only when one of them is left out by the
// patterns: a descendant the patterns list itself needs no stand-in (RFC
// 5258 §3.5; imaptest's listext script).
func TestRecursiveMatchStandsInOnlyForUnlistedChildren(t *testing.T) {
	e := newEnv(t)
	r := e.raw(true)
	for _, n := range []string{"t/test2/test1", "t/test7/test7", "t/test8/test8", "t/test8/test9"} {
		r.ok("CREATE " + n)
	}
	for _, n := range []string{"t/test2/test1", "t/test7/test7", "t/test8/test8", "t/test8/test9"} {
		r.ok("SUBSCRIBE " + n)
	}
	for _, c := range []struct {
		cmd        string
		want, dont []string
	}{
		{`LIST (SUBSCRIBED RECURSIVEMATCH) "" *test7`, []string{`"t/test7/test7"`}, []string{`"t/test7"`}},
		{`LIST (SUBSCRIBED RECURSIVEMATCH) "" *test8`, []string{`"t/test8" (CHILDINFO ("SUBSCRIBED"))`, `\Subscribed) "/" "t/test8/test8"`}, nil},
		{`LIST (SUBSCRIBED RECURSIVEMATCH) "" (t/test2)`, []string{`"t/test2" (CHILDINFO ("SUBSCRIBED"))`}, []string{`"t/test2/test1"`}},
		{`LIST (SUBSCRIBED RECURSIVEMATCH) "" (t/test2 t/test2/test1)`, []string{`\Subscribed) "/" "t/test2/test1"`}, []string{`"t/test2" (`, `"t/test2"\r`}},
		{`LIST (SUBSCRIBED RECURSIVEMATCH) "" t/test2% RETURN (CHILDREN)`, []string{`* LIST (\HasChildren) "/" "t/test2" (CHILDINFO ("SUBSCRIBED"))`}, nil},
		{`LSUB "" t/%`, []string{`* LSUB (\Noselect \HasChildren) "/" "t/test2"`}, nil},
		{`LSUB "" t/*`, []string{`"t/test2/test1"`}, []string{`"t/test2"`}},
	} {
		u := r.ok(c.cmd)
		all := strings.Join(u, "\r\n") + "\r\n"
		for _, w := range c.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: %q, want %s", c.cmd, u, w)
			}
		}
		for _, d := range c.dont {
			if strings.Contains(all, d) {
				t.Errorf("%s: %q, want no %s", c.cmd, u, d)
			}
		}
	}
}

// PREVIEW (RFC 8970): the start of the first plain text part, else of the
// HTML one without markup, white space collapsed, at most 256 characters,
// "" with no text; PREVIEW (LAZY) is accepted, another modifier is BAD.
func TestPreview(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("word ", 100)
	e.deliver("From: a@example.org\r\nSubject: plain\r\n\r\nHello   there,\r\n\r\nsee you\tsoon.\r\n")
	e.deliver("From: a@example.org\r\nSubject: html\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n" +
		"--b\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment; filename=x.pdf\r\n\r\n%PDF\r\n" +
		"--b\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n" +
		"<html><head><style>p {color: red}</style></head><body><p>Caf=C3=A9 &amp; <b>cr=C3=A8me</b></p><!-- no --></body></html>\r\n--b--\r\n")
	e.deliver("From: a@example.org\r\nSubject: long\r\n\r\n" + long + "\r\n")
	e.deliver("From: a@example.org\r\nSubject: none\r\nContent-Type: image/png\r\n\r\nPNG\r\n")
	r := e.raw(true)
	if u := r.ok("CAPABILITY"); !has(u, "PREVIEW") {
		t.Errorf("PREVIEW not advertised: %q", u)
	}
	r.ok("ENABLE UTF8=ACCEPT")
	r.ok("SELECT INBOX")
	for n, want := range map[int]string{
		1: `PREVIEW "Hello there, see you soon."`,
		2: `PREVIEW "Café & crème"`,
		3: `PREVIEW "` + strings.TrimSpace(long[:256]) + `"`,
		4: `PREVIEW ""`,
	} {
		if u := r.ok(fmt.Sprintf("FETCH %d (PREVIEW)", n)); !has(u, want) {
			t.Errorf("message %d: %q, want %s", n, u, want)
		}
	}
	if u := r.ok("FETCH 1 (UID PREVIEW (LAZY) FLAGS)"); !has(u, `PREVIEW "Hello there, see you soon."`) || !has(u, "FLAGS (") {
		t.Errorf("PREVIEW (LAZY) among other items: %q", u)
	}
	if _, st := r.cmd("FETCH 1 (PREVIEW (EAGER))"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("unknown PREVIEW modifier: %s, want BAD", st)
	}
	if u := r.ok("FETCH 1 PREVIEW"); !has(u, "PREVIEW \"Hello") {
		t.Errorf("FETCH 1 PREVIEW: %q", u)
	}
}

// A message another session expunged is served to a session that still
// numbers it while its replica keeps the body (RFC 2180 §4.1.2, issue 13
// item 7): FETCH answers every message with OK. Once the body is swept
// (mailbox.ExpungedBodyGrace), the others are answered and the command
// ends NO [EXPUNGEISSUED] (§4.1.3); STORE and COPY of it skip it with OK.
func TestExpungedMessageServedWhileSeen(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: a@example.org\r\nSubject: one\r\n\r\nbody one\r\n")
	e.deliver("From: a@example.org\r\nSubject: two\r\n\r\nbody two\r\n")
	a, b := e.raw(true), e.raw(true)
	a.ok("SELECT INBOX")
	b.ok("SELECT INBOX")
	b.ok(`STORE 1 +FLAGS (\Deleted)`)
	b.ok("EXPUNGE")
	u, st := a.cmd("FETCH 1:2 (BODY.PEEK[])")
	if !strings.HasPrefix(st, "OK") || !has(u, "body one") || !has(u, "body two") {
		t.Errorf("FETCH of an expunged message still seen: %q %s, want both bodies and OK", u, st)
	}
	if _, st := a.cmd(`STORE 1:2 +FLAGS (\Seen)`); !strings.HasPrefix(st, "OK") {
		t.Errorf("STORE: %s", st)
	}
	n, err := e.core.Boxes.SweepExpunged(time.Now().Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d bodies, %v; want 1", n, err)
	}
	u, st = a.cmd("FETCH 1:2 (BODY.PEEK[])")
	if !strings.HasPrefix(st, "NO [EXPUNGEISSUED]") || !has(u, "body two") || has(u, "body one") {
		t.Errorf("FETCH after the sweep: %q %s, want the other message and NO [EXPUNGEISSUED]", u, st)
	}
	// COPY skips it, and after it (a command that may) the EXPUNGE goes out.
	if u, st := a.cmd("COPY 1:2 Trash"); !strings.HasPrefix(st, "OK") || !has(u, "* 1 EXPUNGE") {
		t.Errorf("COPY: %q %s, want OK and the EXPUNGE", u, st)
	}
	if n, err := e.core.Boxes.SweepExpunged(time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("second sweep: %d, %v", n, err)
	}
}

// Hostile HTML (bytes that grow when lower-cased, unclosed tags) makes a
// preview without a panic.
func TestPreviewOfHostileHTML(t *testing.T) {
	for _, h := range []string{"<\xff\xff\xff\xff\xff>x", `<a title="ȺȺȺȺȺȺ">text</a>`, "<STYLE>x</Style>after", "<!-- open", "<script>"} {
		raw := "Content-Type: text/html\r\n\r\n" + h + "\r\n"
		_ = preview([]byte(raw))
	}
	if got := preview([]byte("Content-Type: text/html\r\n\r\n<STYLE>x</Style>after <B>bold</b>\r\n")); got != "after bold" {
		t.Errorf("preview %q", got)
	}
}

// A FETCH ending in a bare LF after PREVIEW is answered (the modifier
// check does not wait for bytes the client never sends), and an empty
// PREVIEW modifier list is BAD.
func TestPreviewBareLFAndEmptyModifiers(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: a@example.org\r\nSubject: p\r\n\r\nshort text\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	r.tag++
	tag := fmt.Sprintf("t%d", r.tag)
	fmt.Fprintf(r.c, "%s FETCH 1 PREVIEW\n", tag)
	if u, st := r.until(tag); !strings.HasPrefix(st, "OK") || !has(u, `PREVIEW "short text"`) {
		t.Errorf("FETCH 1 PREVIEW with a bare LF: %q %s", u, st)
	}
	if _, st := r.cmd("FETCH 1 (PREVIEW ())"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("PREVIEW (): %s, want BAD", st)
	}
}

// A FETCH of several bodies (not .PEEK) sets \Seen on those that lack it
// in one flag change: each of those responses shows the new FLAGS and
// MODSEQ, the message already seen shows none, another session sees them
// all seen, and the session's own change is not reported back to it.
func TestFetchSetsSeenOnEveryMessage(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 3; i++ {
		e.deliver(fmt.Sprintf("From: a@example.org\r\nSubject: m%d\r\n\r\nbody %d\r\n", i, i))
	}
	a, b := e.raw(true), e.raw(true)
	a.ok("ENABLE CONDSTORE")
	a.ok("SELECT INBOX")
	a.ok(`STORE 2 +FLAGS.SILENT (\Seen)`)
	u := a.ok("FETCH 1:3 (BODY[TEXT])")
	for _, want := range []string{"* 1 FETCH (UID 1 FLAGS (\\Seen \\Recent) MODSEQ (", "* 3 FETCH (UID 3 FLAGS (\\Seen \\Recent) MODSEQ ("} {
		if !has(u, want) {
			t.Errorf("FETCH 1:3 BODY[TEXT]: %q, want %q", u, want)
		}
	}
	if has(u, "* 2 FETCH (FLAGS") || !has(u, "* 2 FETCH (BODY[TEXT]") {
		t.Errorf("FETCH 1:3 BODY[TEXT]: %q, want message 2 (already seen) without FLAGS", u)
	}
	if u := a.ok("NOOP"); has(u, "FETCH") {
		t.Errorf("NOOP after the FETCH: %q, want no echo of the session's own change", u)
	}
	b.ok("SELECT INBOX")
	if u := b.ok("SEARCH UNSEEN"); len(u) != 1 || u[0] != "* SEARCH" {
		t.Errorf("another session's SEARCH UNSEEN: %q, want none", u)
	}
	// A message expunged and swept elsewhere is skipped; the other is
	// still served and seen.
	e.deliver("From: a@example.org\r\nSubject: m4\r\n\r\nbody 4\r\n")
	e.deliver("From: a@example.org\r\nSubject: m5\r\n\r\nbody 5\r\n")
	a.ok("NOOP")
	b.ok("NOOP")
	b.ok(`STORE 4 +FLAGS.SILENT (\Deleted)`)
	b.ok("EXPUNGE")
	if _, err := e.core.Boxes.SweepExpunged(time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	u, st := a.cmd("FETCH 4:5 (BODY[TEXT])")
	if !strings.HasPrefix(st, "NO [EXPUNGEISSUED]") || !has(u, "* 5 FETCH (UID 5 FLAGS (\\Seen \\Recent) MODSEQ (") {
		t.Errorf("FETCH 4:5 after 4 was swept: %q %s, want 5 served and seen, NO [EXPUNGEISSUED]", u, st)
	}
}

// A client cut off in the middle of a FETCH of unread bodies finds the
// messages it was not sent whole still unread: the one flag change that
// gave them all \Seen is taken back for those.
func TestFetchCutShortLeavesUnsentUnseen(t *testing.T) {
	e := newEnv(t)
	line := strings.Repeat("0123456789", 9) + "\r\n"
	e.deliver("Subject: big\r\n\r\n" + strings.Repeat(line, 90_000)) // 8 MB
	e.deliver("Subject: small\r\n\r\nsmall\r\n")
	cutShortFetch(t, e, "FETCH 1:2 BODY[]")
	o := e.raw(true)
	o.ok("SELECT INBOX")
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := o.ok("SEARCH UNSEEN")
		if len(u) == 1 && u[0] == "* SEARCH 1 2" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("SEARCH UNSEEN after the cut-short FETCH: %q, want both messages unseen", u)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
