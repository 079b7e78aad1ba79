package imap

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/quillmail/quill/internal/guard"
	"github.com/xdg-go/scram"
)

func TestCapabilityAndID(t *testing.T) {
	e := newEnv(t)
	r := e.raw(false)
	u := r.ok("CAPABILITY")
	for _, c := range []string{"IMAP4rev1", "IMAP4rev2", "AUTH=PLAIN", "LITERAL+", "ID"} {
		if !has(u, " "+c) {
			t.Errorf("pre-login CAPABILITY lacks %s: %q", c, u)
		}
	}
	if u := r.ok(`ID ("name" "test")`); !has(u, `"name" "Quill"`) {
		t.Errorf("ID answer %q", u)
	}
	r.ok("LOGIN " + testUser + " " + testPass)
	u = r.ok("CAPABILITY")
	for _, c := range []string{"IDLE", "UIDPLUS", "MOVE", "SPECIAL-USE", "NAMESPACE", "ENABLE", "CONDSTORE", "LITERAL+", "ID", "UNSELECT"} {
		if !has(u, " "+c) {
			t.Errorf("CAPABILITY lacks %s: %q", c, u)
		}
	}
	if u := r.ok("NAMESPACE"); !has(u, `* NAMESPACE (("" "/")) NIL NIL`) {
		t.Errorf("NAMESPACE %q", u)
	}
}

func TestLoginFailures(t *testing.T) {
	e := newEnv(t)
	r := e.raw(false)
	start := time.Now()
	if _, st := r.cmd("LOGIN " + testUser + " wrong"); !strings.HasPrefix(st, "NO [AUTHENTICATIONFAILED]") {
		t.Fatalf("wrong password: %s", st)
	}
	if time.Since(start) < 10*time.Millisecond {
		t.Errorf("no delay after a failed login")
	}
	if _, st := r.cmd("SELECT INBOX"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("SELECT before login: %s", st)
	}
	// AUTHENTICATE PLAIN with an initial response (SASL-IR) ...
	ir := base64.StdEncoding.EncodeToString([]byte("\x00" + testUser + "\x00" + testPass))
	r.ok("AUTHENTICATE PLAIN " + ir)
	// ... and with a continuation.
	r2 := e.raw(false)
	tag := r2.send("AUTHENTICATE PLAIN")
	if l := r2.line(); !strings.HasPrefix(l, "+") {
		t.Fatalf("no continuation: %q", l)
	}
	fmt.Fprintf(r2.c, "%s\r\n", ir)
	if _, st := r2.until(tag); !strings.HasPrefix(st, "OK") {
		t.Fatalf("AUTHENTICATE: %s", st)
	}
	// Too many failures close the connection.
	r3 := e.raw(false)
	for i := 0; i < maxFailedLogins; i++ {
		r3.cmd("LOGIN " + testUser + " wrong")
	}
	r3.send("LOGIN " + testUser + " " + testPass)
	r3.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if l, _ := r3.r.ReadString('\n'); !strings.HasPrefix(l, "* BYE") {
		t.Errorf("LOGIN after %d failures: %q", maxFailedLogins, l)
	}
	if _, err := r3.r.ReadString('\n'); err == nil {
		t.Errorf("connection still open after %d failed logins", maxFailedLogins)
	}
}

func TestListSpecialUse(t *testing.T) {
	e := newEnv(t)
	c := e.client(nil)
	list, err := c.List("", "*", &imap.ListOptions{ReturnSpecialUse: true}).Collect()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]imap.MailboxAttr{"Sent": imap.MailboxAttrSent, "Drafts": imap.MailboxAttrDrafts,
		"Trash": imap.MailboxAttrTrash, "Junk": imap.MailboxAttrJunk, "Archive": imap.MailboxAttrArchive, "INBOX": ""}
	got := map[string]bool{}
	for _, l := range list {
		got[l.Mailbox] = true
		w, ok := want[l.Mailbox]
		if !ok {
			t.Errorf("unexpected mailbox %q", l.Mailbox)
			continue
		}
		if w != "" && !hasAttr(l.Attrs, w) {
			t.Errorf("%s: attrs %v lack %s", l.Mailbox, l.Attrs, w)
		}
		if l.Delim != '/' {
			t.Errorf("%s: delimiter %q", l.Mailbox, l.Delim)
		}
	}
	for n := range want {
		if !got[n] {
			t.Errorf("LIST lacks %s", n)
		}
	}
	// SPECIAL-USE selection option (RFC 6154 §3).
	list, err = c.List("", "*", &imap.ListOptions{SelectSpecialUse: true}).Collect()
	if err != nil || len(list) != 5 {
		t.Errorf("LIST (SPECIAL-USE): %d mailboxes, %v", len(list), err)
	}
	// The delimiter query.
	r := e.raw(true)
	if u := r.ok(`LIST "" ""`); !has(u, `* LIST (\Noselect) "/" ""`) {
		t.Errorf(`LIST "" "": %q`, u)
	}
}

func hasAttr(attrs []imap.MailboxAttr, a imap.MailboxAttr) bool {
	for _, x := range attrs {
		if strings.EqualFold(string(x), string(a)) {
			return true
		}
	}
	return false
}

