package imap

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/tlscert"
	"github.com/quillmail/quill/third_party/imapserver"
)

// naiveMatch is the textbook backtracking LIST matcher, the reference for
// matchMailbox on short inputs.
func naiveMatch(name, pattern string, delim byte) bool {
	if pattern == "" {
		return name == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(name); i++ {
			if naiveMatch(name[i:], pattern[1:], delim) {
				return true
			}
		}
		return false
	case '%':
		for i := 0; i <= len(name); i++ {
			if i > 0 && name[i-1] == delim {
				return false
			}
			if naiveMatch(name[i:], pattern[1:], delim) {
				return true
			}
		}
		return false
	default:
		return name != "" && name[0] == pattern[0] && naiveMatch(name[1:], pattern[1:], delim)
	}
}

func FuzzMatchMailbox(f *testing.F) {
	for _, s := range [][2]string{{"INBOX", "inbox"}, {"a/b/c", "a/%/c"}, {"a/b/c", "*"}, {"a/b", "%"}, {"Work/2026", "W*6"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, pattern string) {
		if len(name) > 24 || len(pattern) > 12 {
			return
		}
		got := matchMailbox(name, pattern, '/')
		want := naiveMatch(canonInbox(name, '/'), canonInbox(pattern, '/'), '/')
		if got != want {
			t.Fatalf("matchMailbox(%q, %q) = %v, want %v", name, pattern, got, want)
		}
	})
}

func FuzzMessage(f *testing.F) {
	f.Add([]byte(multipartMsg), uint8(1), uint8(0), int64(3), int64(10))
	f.Add([]byte(exactMsg), uint8(0), uint8(1), int64(0), int64(1))
	f.Add([]byte("Content-Type: multipart/mixed; boundary=a\r\n\r\n--a\r\n\r\n--a--"), uint8(1), uint8(2), int64(0), int64(0))
	f.Add([]byte("Content-Type: multipart/digest; boundary=b\r\n\r\n--b\r\n\r\nSubject: x\r\n\r\ny\r\n--b--\r\n"), uint8(1), uint8(1), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, raw []byte, part, spec uint8, off, size int64) {
		// None of these may panic, whatever the bytes.
		bodyStructure(raw)
		envelope(raw)
		if pv := preview(raw); !utf8.ValidString(pv) || utf8.RuneCountInString(pv) > maxPreview {
			t.Fatalf("preview %q: not UTF-8 or over %d characters", pv, maxPreview)
		}
		sm := &searchMsg{loaded: true, raw: raw, m: &msgState{}}
		sm.bodyText()
		sm.headerMatch("Subject", "x")
		h := headerLen(raw)
		if h < 0 || h > len(raw) {
			t.Fatalf("headerLen %d of %d bytes", h, len(raw))
		}
		// Header and text are exact slices that make up the message.
		hd := bodySection(raw, &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader})
		tx := bodySection(raw, &imap.FetchItemBodySection{Specifier: imap.PartSpecifierText})
		if !bytes.Equal(append(append([]byte{}, hd...), tx...), raw) {
			t.Fatalf("HEADER+TEXT != message")
		}
		p := &imap.SectionPartial{Offset: off, Size: size}
		got := bodySection(raw, &imap.FetchItemBodySection{Partial: p})
		if off >= 0 && off < int64(len(raw)) && size >= 0 {
			end := min(off+size, int64(len(raw)))
			if !bytes.Equal(got, raw[off:end]) {
				t.Fatalf("partial <%d.%d> wrong", off, size)
			}
		} else if len(got) != 0 {
			t.Fatalf("partial <%d.%d> out of range gave %d bytes", off, size, len(got))
		}
		specs := []imap.PartSpecifier{imap.PartSpecifierNone, imap.PartSpecifierHeader, imap.PartSpecifierText, imap.PartSpecifierMIME}
		sec := &imap.FetchItemBodySection{Part: []int{int(part%4) + 1, int(part/4%3) + 1}[:1+int(spec/4%2)], Specifier: specs[spec%4]}
		bodySection(raw, sec)
		bodySection(raw, &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader, HeaderFields: []string{"Subject"}})
	})
}

