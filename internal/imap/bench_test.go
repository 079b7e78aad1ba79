package imap

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/quillmail/quill/internal/bench"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/proxy"
)

// BenchmarkFetchHeaders is the header FETCH of `quill bench --workload
// imap` (issue 13, speed of ordinary commands): FETCH 1:* (UID FLAGS
// RFC822.SIZE BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)]) over 160
// messages of about 5 KB on one node, through a real connection.
func BenchmarkFetchHeaders(b *testing.B) {
	cl := benchSession(b, 160)
	opts := &imap.FetchOptions{UID: true, Flags: true, RFC822Size: true, BodySection: []*imap.FetchItemBodySection{
		{Specifier: imap.PartSpecifierHeader, HeaderFields: []string{"FROM", "SUBJECT", "DATE"}, Peek: true}}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		msgs, err := cl.Fetch(imap.SeqSet{{Start: 1, Stop: 0}}, opts).Collect()
		if err != nil || len(msgs) != 160 {
			b.Fatalf("FETCH: %d messages, %v", len(msgs), err)
		}
	}
}

// BenchmarkBodyAndStore times the IMAP mix's other two commands on one
// node (a real store, fsync and all): UID FETCH of one message's BODY.PEEK[]
// (no flag change) and UID STORE of a flag on one message; and 20 bodies
// read at once that were unseen (the FETCH then sets \Seen on them).
func BenchmarkBodyAndStore(b *testing.B) {
	n := 160
	if v, err := strconv.Atoi(os.Getenv("QUILL_BENCH_MESSAGES")); err == nil && v > 0 {
		n = v // a larger mailbox shows what a command costs per message held
	}
	cl := benchSession(b, n)
	b.Run("fetch_body_peek", func(b *testing.B) {
		b.ReportAllocs()
		opts := &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{{Peek: true}}}
		for i := range b.N {
			msgs, err := cl.Fetch(imap.UIDSetNum(imap.UID(i%n+1)), opts).Collect()
			if err != nil || len(msgs) != 1 {
				b.Fatalf("FETCH: %d messages, %v", len(msgs), err)
			}
		}
	})
	b.Run("unseen_then_fetch_body_20", func(b *testing.B) {
		b.ReportAllocs()
		// 20 unseen messages read at once (a client opening a thread):
		// the FETCH's \Seen is one flag change, not one per message.
		set := imap.UIDSet{imap.UIDRange{Start: 1, Stop: 20}}
		unseen := &imap.StoreFlags{Op: imap.StoreFlagsDel, Flags: []imap.Flag{imap.FlagSeen}, Silent: true}
		opts := &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{{}}}
		for range b.N {
			if _, err := cl.Store(set, unseen, nil).Collect(); err != nil {
				b.Fatalf("STORE: %v", err)
			}
			if msgs, err := cl.Fetch(set, opts).Collect(); err != nil || len(msgs) != 20 {
				b.Fatalf("FETCH: %d messages, %v", len(msgs), err)
			}
		}
	})
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			op := imap.StoreFlagsAdd
			if (i/n)%2 == 1 {
				op = imap.StoreFlagsDel
			}
			flags := &imap.StoreFlags{Op: op, Flags: []imap.Flag{imap.FlagFlagged}, Silent: true}
			if _, err := cl.Store(imap.UIDSetNum(imap.UID(i%n+1)), flags, nil).Collect(); err != nil {
				b.Fatalf("STORE: %v", err)
			}
		}
	})
}

// BenchmarkFetch times what a client fetches besides BenchmarkFetchHeaders'
// header fields, over the same 160 messages of about 5 KB: the ENVELOPE and
// BODYSTRUCTURE of all (a client's message list), the whole header of all
// (BODY.PEEK[HEADER]), and one message's text (BODY.PEEK[TEXT]). Allocations
// are the server's and imapclient's together (one process).
func BenchmarkFetch(b *testing.B) {
	const n = 160
	cl := benchSession(b, n)
	all := imap.SeqSet{{Start: 1, Stop: 0}}
	for _, bc := range []struct {
		name string
		set  imap.NumSet
		want int
		opts *imap.FetchOptions
	}{
		{"envelope_structure_160", all, n, &imap.FetchOptions{UID: true, Envelope: true, BodyStructure: &imap.FetchItemBodyStructure{Extended: true}}},
		{"header_160", all, n, &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{{Specifier: imap.PartSpecifierHeader, Peek: true}}}},
		{"text_1", imap.UIDSetNum(7), 1, &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{{Specifier: imap.PartSpecifierText, Peek: true}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				msgs, err := cl.Fetch(bc.set, bc.opts).Collect()
				if err != nil || len(msgs) != bc.want {
					b.Fatalf("FETCH: %d messages, %v", len(msgs), err)
				}
			}
		})
	}
}