func TestCreateRenameDeleteHierarchy(t *testing.T) {
	e := newEnv(t)
	r := e.raw(true)
	r.ok("CREATE Projects/2026/Q1")
	u := r.ok(`LIST "" Projects/%`)
	if !has(u, `"Projects/2026"`) || has(u, "Q1") {
		t.Errorf("LIST Projects/%%: %q", u)
	}
	u = r.ok(`LIST "" *`)
	for _, n := range []string{`(\HasChildren) "/" "Projects"`, `(\HasChildren) "/" "Projects/2026"`, `(\HasNoChildren) "/" "Projects/2026/Q1"`} {
		if !has(u, n) {
			t.Errorf("LIST * lacks %s: %q", n, u)
		}
	}
	if _, st := r.cmd("CREATE Projects"); !strings.HasPrefix(st, "NO [ALREADYEXISTS]") {
		t.Errorf("CREATE existing: %s", st)
	}
	if _, st := r.cmd("CREATE INBOX"); !strings.HasPrefix(st, "NO") {
		t.Errorf("CREATE INBOX: %s", st)
	}
	r.ok(`APPEND Projects/2026/Q1 {11}` + "\r\n" + "Subject: x\r\n")
	r.ok("RENAME Projects Work")
	u = r.ok(`LIST "" *`)
	if has(u, "Projects") || !has(u, `"Work/2026/Q1"`) {
		t.Errorf("after RENAME: %q", u)
	}
	if u := r.ok(`STATUS Work/2026/Q1 (MESSAGES)`); !has(u, "MESSAGES 1") {
		t.Errorf("messages did not follow the rename: %q", u)
	}
	// Deleting a parent leaves its children; the parent becomes a name only.
	r.ok("DELETE Work")
	u = r.ok(`LIST "" %`)
	if !has(u, `(\NonExistent \Noselect \HasChildren) "/" "Work"`) {
		t.Errorf("implied parent after DELETE: %q", u)
	}
	if _, st := r.cmd("DELETE INBOX"); !strings.HasPrefix(st, "NO") {
		t.Errorf("DELETE INBOX: %s", st)
	}
	if _, st := r.cmd("DELETE Nope"); !strings.HasPrefix(st, "NO [NONEXISTENT]") {
		t.Errorf("DELETE missing: %s", st)
	}
	r.ok("UNSUBSCRIBE Work/2026/Q1")
	u = r.ok(`LSUB "" *`)
	if has(u, "Q1") || !has(u, "INBOX") {
		t.Errorf("LSUB: %q", u)
	}
	r.ok("SUBSCRIBE Work/2026/Q1")
	if u := r.ok(`LSUB "" *`); !has(u, "Q1") {
		t.Errorf("LSUB after SUBSCRIBE: %q", u)
	}
	r.ok("UNSUBSCRIBE Work/2026")
	if u := r.ok(`LSUB "" Work/%`); len(u) != 1 || !has(u, `\Noselect`) || !has(u, `"Work/2026"`) {
		t.Errorf("LSUB of an unsubscribed parent: %q", u)
	}
}

// A message with 8-bit text, a long line, a dot line and no final CRLF.
var exactMsg = "From: \"Ann\" <ann@example.org>\r\nTo: u@example.org\r\nSubject: =?utf-8?q?caf=C3=A9?=\r\n" +
	"Date: Mon, 02 Mar 2026 10:00:00 +0100\r\nMessage-ID: <m1@example.org>\r\n\r\n" +
	".dot\r\n\xc3\xa9t\xc3\xa9\r\n" + strings.Repeat("x", 2000) + "\r\nend"

func TestAppendFetchExact(t *testing.T) {
	e := newEnv(t)
	c := e.client(nil)
	date := time.Date(2026, 3, 2, 9, 30, 0, 0, time.FixedZone("", 3600))
	ac := c.Append("INBOX", int64(len(exactMsg)), &imap.AppendOptions{Flags: []imap.Flag{imap.FlagFlagged, "$Label1"}, Time: date})
	ac.Write([]byte(exactMsg))
	ac.Close()
	ad, err := ac.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if ad.UID != 1 || ad.UIDValidity == 0 {
		t.Fatalf("APPENDUID %+v", ad)
	}
	sd, err := c.Select("INBOX", nil).Wait()
	if err != nil {
		t.Fatal(err)
	}
	if sd.UIDValidity != ad.UIDValidity || sd.NumMessages != 1 {
		t.Fatalf("select %+v", sd)
	}
	hdrEnd := strings.Index(exactMsg, "\r\n\r\n") + 4
	sections := []*imap.FetchItemBodySection{
		{Peek: true},
		{Specifier: imap.PartSpecifierHeader, Peek: true},
		{Specifier: imap.PartSpecifierText, Peek: true},
		{Peek: true, Partial: &imap.SectionPartial{Offset: 3, Size: 5}},
		{Peek: true, Partial: &imap.SectionPartial{Offset: 100000, Size: 5}},
	}
	want := [][]byte{[]byte(exactMsg), []byte(exactMsg[:hdrEnd]), []byte(exactMsg[hdrEnd:]), []byte(exactMsg[3:8]), {}}
	msgs, err := c.Fetch(imap.UIDSetNum(1), &imap.FetchOptions{UID: true, Flags: true, RFC822Size: true, InternalDate: true, BodySection: sections}).Collect()
	if err != nil || len(msgs) != 1 {
		t.Fatal(len(msgs), err)
	}
	m := msgs[0]
	for i, s := range sections {
		if got := m.FindBodySection(s); !bytes.Equal(got, want[i]) {
			t.Errorf("section %d: got %q want %q", i, trunc(got), trunc(want[i]))
		}
	}
	if m.RFC822Size != int64(len(exactMsg)) {
		t.Errorf("RFC822.SIZE %d want %d", m.RFC822Size, len(exactMsg))
	}
	if !m.InternalDate.Equal(date) {
		t.Errorf("INTERNALDATE %v want %v", m.InternalDate, date)
	}
	if !hasFlag(m.Flags, imap.FlagFlagged) || !hasFlag(m.Flags, "$Label1") || hasFlag(m.Flags, imap.FlagSeen) {
		t.Errorf("flags %v", m.Flags)
	}
	// A non-peek fetch sets \Seen and reports it.
	msgs, err = c.Fetch(imap.SeqSetNum(1), &imap.FetchOptions{BodySection: []*imap.FetchItemBodySection{{Specifier: imap.PartSpecifierText}}}).Collect()
	if err != nil || !hasFlag(msgs[0].Flags, imap.FlagSeen) {
		t.Errorf("BODY[TEXT] did not set \\Seen: %v %v", msgs[0].Flags, err)
	}
	// APPEND to a missing mailbox asks the client to create it.
	r := e.raw(true)
	if _, st := r.cmd("APPEND Nope {1+}\r\nx"); !strings.HasPrefix(st, "NO [TRYCREATE]") {
		t.Errorf("APPEND to missing mailbox: %s", st)
	}
}