func FuzzResolveSets(f *testing.F) {
	f.Add(uint32(1), uint32(0), uint32(5), uint32(3))
	f.Add(uint32(7), uint32(2), uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, a, b, n, step uint32) {
		n %= 200
		set := imap.SeqSet{{Start: a % 300, Stop: b % 300}}
		idx, err := resolveSeqSet(set, n, false)
		if err == nil {
			for i, x := range idx {
				if x < 0 || x >= int(n) || (i > 0 && idx[i-1] >= x) {
					t.Fatalf("seq %v over %d gave %v", set, n, idx)
				}
			}
		}
		lidx, _ := resolveSeqSet(set, n, true)
		for _, x := range lidx {
			if x < 0 || x >= int(n) {
				t.Fatalf("lenient seq %v over %d gave %v", set, n, lidx)
			}
		}
		view := make([]uint32, 0, n)
		for i := uint32(0); i < n; i++ {
			view = append(view, 1+i*(1+step%5))
		}
		uset := imap.UIDSet{{Start: imap.UID(a), Stop: imap.UID(b)}}
		uidx := resolveUIDSet(uset, view)
		for i, x := range uidx {
			if x < 0 || x >= len(view) || (i > 0 && uidx[i-1] >= x) {
				t.Fatalf("uid %v gave %v", uset, uidx)
			}
			if !uidContains(uset, view[x], view[len(view)-1]) {
				t.Fatalf("uid %v: %d resolved but not contained", uset, view[x])
			}
		}
		if b == 0 && len(view) > 0 && (len(uidx) == 0 || uidx[len(uidx)-1] != len(view)-1) {
			t.Fatalf("uid %v: n:* must include the last message", uset)
		}
	})
}

// panicLog fails the fuzz run on a panic the library recovered (it logs
// them and closes the connection).
type panicLog struct {
	mu  sync.Mutex
	msg []string
}

func (p *panicLog) Enabled(context.Context, slog.Level) bool { return true }
func (p *panicLog) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.Value.String(); return true })
	if strings.Contains(s, "panic") {
		p.mu.Lock()
		p.msg = append(p.msg, s)
		p.mu.Unlock()
	}
	return nil
}
func (p *panicLog) WithAttrs([]slog.Attr) slog.Handler { return p }
func (p *panicLog) WithGroup(string) slog.Handler      { return p }

// FuzzCommands sends arbitrary bytes as commands to a logged-in session with
// INBOX selected, then checks that nothing panicked and the server still
// answers.
func FuzzCommands(f *testing.F) {
	for _, s := range []string{
		"a FETCH 1:* (BODY[1.2.HEADER.FIELDS (a b)]<0.10> BODYSTRUCTURE ENVELOPE MODSEQ) (CHANGEDSINCE 1)",
		"a UID STORE 1:* (UNCHANGEDSINCE 3) +FLAGS.SILENT (\\Seen $x)",
		"a SEARCH RETURN (SAVE MIN) OR (FROM x BODY y) NOT MODSEQ \"/flags/\\\\Seen\" all 3",
		"a LIST (SUBSCRIBED RECURSIVEMATCH) \"\" (* %) RETURN (CHILDREN STATUS (MESSAGES HIGHESTMODSEQ))",
		"a APPEND INBOX (\\Seen) \"01-Jan-2026 00:00:00 +0000\" {5+}\r\nhello",
		"a CREATE a/b/c (USE (\\Sent))", "a RENAME a b", "a MOVE $ Trash", "a COPY *:1 INBOX",
		"a SORT RETURN (MIN ALL) (REVERSE SUBJECT DISPLAYFROM) UTF-8 OR FROM x 1:*", "a UID THREAD REFERENCES UTF-8 NOT SEEN",
		"a THREAD ORDEREDSUBJECT US-ASCII ALL", "a FETCH 1:* (EMAILID THREADID)", "a SEARCH OR EMAILID Mx THREADID T-_",
		"a STATUS INBOX (MAILBOXID UIDNEXT)", "a LIST \"\" * RETURN (STATUS (MAILBOXID))", "a SORT (ARRIVAL CC DATE SIZE TO) UTF-8 MODSEQ 1",
		"a SELECT INBOX (CONDSTORE)", "a ID (\"a\" NIL)", "a ENABLE CONDSTORE IMAP4rev2", "a EXPUNGE", "a UID EXPUNGE 1:*",
		"a APPEND INBOX {2+}\r\nab (\\Seen) {3+}\r\nabc", "a APPEND INBOX CATENATE (TEXT {2+}\r\nab URL \"/INBOX/;UID=1/;SECTION=1.MIME\")",
		"a NOTIFY SET STATUS (selected (MessageNew (UID BODY.PEEK[HEADER]) MessageExpunge FlagChange)) (subtree (INBOX a) (MailboxName))",
		"a NOTIFY NONE", "a UID SEARCH RETURN (UPDATE PARTIAL 1:5 CONTEXT) ALL", "a UID SORT RETURN (UPDATE COUNT) (SUBJECT) UTF-8 ALL",
		"a CANCELUPDATE \"a\" \"b\"", "a SEARCH RETURN (PARTIAL 3:1 UPDATE) UNSEEN",
	} {
		f.Add([]byte(s))
	}
	c := openCore(f, f.TempDir())
	defer c.Close()
	deliverTo(f, c, multipartMsg)
	deliverTo(f, c, exactMsg)
	plog := &panicLog{}
	srv := New(&proxy.IMAPStore{P: c.Proxy}, testAuth{testUser: testPass}, Config{AuthFailDelay: -1, Logger: slog.New(plog)})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(context.Background())
	addr := l.Addr().String()

	f.Fuzz(func(t *testing.T, cmd []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "x LOGIN %s %s\r\nx SELECT INBOX\r\n", testUser, testPass)
		c.Write(cmd)
		// IDLE would wait for DONE; a pending literal for its bytes.
		fmt.Fprintf(c, "\r\nDONE\r\nzz NOOP\r\nzz LOGOUT\r\n")
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
		plog.mu.Lock()
		defer plog.mu.Unlock()
		if len(plog.msg) > 0 {
			t.Fatalf("server panicked on %q: %s", cmd, plog.msg[0])
		}
	})
}

