package imap

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/proxy"
)

// appendUID reads the APPENDUID response code of a tagged OK.
var appendUID = regexp.MustCompile(`^OK \[APPENDUID (\d+) ([0-9:,]+)\]`)

// TestMultiAppend drives MULTIAPPEND (RFC 3502): several messages in one
// APPEND, with their own flags and dates, sent with synchronizing and
// non-synchronizing literals; APPENDUID gives their UIDs in order; another
// session sees none of them until all are stored; a failure partway
// leaves the mailbox as it was; a refused message keeps the command line
// in step.
func TestMultiAppend(t *testing.T) {
	e := newEnv(t)
	r := e.raw(true)
	caps := strings.Join(r.ok("CAPABILITY"), " ")
	if !strings.Contains(caps, " MULTIAPPEND") || !strings.Contains(caps, " CATENATE") {
		t.Fatalf("CAPABILITY lacks MULTIAPPEND or CATENATE: %s", caps)
	}
	other := e.raw(true)
	other.ok("SELECT INBOX")

	msg := func(i int) string { return fmt.Sprintf("Subject: m%d\r\n\r\nbody %d\r\n", i, i) }
	m1, m2, m3 := msg(1), msg(2), msg(3)
	tag := r.send(fmt.Sprintf("APPEND INBOX (\\Seen) {%d+}\r\n%s (\\Flagged $Work) \"01-Feb-2024 10:00:00 +0000\" {%d+}\r\n%s {%d+}\r\n%s",
		len(m1), m1, len(m2), m2, len(m3), m3))
	_, st := r.until(tag)
	got := appendUID.FindStringSubmatch(st)
	if got == nil || got[2] != "2:4" && got[2] != "1:3" {
		t.Fatalf("MULTIAPPEND: %s", st)
	}
	u := other.ok("NOOP")
	if !has(u, "* 3 EXISTS") {
		t.Fatalf("the other session after MULTIAPPEND: %q", u)
	}
	f := strings.Join(other.ok("FETCH 1:3 (FLAGS INTERNALDATE BODY.PEEK[])"), "\n")
	for _, want := range []string{`FLAGS (\Seen`, `FLAGS (\Flagged $Work`, `1-Feb-2024 10:00:00 +0000`, m1, m2, m3} {
		if !strings.Contains(f, want) {
			t.Fatalf("FETCH lacks %q:\n%s", want, f)
		}
	}

	// Synchronizing literals: the server asks for each in turn.
	tag = r.send(fmt.Sprintf("APPEND INBOX {%d}", len(m1)))
	for i, m := range []string{m1, m2} {
		if l := r.line(); !strings.HasPrefix(l, "+") {
			t.Fatalf("literal %d: %q, want a continuation", i+1, l)
		}
		sep := fmt.Sprintf(" {%d}\r\n", len(m2))
		if i == 1 {
			sep = "\r\n"
		}
		fmt.Fprintf(r.c, "%s%s", m, sep)
	}
	if _, st := r.until(tag); !appendUID.MatchString(st) {
		t.Fatalf("MULTIAPPEND with synchronizing literals: %s", st)
	}
	if u := other.ok("NOOP"); !has(u, "* 5 EXISTS") {
		t.Fatalf("after the second MULTIAPPEND: %q", u)
	}

	// Nothing shows before the last message is stored, and a failure of
	// the third removes the two stored before it.
	var seen []string
	restore := proxy.SetAppendFaultForTest(func(i int) error {
		if i == 2 {
			seen = other.ok("NOOP")
			return errors.New("injected failure")
		}
		return nil
	})
	tag = r.send(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s {%d+}\r\n%s {%d+}\r\n%s", len(m1), m1, len(m2), m2, len(m3), m3))
	_, st = r.until(tag)
	restore()
	if !strings.HasPrefix(st, "NO") {
		t.Fatalf("MULTIAPPEND whose third message fails: %s", st)
	}
	if has(seen, "EXISTS") {
		t.Fatalf("another session saw messages of an unfinished MULTIAPPEND: %q", seen)
	}
	if u := other.ok("NOOP"); has(u, "EXISTS") {
		t.Fatalf("a failed MULTIAPPEND left messages: %q", u)
	}
	if u := r.ok("STATUS INBOX (MESSAGES)"); !has(u, "MESSAGES 5") {
		t.Fatalf("STATUS after a failed MULTIAPPEND: %q", u)
	}
	// The guard is given up: a later APPEND is seen at once.
	tag = r.send(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s", len(m1), m1))
	if _, st := r.until(tag); !strings.HasPrefix(st, "OK") {
		t.Fatalf("APPEND after a failed MULTIAPPEND: %s", st)
	}
	if u := other.ok("NOOP"); !has(u, "* 6 EXISTS") {
		t.Fatalf("APPEND after a failed MULTIAPPEND not seen: %q", u)
	}

	// A message over the limit, sent without waiting, is read and
	// dropped with the rest of the command: the next command is in step.
	small := &env{t: t, dir: t.TempDir(), configure: func(c *Config) { c.MaxMessageBytes = 200 }}
	small.open()
	r = small.raw(true)
	big := strings.Repeat("x", 300)
	tag = r.send(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s {%d+}\r\n%s (\\Seen) {%d+}\r\n%s", len(m1), m1, len(big), big, len(m3), m3))
	if _, st := r.until(tag); !strings.HasPrefix(st, "NO [TOOBIG]") {
		t.Fatalf("MULTIAPPEND with a message over the limit: %s", st)
	}
	if _, st := r.cmd("NOOP"); !strings.HasPrefix(st, "OK") {
		t.Fatalf("NOOP after a refused MULTIAPPEND: %s", st)
	}
	if u := r.ok("STATUS INBOX (MESSAGES)"); !has(u, "MESSAGES 0") {
		t.Fatalf("STATUS after a refused MULTIAPPEND: %q", u)
	}

	// A syntax error after a literal was taken: the rest of the line is
	// discarded, the bytes of a later non-synchronizing literal with it
	// (they are not run as commands), and nothing is stored.
	tag = r.send(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s BOGUS {9+}\r\nt9 LOGOUT more\r\n", len(m1), m1))
	if _, st := r.until(tag); !strings.HasPrefix(st, "BAD") {
		t.Fatalf("MULTIAPPEND with a bad second message: %s", st)
	}
	if u := r.ok("STATUS INBOX (MESSAGES)"); !has(u, "MESSAGES 0") {
		t.Fatalf("STATUS after a malformed MULTIAPPEND: %q", u)
	}
}

// TestCatenate drives CATENATE (RFC 4469): a message made of text and of
// parts of stored messages named by absolute and relative IMAP URLs, and
// the URLs refused with NO [BADURL].
func TestCatenate(t *testing.T) {
	e := newEnv(t)
	src := "From: a@example.org\r\nSubject: source\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n" +
		"--b\r\nContent-Type: text/plain\r\n\r\nfirst part\r\n--b\r\nContent-Type: text/plain\r\n\r\nsecond part\r\n--b--\r\n"
	e.deliver(src)
	r := e.raw(true)
	u := r.ok("SELECT INBOX")
	v := regexp.MustCompile(`UIDVALIDITY (\d+)`).FindStringSubmatch(strings.Join(u, "\n"))
	if v == nil {
		t.Fatalf("SELECT: %q", u)
	}
	head := "Subject: built\r\n\r\n"
	tail := "\r\n-- end\r\n"
	tag := r.send(fmt.Sprintf(`APPEND INBOX CATENATE (TEXT {%d+}`+"\r\n"+`%s URL "/INBOX;UIDVALIDITY=%s/;UID=1/;SECTION=2" URL ";UID=1/;SECTION=1/;PARTIAL=0.5" URL "imap://%s@localhost/INBOX/;UID=1/;SECTION=HEADER.FIELDS%%20(SUBJECT)" TEXT {%d+}`+"\r\n"+`%s)`,
		len(head), head, v[1], strings.Replace(testUser, "@", "%40", 1), len(tail), tail))
	_, st := r.until(tag)
	if !appendUID.MatchString(st) {
		t.Fatalf("APPEND CATENATE: %s", st)
	}
	want := head + "second part" + "first" + "Subject: source\r\n\r\n" + tail
	f := strings.Join(r.ok("UID FETCH 2 BODY.PEEK[]"), "\n")
	if !strings.Contains(f, want) {
		t.Fatalf("the catenated message is not %q:\n%s", want, f)
	}

	for _, url := range []string{
		"/INBOX/;UID=9",                                  // no such message
		"/INBOX;UIDVALIDITY=1/;UID=1",                    // another UIDVALIDITY
		"imap://other%40example.org@h/INBOX/;UID=1",      // another user
		"/INBOX/;UID=1/;URLAUTH=anonymous:internal:0123", // URLAUTH
		"/Nowhere/;UID=1",                                // no such mailbox
		"/INBOX/;UID=1/;SECTION=7",                       // no such part
		"/INBOX",                                         // no message
	} {
		tag := r.send(fmt.Sprintf(`APPEND INBOX CATENATE (URL "%s" TEXT {3+}`+"\r\nabc)", url))
		_, st := r.until(tag)
		if !strings.HasPrefix(st, `NO [BADURL `+url+`]`) {
			t.Errorf("CATENATE URL %s: %s", url, st)
		}
		if _, st := r.cmd("NOOP"); !strings.HasPrefix(st, "OK") {
			t.Fatalf("NOOP after a refused CATENATE: %s", st)
		}
	}

	// At most 100 URLs in one APPEND.
	many := strings.Repeat(` URL "/INBOX/;UID=1/;SECTION=1"`, 101)
	tag = r.send("APPEND INBOX CATENATE (" + many[1:] + ")")
	if _, st := r.until(tag); !strings.HasPrefix(st, "NO [LIMIT]") {
		t.Fatalf("CATENATE of 101 URLs: %s", st)
	}

	// CATENATE within MULTIAPPEND: both messages or neither.
	tag = r.send(fmt.Sprintf(`APPEND INBOX CATENATE (URL "/INBOX/;UID=1/;SECTION=1") (\Seen) CATENATE (TEXT {%d+}`+"\r\n"+`%s)`, len(head), head))
	if _, st := r.until(tag); !strings.HasPrefix(st, "OK [APPENDUID") {
		t.Fatalf("MULTIAPPEND of CATENATE messages: %s", st)
	}
	if u := r.ok("STATUS INBOX (MESSAGES)"); !has(u, "MESSAGES 4") {
		t.Fatalf("STATUS after MULTIAPPEND of CATENATE messages: %q", u)
	}
}

// TestParseIMAPURL checks the URL forms CATENATE takes and refuses.
func TestParseIMAPURL(t *testing.T) {
	for _, c := range []struct {
		in, want string
	}{
		{"imap://bob%40example.org;AUTH=*@host:143/INBOX;UIDVALIDITY=7/;UID=20/;SECTION=1.2/;PARTIAL=0.1024", "bob@example.org INBOX 7 20 [1 2] 0+1024"},
		{"/a%2Fb%20c/;UID=3", " a/b c 0 3 [] -"},
		{";UID=3/;SECTION=TEXT", "  0 3 [] -"},
		{"/INBOX/;uid=5/;section=1.MIME", " INBOX 0 5 [1] -"},
		{"/INBOX/;UID=5/;PARTIAL=10", " INBOX 0 5 [] 10+9223372036854775797"},
	} {
		u, err := parseIMAPURL(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		p := "-"
		if u.section.Partial != nil {
			p = fmt.Sprintf("%d+%d", u.section.Partial.Offset, u.section.Partial.Size)
		}
		if got := fmt.Sprintf("%s %s %d %d %v %s", u.user, u.mailbox, u.uidValidity, u.uid, u.section.Part, p); got != c.want {
			t.Errorf("%s: %q, want %q", c.in, got, c.want)
		}
	}
	for _, in := range []string{"", "imap://host", "/INBOX", "/INBOX/;UID=0", "/INBOX/;UID=x", ";UID=1/;EXPIRE=2030",
		";UID=1/;SECTION=0", ";UID=1/;SECTION=1.", ";UID=1/;SECTION=HEADER.FIELDS", ";UID=1/;SECTION=MIME",
		";UID=1/;PARTIAL=1.0", ";UID=1/;PARTIAL=-1", "/INBOX;UIDVALIDITY=0/;UID=1", "imap://u;X=1@h/INBOX/;UID=1",
		";UID=1/;PARTIAL=1/;PARTIAL=2", strings.Repeat("a", maxURLLen+1)} {
		if u, err := parseIMAPURL(in); err == nil {
			t.Errorf("%q parsed: %+v", in, u)
		}
	}
}

// FuzzParseIMAPURL: any input is parsed or refused, never a panic, and a
// parsed URL names a message.
func FuzzParseIMAPURL(f *testing.F) {
	for _, s := range []string{"imap://u@h/INBOX;UIDVALIDITY=1/;UID=2/;SECTION=1.2.HEADER.FIELDS%20(A%20B)/;PARTIAL=1.2", ";UID=1", "/a/b/;UID=3/;SECTION=TEXT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := parseIMAPURL(s)
		if err == nil && (u.uid == 0 || u.section == nil) {
			t.Fatalf("%q: %+v", s, u)
		}
	})
}