func trunc(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "..."
	}
	return string(b)
}

func hasFlag(flags []imap.Flag, f imap.Flag) bool {
	for _, g := range flags {
		if strings.EqualFold(string(g), string(f)) {
			return true
		}
	}
	return false
}

const multipartMsg = "From: Bob <bob@example.org>\r\nTo: Ann <ann@example.org>, team: x@y.org, z@y.org;\r\n" +
	"Cc: carol@example.org\r\nSubject: report\r\nDate: Tue, 03 Mar 2026 08:00:00 +0000\r\n" +
	"Message-ID: <r1@example.org>\r\nIn-Reply-To: <q1@example.org>\r\nMIME-Version: 1.0\r\n" +
	"Content-Type: multipart/mixed; boundary=\"XX\"\r\n\r\n" +
	"preamble\r\n--XX\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n" +
	"caf=C3=A9 numbers 42\r\n--XX\r\nContent-Type: application/pdf; name=\"r.pdf\"\r\n" +
	"Content-Disposition: attachment; filename=\"r.pdf\"\r\nContent-Transfer-Encoding: base64\r\n\r\n" +
	"JVBERi0xLjQK\r\n--XX\r\nContent-Type: message/rfc822\r\n\r\nSubject: inner\r\nFrom: i@example.org\r\n\r\ninner body\r\n" +
	"--XX--\r\nepilogue\r\n"

func TestBodyStructureEnvelopeSections(t *testing.T) {
	e := newEnv(t)
	e.deliver(multipartMsg)
	r := e.raw(true)
	r.ok("SELECT INBOX")
	u := r.ok("FETCH 1 (ENVELOPE BODYSTRUCTURE)")
	wantEnv := `ENVELOPE ("Tue, 03 Mar 2026 08:00:00 +0000" "report" (("Bob" NIL "bob" "example.org")) (("Bob" NIL "bob" "example.org")) (("Bob" NIL "bob" "example.org")) (("Ann" NIL "ann" "example.org")`
	if !has(u, wantEnv) {
		t.Errorf("ENVELOPE: %q\nwant prefix %s", u, wantEnv)
	}
	if !has(u, `"<q1@example.org>" "<r1@example.org>")`) {
		t.Errorf("ENVELOPE in-reply-to/message-id: %q", u)
	}
	wantBS := `BODYSTRUCTURE (("text" "plain" ("charset" "utf-8") NIL NIL "quoted-printable" 20 1 NIL NIL NIL NIL)` +
		`("application" "pdf" ("name" "r.pdf") NIL NIL "base64" 12 NIL ("attachment" ("filename" "r.pdf")) NIL NIL)` +
		`("message" "rfc822" NIL NIL NIL "7bit" 49 (NIL "inner" ((NIL NIL "i" "example.org"))`
	if !has(u, wantBS) {
		t.Errorf("BODYSTRUCTURE: %q\nwant %s", u, wantBS)
	}
	if !has(u, `("text" "plain" ("charset" "us-ascii") NIL NIL "7bit" 10 1 NIL NIL NIL NIL) 4 NIL NIL NIL NIL) "mixed" ("boundary" "XX") NIL NIL NIL)`) {
		t.Errorf("multipart extension data: %q", u)
	}
	for sec, want := range map[string]string{
		"BODY.PEEK[1]":                          "caf=C3=A9 numbers 42",
		"BODY.PEEK[1.MIME]":                     "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n",
		"BODY.PEEK[2]":                          "JVBERi0xLjQK",
		"BODY.PEEK[3.HEADER]":                   "Subject: inner\r\nFrom: i@example.org\r\n\r\n",
		"BODY.PEEK[3.TEXT]":                     "inner body",
		"BINARY.PEEK[1]":                        "café numbers 42",
		"BODY.PEEK[HEADER.FIELDS (Subject cc)]": "Cc: carol@example.org\r\nSubject: report\r\n\r\n",
	} {
		u := r.ok("FETCH 1 (" + sec + ")")
		if !has(u, want) {
			t.Errorf("%s: %q, want %q", sec, u, want)
		}
	}
	if u := r.ok("FETCH 1 (BODY[4])"); has(u, "inner") {
		t.Errorf("missing part 4: %q", u)
	}
}