// BenchmarkSearch times UID SEARCH over the 160 messages of benchSession,
// the text index caught up: a header (SUBJECT) and an address header
// (FROM), both answered from the messages' headers, and TEXT and BODY,
// answered through the text index (internal/fts) and checked against the
// messages.
func BenchmarkSearch(b *testing.B) {
	const n = 160
	c, cl := benchCoreSession(b, n)
	waitTextIndexed(b, c)
	for _, bc := range []struct {
		name     string
		criteria *imap.SearchCriteria
		want     int
	}{
		// "message 42" is in the subjects of 42 alone; "sender 15" in the
		// From of 15 and 150-159.
		{"subject", &imap.SearchCriteria{Header: []imap.SearchCriteriaHeaderField{{Key: "Subject", Value: "message 42"}}}, 1},
		{"from", &imap.SearchCriteria{Header: []imap.SearchCriteriaHeaderField{{Key: "From", Value: "sender 15"}}}, 11},
		{"text_rare", &imap.SearchCriteria{Text: []string{"<42@example.org>"}}, 1},
		{"body_every", &imap.SearchCriteria{Body: []string{"lazy dog"}}, n},
		{"body_none", &imap.SearchCriteria{Body: []string{"zebra"}}, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				d, err := cl.UIDSearch(bc.criteria, nil).Wait()
				if err != nil || len(d.AllUIDs()) != bc.want {
					b.Fatalf("SEARCH: %d messages, want %d, %v", len(d.AllUIDs()), bc.want, err)
				}
			}
		})
	}
}

// benchSession delivers n messages of about 5 KB to the test user of a
// new one-node core and returns a client logged in with INBOX selected.
func benchSession(b *testing.B, n int) *imapclient.Client {
	_, cl := benchCoreSession(b, n)
	return cl
}

