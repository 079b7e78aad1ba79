package imap

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
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
// (no flag change) and UID STORE of a flag on one message.
func BenchmarkBodyAndStore(b *testing.B) {
	n := 160
	if v, err := strconv.Atoi(os.Getenv("QUILL_BENCH_MESSAGES")); err == nil && v > 0 {
		n = v // a larger mailbox shows what a command costs per message held
	}
	cl := benchSession(b, n)
	b.Run("fetch_body_peek", func(b *testing.B) {
		opts := &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{{Peek: true}}}
		for i := range b.N {
			msgs, err := cl.Fetch(imap.UIDSetNum(imap.UID(i%n+1)), opts).Collect()
			if err != nil || len(msgs) != 1 {
				b.Fatalf("FETCH: %d messages, %v", len(msgs), err)
			}
		}
	})
	b.Run("store", func(b *testing.B) {
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

// benchSession delivers n messages of about 5 KB to the test user of a
// new one-node core and returns a client logged in with INBOX selected.
func benchSession(b *testing.B, n int) *imapclient.Client {
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
	return cl
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

// BenchmarkLargeMailbox times what a client does on a large INBOX (issue
// 13's large-mailbox goals): SELECT, FETCH 1:* (FLAGS), SEARCH UNSEEN,
// SORT (REVERSE ARRIVAL), SEARCH SUBJECT and SEARCH TEXT. The mailbox has
// QUILL_LARGE_MAILBOX messages (skipped when unset; filling it takes
// about a millisecond a message).
func BenchmarkLargeMailbox(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("QUILL_LARGE_MAILBOX"))
	if n <= 0 {
		b.Skip("set QUILL_LARGE_MAILBOX to the number of messages")
	}
	c := openCore(b, b.TempDir())
	defer c.Close()
	body := strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit. 0123456789\r\n", 30)
	for i := range n {
		deliverTo(b, c, fmt.Sprintf("From: Sender %d <s%d@example.org>\r\nSubject: topic %d\r\nDate: Mon, 02 Mar 2026 10:00:00 +0000\r\n\r\n%sword%d\r\n", i%97, i%97, i%1000, body, i))
		if (i+1)%10000 == 0 {
			b.Logf("%d of %d messages delivered", i+1, n)
		}
	}
	// The text index catches up in the background; the searches are timed
	// once it has.
	start := time.Now()
	for {
		q, err := c.Boxes.TextQueued()
		if err != nil {
			b.Fatal(err)
		}
		if q == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Logf("text index caught up %v after the last delivery", time.Since(start).Round(time.Millisecond))
	srv := New(&proxy.IMAPStore{P: c.Proxy}, proxy.IMAPAuth{P: c.Proxy}, Config{AuthFailDelay: -1})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(context.Background())
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReaderSize(conn, 1<<20)
	tag := 0
	cmd := func(s string) {
		tag++
		t := fmt.Sprintf("b%d", tag)
		fmt.Fprintf(conn, "%s %s\r\n", t, s)
		for {
			line, err := r.ReadSlice('\n')
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			if bytes.HasPrefix(line, []byte(t+" ")) {
				if !bytes.HasPrefix(line, []byte(t+" OK")) {
					b.Fatalf("%s: %s", s, line)
				}
				return
			}
		}
	}
	r.ReadString('\n')
	cmd("LOGIN " + testUser + " " + testPass)
	for _, c := range []string{"SELECT INBOX", "FETCH 1:* (FLAGS)", "SEARCH UNSEEN", "SORT (REVERSE ARRIVAL) UTF-8 ALL", "SEARCH SUBJECT \"topic 7\"", "SEARCH TEXT word12345",
		"SEARCH FROM \"sender 42\"", "SEARCH BODY \"ord1234\"", "SEARCH BODY consectetur"} {
		b.Run(strings.Fields(c)[0]+"_"+strings.Join(strings.Fields(c)[1:], "_"), func(b *testing.B) {
			for range b.N {
				cmd(c)
			}
		})
	}
}