func TestSearchKeys(t *testing.T) {
	e := newEnv(t)
	msgs := []string{
		"From: alice@example.org\r\nTo: bob@example.org\r\nSubject: lunch plans\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\nX-Tag: red\r\n\r\nLet us eat pizza.\r\n",
		"From: carol@example.org\r\nTo: dave@example.org\r\nCc: alice@example.org\r\nSubject: =?utf-8?q?r=C3=A9sum=C3=A9?=\r\nDate: Wed, 04 Mar 2026 10:00:00 +0000\r\n\r\n" + strings.Repeat("long text ", 200) + "\r\n",
		"From: eve@example.org\r\nTo: bob@example.org\r\nSubject: pizza\r\nDate: Fri, 06 Mar 2026 10:00:00 +0000\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n" + base64.StdEncoding.EncodeToString([]byte("secret word: banana")) + "\r\n",
	}
	dates := []time.Time{
		time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 6, 12, 0, 0, 0, time.UTC),
	}
	for i, m := range msgs {
		if _, _, err := e.store.Append(context.Background(), testUser, "INBOX", []byte(m), nil, dates[i]); err != nil {
			t.Fatal(err)
		}
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	r.ok(`STORE 1 +FLAGS (\Seen \Flagged)`)
	r.ok(`STORE 2 +FLAGS ($Work)`)
	r.ok(`STORE 3 +FLAGS (\Deleted \Answered \Draft)`)
	cases := []struct{ q, want string }{
		{"ALL", "1 2 3"},
		{"SEEN", "1"},
		{"UNSEEN", "2 3"},
		{"FLAGGED", "1"},
		{"UNFLAGGED", "2 3"},
		{"DELETED", "3"},
		{"UNDELETED", "1 2"},
		{"ANSWERED", "3"},
		{"DRAFT", "3"},
		{"UNDRAFT", "1 2"},
		{"KEYWORD $Work", "2"},
		{"UNKEYWORD $Work", "1 3"},
		{"RECENT", "1 2 3"},
		{"NEW", "2 3"},
		{"OLD", ""},
		{"FROM alice", "1"},
		{"FROM ALICE@EXAMPLE", "1"},
		{"TO bob", "1 3"},
		{"CC alice", "2"},
		{"BCC alice", ""},
		{"SUBJECT pizza", "3"},
		{"SUBJECT résumé", "2"},
		{`HEADER X-Tag red`, "1"},
		{`HEADER X-Tag ""`, "1"},
		{"BODY pizza", "1"},
		{"BODY banana", "3"},
		{"TEXT pizza", "1 3"},
		{"TEXT carol", "2"},
		{"LARGER 1000", "2"},
		{"SMALLER 1000", "1 3"},
		{"SMALLER 0", ""},
		{"BEFORE 4-Mar-2026", "1"},
		{"ON 4-Mar-2026", "2"},
		{"SINCE 4-Mar-2026", "2 3"},
		{"SENTBEFORE 4-Mar-2026", "1"},
		{"SENTON 6-Mar-2026", "3"},
		{"SENTSINCE 3-Mar-2026", "2 3"},
		{"UID 2:*", "2 3"},
		{"UID 9:*", "3"},
		{"2:*", "2 3"},
		{"1,3", "1 3"},
		{"NOT SEEN", "2 3"},
		{"OR SEEN DELETED", "1 3"},
		{"OR FROM alice (TO dave SUBJECT r)", "1 2"},
		{"NOT (OR SEEN DELETED)", "2"},
		{"CHARSET UTF-8 SUBJECT résumé", "2"},
		{"MODSEQ 1", "1 2 3"},
	}
	for _, c := range cases {
		u, st := r.cmd("SEARCH " + c.q)
		if !strings.HasPrefix(st, "OK") {
			t.Errorf("SEARCH %s: %s", c.q, st)
			continue
		}
		got := ""
		for _, l := range u {
			if strings.HasPrefix(l, "* SEARCH") {
				got = strings.TrimSpace(strings.TrimPrefix(l, "* SEARCH"))
				if i := strings.Index(got, " (MODSEQ"); i >= 0 {
					got = got[:i]
				} else if strings.HasPrefix(got, "(MODSEQ") {
					got = ""
				}
			}
		}
		if got != c.want {
			t.Errorf("SEARCH %s = %q, want %q", c.q, got, c.want)
		}
	}
	// UID SEARCH answers UIDs; MODSEQ adds the highest mod-sequence.
	u := r.ok("UID SEARCH MODSEQ 1 FLAGGED")
	if !has(u, "* SEARCH 1 (MODSEQ ") {
		t.Errorf("UID SEARCH MODSEQ: %q", u)
	}
	// ESEARCH and SEARCHRES.
	u = r.ok("SEARCH RETURN (MIN MAX COUNT) UNSEEN")
	if !has(u, "MIN 2 MAX 3 COUNT 2") {
		t.Errorf("ESEARCH: %q", u)
	}
	r.ok("SEARCH RETURN (SAVE) FROM alice")
	if u := r.ok("FETCH $ (UID)"); len(u) != 1 || !has(u, "* 1 FETCH (UID 1)") {
		t.Errorf("FETCH $: %q", u)
	}
	if _, st := r.cmd("SEARCH CHARSET KOI8-R ALL"); !strings.HasPrefix(st, "NO [BADCHARSET") {
		t.Errorf("unknown charset: %s", st)
	}
	if _, st := r.cmd("SEARCH FROB"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("unknown key: %s", st)
	}
}