// benchCoreSession is benchSession that also returns the core.
// waitTextIndexed waits until the text index has read every message
// stored, so searches are timed against the index, not the queue.
func waitTextIndexed(b *testing.B, c *core.Core) {
	b.Helper()
	for {
		q, err := c.Boxes.TextQueued()
		if err != nil {
			b.Fatal(err)
		}
		if q == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func benchCoreSession(b *testing.B, n int) (*core.Core, *imapclient.Client) {
	c := openCore(b, b.TempDir())
	b.Cleanup(func() { c.Close() })
	body := strings.Repeat("The quick brown fox jumps over the lazy dog. 0123456789\r\n", 85)
	for i := range n {
		deliverTo(b, c, fmt.Sprintf("From: Sender %d <s%d@example.org>\r\nTo: %s\r\nSubject: message %d\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\nMessage-ID: <%d@example.org>\r\n\r\n%s", i, i, testUser, i, i, body))
	}
	srv := New(&proxy.IMAPStore{P: c.Proxy}, proxy.IMAPAuth{P: c.Proxy}, Config{AuthFailDelay: -1})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Shutdown(context.Background()) })
	cl, err := imapclient.DialInsecure(l.Addr().String(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	if err := cl.Login(testUser, testPass).Wait(); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Select("INBOX", nil).Wait(); err != nil {
		b.Fatal(err)
	}
	return c, cl
}

// countingStore counts the message bodies read.
type countingStore struct {
	Store
	bodies atomic.Int64
	lists  atomic.Int64 // Messages calls: whole-mailbox reads
}

func (c *countingStore) Messages(ctx context.Context, user string, mbox uint64) ([]mailbox.Message, error) {
	c.lists.Add(1)
	return c.Store.Messages(ctx, user, mbox)
}

func (c *countingStore) Body(ctx context.Context, user, id string) ([]byte, error) {
	c.bodies.Add(1)
	return c.Store.Body(ctx, user, id)
}

// newCountingEnv is newEnv with a store that counts the bodies read.
func newCountingEnv(t *testing.T) (*env, *countingStore) {
	e := &env{t: t, dir: t.TempDir()}
	e.core = openCore(t, e.dir)
	t.Cleanup(func() { e.core.Close() })
	cs := &countingStore{Store: &proxy.IMAPStore{P: e.core.Proxy}}
	e.srv = New(cs, proxy.IMAPAuth{P: e.core.Proxy}, Config{AuthFailDelay: -1})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	go e.srv.Serve(l)
	t.Cleanup(func() { e.srv.Shutdown(context.Background()) })
	return e, cs
}

// A session's own STORE, or the \Seen a FETCH sets, is not followed by a
// read of the whole mailbox when nothing else changed it; a change made by
// another session in between still is, and still reaches the client.
func TestOwnChangeNeedsNoResync(t *testing.T) {
	e, cs := newCountingEnv(t)
	for i := range 3 {
		deliverTo(t, e.core, fmt.Sprintf("Subject: %d\r\n\r\nbody\r\n", i))
	}
	a, b := e.raw(true), e.raw(true)
	a.ok("SELECT INBOX")
	b.ok("SELECT INBOX")
	before := cs.lists.Load()
	a.ok(`STORE 1 +FLAGS (\Flagged)`)
	a.ok("FETCH 2 (BODY[])")
	a.ok(`UID STORE 1:3 +FLAGS.SILENT (\Answered)`)
	a.ok("NOOP")
	if n := cs.lists.Load() - before; n != 0 {
		t.Errorf("own changes read the mailbox %d times", n)
	}
	// Another session's change before this one's STORE: read and told.
	b.ok(`STORE 3 +FLAGS (\Draft)`)
	before = cs.lists.Load()
	u := a.ok(`STORE 1 -FLAGS (\Flagged)`)
	u = append(u, a.ok("NOOP")...)
	if cs.lists.Load() == before || !has(u, `* 3 FETCH (`) || !has(u, `\Answered \Draft`) {
		t.Errorf("a change elsewhere was not read or not told: %q", u)
	}
}

// Selecting a mailbox again that has not changed since the session's last
// selection of it takes that selection's messages instead of listing them
// all again (at 100,000 messages the listing took 109 ms against Dovecot's
// 0.4 ms); any change in between (a flag set or a delivery through another
// session) lists them again, and the answers are what a fresh session gets.
func TestReselectUnchangedMailboxListsNothing(t *testing.T) {
	e, cs := newCountingEnv(t)
	for i := range 3 {
		deliverTo(t, e.core, fmt.Sprintf("Subject: %d\r\n\r\nbody\r\n", i))
	}
	a, b := e.raw(true), e.raw(true)
	first := a.ok("SELECT INBOX")
	a.ok("UNSELECT")
	before := cs.lists.Load()
	again := a.ok("SELECT INBOX")
	a.ok("EXAMINE INBOX")
	if n := cs.lists.Load() - before; n != 0 {
		t.Errorf("selecting an unchanged mailbox again listed it %d times", n)
	}
	if !has(again, "* 3 EXISTS") || !has(first, "* 3 EXISTS") {
		t.Fatalf("answers: %q then %q", first, again)
	}
	// Changes through another session: listed again, and right.
	b.ok("SELECT INBOX")
	b.ok(`STORE 2 +FLAGS (\Flagged)`)
	deliverTo(t, e.core, "Subject: 3\r\n\r\nbody\r\n")
	a.ok("UNSELECT")
	before = cs.lists.Load()
	u := a.ok("SELECT INBOX")
	f := a.ok("FETCH 1:* (FLAGS)")
	if cs.lists.Load() == before || !has(u, "* 4 EXISTS") || !has(f, `* 2 FETCH (FLAGS (\Flagged))`) {
		t.Errorf("a changed mailbox selected again: listed %d times, %q %q", cs.lists.Load()-before, u, f)
	}
}

// A header-only FETCH (header fields, ENVELOPE) reads each message's bytes
// once per node, whatever session asks again; the answers are the same
// from the cache, and a FETCH that needs the body still reads it.
func TestHeaderFetchReadsEachMessageOnce(t *testing.T) {
	e, cs := newCountingEnv(t)
	for i := range 3 {
		e.deliver(fmt.Sprintf("From: A <a@example.org>\r\nSubject: s%d\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\n\r\nbody %d\r\n", i, i))
	}
	const cmd = "FETCH 1:* (ENVELOPE BODY.PEEK[HEADER.FIELDS (SUBJECT)] BODY.PEEK[HEADER])"
	var answers [][]string
	for range 2 {
		r := e.raw(true)
		r.ok("SELECT INBOX")
		answers = append(answers, r.ok(cmd))
	}
	if got := cs.bodies.Load(); got != 3 {
		t.Errorf("%d bodies read for two header FETCHes of 3 messages, want 3", got)
	}
	if strings.Join(answers[0], "\n") != strings.Join(answers[1], "\n") {
		t.Errorf("the cached answer differs:\n%q\n%q", answers[0], answers[1])
	}
	if !has(answers[1], `BODY[HEADER.FIELDS ("SUBJECT")] {15}`) || !has(answers[1], `"s2"`) {
		t.Errorf("answer: %q", answers[1])
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	if u := r.ok("FETCH 2 BODY.PEEK[TEXT]"); !has(u, "body 1") || cs.bodies.Load() != 4 {
		t.Errorf("BODY[TEXT]: %q after %d reads", u, cs.bodies.Load())
	}
}

// largeMailboxSize is QUILL_LARGE_MAILBOX (the benchmarks skip when unset).
func largeMailboxSize(b *testing.B) int {
	n, _ := strconv.Atoi(os.Getenv("QUILL_LARGE_MAILBOX"))
	if n <= 0 {
		b.Skip("set QUILL_LARGE_MAILBOX to the number of messages")
	}
	return n
}

// BenchmarkLargeMailbox times largeCommands on one node's INBOX of
// QUILL_LARGE_MAILBOX messages (issue 13's large-mailbox goals; filling
// it takes about 2 ms a message). BenchmarkLargeMailboxDovecot times the
// same commands on the same messages in Dovecot.
func BenchmarkLargeMailbox(b *testing.B) {
	n := largeMailboxSize(b)
	c := openCore(b, b.TempDir())
	defer c.Close()
	start := time.Now()
	for i := range n {
		deliverTo(b, c, string(bench.LargeMessage(i)))
		if (i+1)%10000 == 0 {
			b.Logf("%d of %d messages delivered (%v)", i+1, n, time.Since(start).Round(time.Second))
		}
	}
	// The text index catches up in the background; the searches are timed
	// once it has.
	start = time.Now()
	waitTextIndexed(b, c)
	b.Logf("text index caught up %v after the last delivery", time.Since(start).Round(time.Millisecond))
	// Pebble goes on flushing and compacting what the fill wrote; the
	// commands are timed once that is done, as Dovecot's are on a Maildir
	// at rest.
	time.Sleep(benchSettle)
	srv := New(&proxy.IMAPStore{P: c.Proxy}, proxy.IMAPAuth{P: c.Proxy}, Config{AuthFailDelay: -1})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(context.Background())
	timeCommands(b, l.Addr().String(), testUser, testPass, n)
}

// benchSettle is how long BenchmarkLargeMailbox leaves the store alone
// between the fill and the timing.
const benchSettle = 30 * time.Second

// BenchmarkLargeMailboxDovecot is BenchmarkLargeMailbox's peer: the same
// QUILL_LARGE_MAILBOX messages in a Maildir served by the Debian package's
// Dovecot (started here, stopped by its PID), with its default search or,
// with QUILL_BENCH_DOVECOT_FTS=xapian, the dovecot-fts-xapian plugin (the
// index built with doveadm index before the timing). Needs root (Dovecot
// serves the Maildir as the system user vmail, made if missing).
func BenchmarkLargeMailboxDovecot(b *testing.B) {
	n := largeMailboxSize(b)
	if _, err := os.Stat("/usr/sbin/dovecot"); err != nil || os.Geteuid() != 0 {
		b.Skip("needs root and Dovecot (apt-get install dovecot-imapd)")
	}
	fts := os.Getenv("QUILL_BENCH_DOVECOT_FTS")
	if fts != "" && fts != "xapian" {
		b.Fatalf("QUILL_BENCH_DOVECOT_FTS=%q: only xapian is known", fts)
	}
	if err := exec.Command("id", "vmail").Run(); err != nil {
		if out, err := exec.Command("useradd", "-r", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", "vmail").CombinedOutput(); err != nil {
			b.Fatalf("useradd vmail: %v: %s", err, out)
		}
	}
	u, err := user.Lookup("vmail")
	if err != nil {
		b.Fatal(err)
	}
	// Not b.TempDir: its parent is closed to the user vmail.
	dir, err := os.MkdirTemp("", "quill-dovecot-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	for _, d := range []string{"run", "state", "home/Maildir/cur", "home/Maildir/new", "home/Maildir/tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	// Each message a file in cur/, unread, its arrival (the file's time)
	// one second after the one before, as a delivery in that order leaves
	// them.
	for i := range n {
		m := bench.LargeMessage(i)
		at := bench.LargeArrival(i)
		f := filepath.Join(home, "Maildir/cur", fmt.Sprintf("%d.M%dP1.bench,S=%d:2,", at.Unix(), i, len(m)))
		if err := os.WriteFile(f, m, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Chtimes(f, at, at); err != nil {
			b.Fatal(err)
		}
	}
	if out, err := exec.Command("chown", "-R", u.Uid+":"+u.Gid, home).CombinedOutput(); err != nil {
		b.Fatalf("chown: %v: %s", err, out)
	}
	port := freePort(b)
	conf := fmt.Sprintf(`protocols = imap
listen = 127.0.0.1
base_dir = %[1]s/run
state_dir = %[1]s/state
log_path = %[1]s/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
default_internal_user = dovecot
default_login_user = dovenull
first_valid_uid = 100
passdb {
  driver = static
  args = password=%[2]s
}
userdb {
  driver = static
  args = uid=%[3]s gid=%[4]s home=%[5]s
}
mail_location = maildir:~/Maildir
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = %[6]d
  }
  inet_listener imaps {
    port = 0
  }
}
`, dir, testPass, u.Uid, u.Gid, home, port)
	if fts == "xapian" {
		conf += `mail_plugins = $mail_plugins fts fts_xapian
plugin {
  fts = xapian
  fts_xapian = partial=3 full=20 verbose=0
  fts_autoindex = yes
  fts_enforced = yes
}
service indexer-worker {
  vsz_limit = 0
}
`
	}
	cf := filepath.Join(dir, "dovecot.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("/usr/sbin/dovecot", "-F", "-c", cf)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if b.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "dovecot.log"))
			b.Logf("dovecot.log:\n%s", log)
		}
	}()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("Dovecot did not listen on %s within 10 s (%s/dovecot.log)", addr, dir)
		}
	}
	if fts == "xapian" {
		start := time.Now()
		if out, err := exec.Command("doveadm", "-c", cf, "index", "-u", testUser, "INBOX").CombinedOutput(); err != nil {
			b.Fatalf("doveadm index: %v: %s", err, out)
		}
		b.Logf("doveadm index (xapian) took %v", time.Since(start).Round(time.Millisecond))
	}
	timeCommands(b, addr, testUser, testPass, n)
}

// freePort is a loopback TCP port nothing listens on at the moment.
func freePort(b *testing.B) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// timeCommands logs in to the IMAP server at addr and times each of the
// large-mailbox commands on its INBOX of n messages as a sub-benchmark,
// with `quill bench --workload search`'s client; it logs the size of each
// answer and whether it is right, so that the servers' answers compare.
func timeCommands(b *testing.B, addr, user, pass string, n int) {
	c, err := bench.DialRawIMAP(context.Background(), addr, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Login(user, pass); err != nil {
		b.Fatal(err)
	}
	cmds := bench.LargeCommands(n)
	want := bench.LargeWant(n, cmds)
	for k, cmd := range cmds {
		f := strings.Fields(cmd.Line)
		b.Run(f[0]+"_"+strings.Join(f[1:], "_"), func(b *testing.B) {
			results := 0
			for range b.N {
				if results, err = c.Run(bench.SearchCommandTimeout, cmd.Line); err != nil {
					b.Fatal(err)
				}
			}
			verdict := "right"
			if results != want[k] {
				verdict = fmt.Sprintf("WRONG, want %d", want[k])
			}
			b.Logf("%s: %d results (%s)", cmd.Line, results, verdict)
		})
	}
}