// FuzzStartTLS drives the STARTTLS state change (RFC 9051 §6.2.1) with
// arbitrary commands before it and arbitrary commands under TLS after it,
// over a real connection: no input may panic the server, and no login
// before TLS may succeed (every connection counts as coming over a
// network, so LOGINDISABLED holds until TLS).
func FuzzStartTLS(f *testing.F) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, s := range [][2]string{
		{"a CAPABILITY\r\n", "a LOGIN " + testUser + " " + testPass + "\r\nb SELECT INBOX\r\n"},
		{"a LOGIN " + testUser + " " + testPass + "\r\n", "a AUTHENTICATE PLAIN " + b64("\x00"+testUser+"\x00"+testPass) + "\r\n"},
		{"a STARTTLS\r\nb NOOP\r\n", "a STARTTLS\r\n"},
		{"a AUTHENTICATE LOGIN\r\n", "a AUTHENTICATE LOGIN\r\n" + b64(testUser) + "\r\n" + b64(testPass) + "\r\nb FETCH 1 BODY[]\r\n"},
		{"a AUTHENTICATE SCRAM-SHA-256 " + b64("n,,n=u,r=abc") + "\r\n", "a AUTHENTICATE SCRAM-SHA-256\r\n*\r\n"},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	c := openCore(f, f.TempDir())
	defer c.Close()
	deliverTo(f, c, exactMsg)
	certPEM, keyPEM, err := tlscert.SelfSigned("localhost", time.Now(), time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	cert, _ := tls.X509KeyPair(certPEM, keyPEM)
	plog := &panicLog{}
	srv := New(&proxy.IMAPStore{P: c.Proxy}, testAuth{testUser: testPass}, Config{AuthFailDelay: -1, Logger: slog.New(plog),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, PlaintextAuth: func(net.Conn) bool { return false }})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(context.Background())

	f.Fuzz(func(t *testing.T, before, after []byte) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(before)
		c.Write([]byte("\r\nDONE\r\nzz STARTTLS\r\n"))
		r := bufio.NewReader(c)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return // closed, or the STARTTLS was swallowed by a literal
			}
			if strings.HasSuffix(l, "Logged in\r\n") || strings.HasSuffix(l, "authentication successful\r\n") {
				t.Fatalf("login before TLS accepted: %q for %q", l, before)
			}
			if strings.HasPrefix(l, "zz OK") {
				break
			}
			if strings.HasPrefix(l, "zz ") {
				return // STARTTLS refused (already under TLS, or after login)
			}
		}
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			return
		}
		tc.Write(after)
		tc.Write([]byte("\r\nDONE\r\nzz LOGOUT\r\n"))
		io.Copy(io.Discard, tc)
		plog.mu.Lock()
		defer plog.mu.Unlock()
		if len(plog.msg) > 0 {
			t.Fatalf("server panicked on %q / %q: %s", before, after, plog.msg[0])
		}
	})
}

// FuzzFilterHeader holds filterHeader to the library's answer for
// HEADER.FIELDS and HEADER.FIELDS.NOT wherever it gives one.
func FuzzFilterHeader(f *testing.F) {
	f.Add([]byte("From: a\r\nSubject: x\r\n y\r\nTo: b\r\n\r\n"), "subject", "to")
	f.Add([]byte("A: 1\r\nb: 2\r\nA: 3\r\n\r\n"), "a", "")
	f.Add([]byte("X:\r\n\r\n"), "x", "y")
	f.Add([]byte(" folded\r\nA: 1\r\n\r\n"), "a", "")
	f.Fuzz(func(t *testing.T, hdr []byte, field, notField string) {
		for _, sec := range []*imap.FetchItemBodySection{
			{Specifier: imap.PartSpecifierHeader, HeaderFields: []string{field, "From"}},
			{Specifier: imap.PartSpecifierHeader, HeaderFieldsNot: []string{notField}},
		} {
			got, ok := filterHeader(hdr, sec.HeaderFields, sec.HeaderFieldsNot)
			if !ok {
				continue
			}
			want := imapserver.ExtractBodySection(bytes.NewReader(hdr), sec)
			if !bytes.Equal(got, want) {
				t.Fatalf("header %q, section %+v:\n got %q\nwant %q", hdr, sec, got, want)
			}
		}
	})
}