func TestStoreCondStore(t *testing.T) {
	e := newEnv(t)
	e.deliver("Subject: 1\r\n\r\n1\r\n")
	e.deliver("Subject: 2\r\n\r\n2\r\n")
	r := e.raw(true)
	u := r.ok("SELECT INBOX (CONDSTORE)")
	if !has(u, "[HIGHESTMODSEQ 3]") {
		t.Fatalf("SELECT (CONDSTORE): %q", u)
	}
	u = r.ok("FETCH 1:* (MODSEQ)")
	if !has(u, "* 1 FETCH (MODSEQ (2))") || !has(u, "* 2 FETCH (MODSEQ (3))") {
		t.Fatalf("FETCH MODSEQ: %q", u)
	}
	u = r.ok(`STORE 1 (UNCHANGEDSINCE 2) +FLAGS (\Seen)`)
	if !has(u, `* 1 FETCH (UID 1 FLAGS (\Seen \Recent) MODSEQ (4))`) {
		t.Errorf("conditional STORE: %q", u)
	}
	// Message 1 now has MODSEQ 4 > 2: it fails, message 2 (3 <= 3) passes.
	u, st := r.cmd(`STORE 1:2 (UNCHANGEDSINCE 3) +FLAGS (\Flagged)`)
	if st != "OK [MODIFIED 1] Conditional STORE failed for some messages" || !has(u, "* 2 FETCH") || has(u, "* 1 FETCH") {
		t.Errorf("STORE UNCHANGEDSINCE: %q %s", u, st)
	}
	u, st = r.cmd(`UID STORE 1:2 (UNCHANGEDSINCE 0) -FLAGS (\Flagged)`)
	if st != "OK [MODIFIED 1:2] Conditional STORE failed for some messages" {
		t.Errorf("UNCHANGEDSINCE 0: %q %s", u, st)
	}
	u = r.ok("UID FETCH 1:* (FLAGS) (CHANGEDSINCE 4)")
	if len(u) != 1 || !has(u, "* 2 FETCH (UID 2 FLAGS (\\Flagged \\Recent) MODSEQ (5))") {
		t.Errorf("CHANGEDSINCE: %q", u)
	}
	if u := r.ok("STATUS INBOX (HIGHESTMODSEQ MESSAGES UNSEEN)"); !has(u, "(MESSAGES 2 UNSEEN 1 HIGHESTMODSEQ 5)") {
		t.Errorf("STATUS: %q", u)
	}
	// Sequence numbers past the end are a client error.
	if _, st := r.cmd(`STORE 7 +FLAGS (\Seen)`); !strings.HasPrefix(st, "BAD") {
		t.Errorf("STORE 7: %s", st)
	}
	// STORE .SILENT sends nothing without CONDSTORE.
	r2 := e.raw(true)
	r2.ok("SELECT INBOX")
	if u := r2.ok(`STORE 1 +FLAGS.SILENT (\Answered)`); len(u) != 0 {
		t.Errorf(".SILENT answered %q", u)
	}
}

func TestCopyMoveExpunge(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 4; i++ {
		e.deliver(fmt.Sprintf("Subject: m%d\r\n\r\nbody %d\r\n", i, i))
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	r.ok("CREATE Keep")
	u, st := r.cmd("COPY 1:2 Keep")
	if !strings.HasPrefix(st, "OK [COPYUID ") || !strings.Contains(st, " 1:2 1:2]") {
		t.Errorf("COPY: %q %s", u, st)
	}
	if _, st := r.cmd("COPY 1 Nope"); !strings.HasPrefix(st, "NO [TRYCREATE]") {
		t.Errorf("COPY to missing: %s", st)
	}
	u, st = r.cmd("UID MOVE 3 Keep")
	if !has(u, "* OK [COPYUID ") || !has(u, " 3 3]") || !has(u, "* 3 EXPUNGE") || !strings.HasPrefix(st, "OK") {
		t.Errorf("MOVE: %q %s", u, st)
	}
	// INBOX now holds UIDs 1 2 4; copies keep flags and bytes.
	u = r.ok("UID SEARCH ALL")
	if !has(u, "* SEARCH 1 2 4") {
		t.Errorf("after MOVE: %q", u)
	}
	if u := r.ok(`STATUS Keep (MESSAGES UIDNEXT)`); !has(u, "MESSAGES 3 UIDNEXT 4") {
		t.Errorf("Keep: %q", u)
	}
	r.ok(`STORE 1:3 +FLAGS (\Deleted)`)
	// UID EXPUNGE only removes the named \Deleted messages.
	u = r.ok("UID EXPUNGE 2")
	if len(u) != 1 || u[0] != "* 2 EXPUNGE" {
		t.Errorf("UID EXPUNGE: %q", u)
	}
	u = r.ok("EXPUNGE")
	if len(u) != 2 || u[0] != "* 2 EXPUNGE" || u[1] != "* 1 EXPUNGE" {
		t.Errorf("EXPUNGE: %q", u)
	}
	if u := r.ok("SEARCH ALL"); !has(u, "* SEARCH") || has(u, "1") {
		t.Errorf("after EXPUNGE: %q", u)
	}
	// CLOSE expunges silently; EXAMINE is read-only.
	r.ok("SELECT Keep")
	r.ok(`STORE 1 +FLAGS (\Deleted)`)
	if u := r.ok("CLOSE"); len(u) != 0 {
		t.Errorf("CLOSE sent %q", u)
	}
	u = r.ok("EXAMINE Keep")
	if !has(u, "* 2 EXISTS") {
		t.Errorf("EXAMINE after CLOSE: %q", u)
	}
	if _, st := r.cmd(`STORE 1 +FLAGS (\Seen)`); !strings.HasPrefix(st, "NO") {
		t.Errorf("STORE in EXAMINE: %s", st)
	}
	if u := r.ok("FETCH 1 (BODY[] FLAGS)"); has(u, `\Seen`) {
		t.Errorf("FETCH in EXAMINE set \\Seen: %q", u)
	}
	if _, st := r.cmd("EXPUNGE"); !strings.HasPrefix(st, "NO") {
		t.Errorf("EXPUNGE in EXAMINE: %s", st)
	}
	r.ok("UNSELECT")
	if _, st := r.cmd("FETCH 1 FLAGS"); !strings.HasPrefix(st, "BAD") {
		t.Errorf("FETCH after UNSELECT: %s", st)
	}
}

func TestIdleSeesDelivery(t *testing.T) {
	e := newEnv(t)
	exists := make(chan uint32, 10)
	c := e.client(&imapclient.Options{UnilateralDataHandler: &imapclient.UnilateralDataHandler{
		Mailbox: func(d *imapclient.UnilateralDataMailbox) {
			if d.NumMessages != nil {
				exists <- *d.NumMessages
			}
		},
	}})
	if _, err := c.Select("INBOX", nil).Wait(); err != nil {
		t.Fatal(err)
	}
	idle, err := c.Idle()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	e.deliver("Subject: ping\r\n\r\nping\r\n")
	select {
	case n := <-exists:
		if n != 1 {
			t.Errorf("EXISTS %d", n)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("EXISTS after %v, want < 1s", d)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no EXISTS during IDLE")
	}
	if err := idle.Close(); err != nil {
		t.Fatal(err)
	}
	if err := idle.Wait(); err != nil {
		t.Fatal(err)
	}
}

// Two sessions on one mailbox see each other's changes only where RFC 9051
// §7.5.1 allows, and sequence numbers never shift under a session between
// its commands.
func TestConcurrentSessions(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 3; i++ {
		e.deliver(fmt.Sprintf("Subject: m%d\r\n\r\nbody\r\n", i))
	}
	a, b := e.raw(true), e.raw(true)
	ua := a.ok("SELECT INBOX")
	ub := b.ok("SELECT INBOX")
	// \Recent goes to exactly one session.
	if !has(ua, "* 3 RECENT") || !has(ub, "* 0 RECENT") {
		t.Errorf("RECENT: A %q B %q", ua, ub)
	}
	a.ok(`STORE 2 +FLAGS (\Flagged)`)
	// B learns of the flag change at its next command.
	if u := b.ok("NOOP"); !has(u, `* 2 FETCH (UID 2 FLAGS (\Flagged))`) {
		t.Errorf("B NOOP after A STORE: %q", u)
	}
	a.ok(`STORE 1 +FLAGS (\Deleted)`)
	if u := a.ok("EXPUNGE"); !has(u, "* 1 EXPUNGE") {
		t.Errorf("A EXPUNGE: %q", u)
	}
	// During FETCH, B must not be told of the expunge: message 1 keeps its
	// number, and message 3 is still number 3.
	u := b.ok("FETCH 3 (UID)")
	if has(u, "EXPUNGE") || !has(u, "* 3 FETCH (UID 3)") {
		t.Errorf("B FETCH after A EXPUNGE: %q", u)
	}
	u = b.ok("SEARCH ALL")
	if has(u, "EXPUNGE") {
		t.Errorf("B SEARCH got EXPUNGE: %q", u)
	}
	// B still numbers the expunged message: it is served while its body is
	// kept (RFC 2180 §4.1.2; TestExpungedMessageServedWhileSeen).
	u, st := b.cmd("FETCH 1 (BODY.PEEK[])")
	if !strings.HasPrefix(st, "OK") || !has(u, "Subject: m1") {
		t.Errorf("FETCH of an expunged message: %q %s", u, st)
	}
	// NOOP delivers the EXPUNGE; afterwards numbers are renumbered.
	if u := b.ok("NOOP"); !has(u, "* 1 EXPUNGE") {
		t.Errorf("B NOOP: %q", u)
	}
	if u := b.ok("FETCH 2 (UID)"); !has(u, "* 2 FETCH (UID 3)") {
		t.Errorf("B after renumbering: %q", u)
	}
	// A new message: EXISTS to both, \Recent to the first that sees it.
	e.deliver("Subject: m4\r\n\r\nbody\r\n")
	ub = b.ok("NOOP")
	ua = a.ok("NOOP")
	if !has(ub, "* 3 EXISTS") || !has(ub, "* 1 RECENT") || !has(ua, "* 3 EXISTS") || !has(ua, "* 2 RECENT") {
		t.Errorf("new message: A %q B %q", ua, ub)
	}
	// UID FETCH may carry an EXPUNGE (RFC 9051 §7.5.1).
	a.ok(`STORE 1 +FLAGS (\Deleted)`)
	a.ok("EXPUNGE")
	// The FETCH is answered in the numbering of its start, then the
	// EXPUNGE follows.
	if u := b.ok("UID FETCH 4 (UID)"); len(u) != 2 || u[0] != "* 3 FETCH (UID 4)" || u[1] != "* 1 EXPUNGE" {
		t.Errorf("B UID FETCH: %q", u)
	}
}

func TestRestartKeepsState(t *testing.T) {
	e := newEnv(t)
	e.deliver("Subject: 1\r\n\r\n1\r\n")
	e.deliver("Subject: 2\r\n\r\n2\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	r.ok(`STORE 2 +FLAGS (\Seen $Custom)`)
	r.ok(`STORE 1 +FLAGS (\Deleted)`)
	r.ok("EXPUNGE")
	before := r.ok("UID FETCH 1:* (UID FLAGS)")
	sel := r.ok("EXAMINE INBOX")
	e.restart()
	r = e.raw(true)
	after := r.ok("EXAMINE INBOX")
	for _, k := range []string{"UIDVALIDITY", "UIDNEXT 3", "HIGHESTMODSEQ"} {
		if line(sel, k) != line(after, k) || line(after, k) == "" {
			t.Errorf("%s: before %q after %q", k, line(sel, k), line(after, k))
		}
	}
	if got := r.ok("UID FETCH 1:* (UID FLAGS)"); strings.Join(got, "|") != strings.ReplaceAll(strings.Join(before, "|"), ` \Recent`, "") &&
		strings.Join(got, "|") != strings.Join(before, "|") {
		t.Errorf("after restart %q, before %q", got, before)
	}
	// New mail after the restart gets a new UID, never a reused one.
	e.deliver("Subject: 3\r\n\r\n3\r\n")
	r.ok("NOOP")
	if u := r.ok("UID SEARCH ALL"); !has(u, "* SEARCH 2 3") {
		t.Errorf("UIDs after restart: %q", u)
	}
}

func line(lines []string, sub string) string {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	r := e.raw(true)
	// Malformed lines get BAD and the session goes on.
	for _, l := range []string{"", "x", "a1 FETCH", "a2 FETCH x FLAGS", "a3 STORE 1 FLAGS", "a4 SELECT", "a5 SEARCH (", "a6 UID FROB 1"} {
		fmt.Fprintf(r.c, "%s\r\n", l)
		if got := r.line(); !strings.Contains(got, "BAD") {
			t.Errorf("%q answered %q", l, got)
		}
	}
	r.ok("NOOP")
	// A literal over the limit is refused with its reason; a
	// non-synchronizing one is read and dropped, not run as commands.
	big := strings.Repeat("A", 70*1024)
	_, st := r.cmd(fmt.Sprintf("LOGIN {%d+}\r\n%s x", len(big), big))
	if !strings.Contains(st, "TOOBIG") && !strings.HasPrefix(st, "BAD") && !strings.HasPrefix(st, "NO") {
		t.Errorf("huge literal: %s", st)
	}
	r.ok("NOOP")
	// A line over the command limit ends the session.
	fmt.Fprintf(r.c, "a7 SEARCH %s\r\n", strings.Repeat("1,", 40*1024))
	r.c.SetReadDeadline(time.Now().Add(3 * time.Second))
	var all []string
	for {
		l, err := r.r.ReadString('\n')
		if err != nil {
			break
		}
		all = append(all, l)
	}
	if !has(all, "BYE") {
		t.Errorf("overlong line: %q", all)
	}
	// The server still serves others.
	r2 := e.raw(true)
	r2.ok("SELECT INBOX")
}

func TestManySessionsConcurrently(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := imapclient.DialInsecure(e.addr, nil)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			if err := c.Login(testUser, testPass).Wait(); err != nil {
				t.Error(err)
				return
			}
			for j := 0; j < 5; j++ {
				msg := fmt.Sprintf("Subject: %d-%d\r\n\r\nx\r\n", i, j)
				ac := c.Append("INBOX", int64(len(msg)), nil)
				ac.Write([]byte(msg))
				ac.Close()
				if _, err := ac.Wait(); err != nil {
					t.Error(err)
				}
				if _, err := c.Select("INBOX", nil).Wait(); err != nil {
					t.Error(err)
				}
				if err := c.Noop().Wait(); err != nil {
					t.Error(err)
				}
			}
		}(i)
	}
	wg.Wait()
	r := e.raw(true)
	if u := r.ok("STATUS INBOX (MESSAGES UIDNEXT)"); !has(u, "MESSAGES 40 UIDNEXT 41") {
		t.Errorf("after concurrent APPENDs: %q", u)
	}
}

func TestIMAP4rev2Enabled(t *testing.T) {
	e := newEnv(t)
	e.deliver("Subject: a\r\n\r\na\r\n")
	r := e.raw(true)
	if u := r.ok("ENABLE IMAP4rev2"); !has(u, "* ENABLED IMAP4rev2") {
		t.Fatalf("ENABLE: %q", u)
	}
	u := r.ok("SELECT INBOX")
	if has(u, "RECENT") || !has(u, `* LIST () "/" INBOX`) {
		t.Errorf("rev2 SELECT: %q", u)
	}
	if u := r.ok("FETCH 1 FLAGS"); has(u, `\Recent`) {
		t.Errorf("rev2 FETCH: %q", u)
	}
	if u := r.ok("SEARCH ALL"); !has(u, "* ESEARCH") || !has(u, "ALL 1") {
		t.Errorf("rev2 SEARCH: %q", u)
	}
}

// TestAuthenticateMechanisms runs AUTHENTICATE LOGIN and SCRAM-SHA-256
// (RFC 7677) as a client would, and the failures each can end in.
func TestAuthenticateMechanisms(t *testing.T) {
	e := newEnv(t)
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	// challenge reads a continuation request and decodes it.
	challenge := func(r *raw) string {
		t.Helper()
		l := r.line()
		text, ok := strings.CutPrefix(l, "+ ")
		if !ok && l != "+" {
			t.Fatalf("want a continuation, got %q", l)
		}
		b, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			t.Fatalf("continuation %q: %v", l, err)
		}
		return string(b)
	}
	r := e.raw(false)
	caps := strings.Join(r.ok("CAPABILITY"), " ")
	for _, m := range []string{"AUTH=SCRAM-SHA-256", "AUTH=PLAIN", "AUTH=LOGIN"} {
		if !strings.Contains(caps, m) {
			t.Errorf("CAPABILITY lacks %s: %s", m, caps)
		}
	}

	t.Run("LOGIN", func(t *testing.T) {
		r := e.raw(false)
		tag := r.send("AUTHENTICATE LOGIN")
		if got := challenge(r); got != "Username:" {
			t.Fatalf("first challenge %q", got)
		}
		fmt.Fprintf(r.c, "%s\r\n", b64(testUser))
		if got := challenge(r); got != "Password:" {
			t.Fatalf("second challenge %q", got)
		}
		fmt.Fprintf(r.c, "%s\r\n", b64(testPass))
		if _, st := r.until(tag); !strings.HasPrefix(st, "OK") {
			t.Fatalf("AUTHENTICATE LOGIN: %s", st)
		}
		r.ok("SELECT INBOX")
	})
	t.Run("empty challenge", func(t *testing.T) {
		r := e.raw(false)
		tag := r.send("AUTHENTICATE PLAIN")
		if l := r.line(); l != "+ " && l != "+" {
			t.Fatalf("empty challenge sent as %q, want \"+ \"", l)
		}
		fmt.Fprintf(r.c, "*\r\n")
		if _, st := r.until(tag); !strings.HasPrefix(st, "BAD") {
			t.Fatalf("cancelled AUTHENTICATE: %s", st)
		}
	})
	scramLogin := func(t *testing.T, user, pass string) (status string) {
		r := e.raw(false)
		cl, err := scram.SHA256.NewClient(user, pass, "")
		if err != nil {
			t.Fatal(err)
		}
		conv := cl.NewConversation()
		first, _ := conv.Step("")
		tag := r.send("AUTHENTICATE SCRAM-SHA-256 " + b64(first))
		final, err := conv.Step(challenge(r))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(r.c, "%s\r\n", b64(final))
		l := r.line()
		if strings.HasPrefix(l, tag+" ") {
			return l[len(tag)+1:]
		}
		text, _ := strings.CutPrefix(l, "+ ")
		serverFinal, _ := base64.StdEncoding.DecodeString(text)
		if _, err := conv.Step(string(serverFinal)); err != nil || !conv.Valid() {
			t.Fatalf("server-final %q does not prove the server has the keys: %v", serverFinal, err)
		}
		fmt.Fprintf(r.c, "\r\n")
		_, st := r.until(tag)
		if strings.HasPrefix(st, "OK") {
			r.ok("SELECT INBOX")
		}
		return st
	}
	t.Run("SCRAM-SHA-256", func(t *testing.T) {
		if st := scramLogin(t, testUser, testPass); !strings.HasPrefix(st, "OK") {
			t.Fatalf("SCRAM login: %s", st)
		}
	})
	t.Run("SCRAM wrong password", func(t *testing.T) {
		if st := scramLogin(t, testUser, "wrong"); !strings.HasPrefix(st, "NO [AUTHENTICATIONFAILED]") {
			t.Fatalf("SCRAM with a wrong password: %s", st)
		}
	})
	t.Run("SCRAM unknown user", func(t *testing.T) {
		if st := scramLogin(t, "nobody@example.org", testPass); !strings.HasPrefix(st, "NO [AUTHENTICATIONFAILED]") {
			t.Fatalf("SCRAM for an unknown user: %s", st)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		r := e.raw(false)
		if _, st := r.cmd("AUTHENTICATE SCRAM-SHA-256 " + b64("x,,n=u,r=abc")); !strings.HasPrefix(st, "BAD") {
			t.Errorf("malformed client-first: %s", st)
		}
		if _, st := r.cmd("AUTHENTICATE PLAIN " + b64("only-one-field")); !strings.HasPrefix(st, "BAD") {
			t.Errorf("malformed PLAIN: %s", st)
		}
		if _, st := r.cmd("AUTHENTICATE CRAM-MD5"); !strings.HasPrefix(st, "NO") || !strings.Contains(st, "SCRAM-SHA-256") {
			t.Errorf("unsupported mechanism: %s", st)
		}
		if _, st := r.cmd("AUTHENTICATE PLAIN " + b64("someone\x00"+testUser+"\x00"+testPass)); !strings.HasPrefix(st, "NO [AUTHENTICATIONFAILED]") {
			t.Errorf("PLAIN acting as another user: %s", st)
		}
		r.ok("LOGIN " + testUser + " " + testPass) // the connection still serves
	})
}

// TestSCRAMFromALockedOutAddress: an address locked out gets no SCRAM
// exchange at all, so it cannot learn from the server's answer to a proof
// whether a guess was right.
func TestSCRAMFromALockedOutAddress(t *testing.T) {
	e := &env{t: t, dir: t.TempDir(), configure: func(c *Config) {
		c.Logins = guard.New(guard.Limits{LockoutAfter: 1, LockoutFor: time.Minute, AuthFailDelay: time.Millisecond,
			AuthMaxDelay: time.Millisecond}, nil)
	}}
	e.open()
	r := e.raw(false)
	if _, st := r.cmd("LOGIN " + testUser + " wrong"); !strings.HasPrefix(st, "NO [AUTHENTICATIONFAILED]") {
		t.Fatalf("wrong password: %s", st)
	}
	cl, _ := scram.SHA256.NewClient(testUser, testPass, "")
	first, _ := cl.NewConversation().Step("")
	_, st := r.cmd("AUTHENTICATE SCRAM-SHA-256 " + base64.StdEncoding.EncodeToString([]byte(first)))
	if !strings.HasPrefix(st, "NO [UNAVAILABLE]") {
		t.Fatalf("SCRAM from a locked-out address: %s (want NO [UNAVAILABLE] before any challenge)", st)
	}
}

// A client that goes away in the middle of a FETCH's literal does not
// leave its session stuck: the failed response is ended, so the tagged
// answer (which cannot be sent) does not wait for it, and the session
// ends, which a server shutdown then finds at once.
func TestFetchCutShortEndsTheSession(t *testing.T) {
	e := newEnv(t)
	line := strings.Repeat("0123456789", 9) + "\r\n"
	e.deliver("Subject: big\r\n\r\n" + strings.Repeat(line, 200_000)) // 18 MB
	cutShortFetch(t, e, "FETCH 1 BODY.PEEK[]")
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	e.srv.Shutdown(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown waited %v for the session whose FETCH was cut short", took.Round(time.Millisecond))
	}
}

// cutShortFetch logs in on a connection with a tiny receive buffer, sends
// the FETCH, waits for the first response to start, and resets the
// connection, as a client that crashed mid-answer.
func cutShortFetch(t *testing.T, e *env, fetch string) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	r.ReadString('\n')
	fmt.Fprintf(c, "a LOGIN %s %s\r\nb SELECT INBOX\r\nc %s\r\n", testUser, testPass, fetch)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(l, "* 1 FETCH") {
			break
		}
	}
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}
