package imap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/mimepart"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/writer"
)

var refPattern = regexp.MustCompile(`\(reference ([0-9a-f]{8})\)`)

// failingBodies is the production store whose Body fails with err, as it
// does when no node holding the message answers.
type failingBodies struct {
	*proxy.IMAPStore
	err error
}

func (f failingBodies) Body(ctx context.Context, user, id string) ([]byte, error) {
	return nil, f.err
}

// OpenRange fails as Body does: ranges are read from the same holders.
func (f failingBodies) OpenRange(ctx context.Context, user, id string, off, n int64) (io.ReadCloser, int64, error) {
	return nil, 0, f.err
}

// OpenParts fails as Body does.
func (f failingBodies) OpenParts(ctx context.Context, user, id string) (mailbox.BodyReader, *mimepart.Table, error) {
	return nil, nil, f.err
}

// lockedBuffer is a log destination safe to read while sessions write.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A command that fails for a cause the session did not turn into an IMAP
// answer is NO with the command and a reference in the text, the cause in
// the log under the same reference (never to the client: it names other
// nodes); UNAVAILABLE (RFC 5530) when trying again may work, SERVERBUG
// otherwise.
func TestFailedCommandNamesCodeAndCause(t *testing.T) {
	e := newEnv(t)
	e.deliver("Subject: one\r\n\r\nbody\r\n")
	for _, c := range []struct {
		err  error
		code string
	}{
		{fmt.Errorf("read message m1 from n-2: rpc body: %w", rpc.ErrUnavailable), "[UNAVAILABLE]"},
		{fmt.Errorf("deliver to u@example.org: 0 live nodes with disk space: %w", proxy.ErrTryLater), "[UNAVAILABLE]"},
		// A writer on Cassandra fenced out by another, as a session on
		// another node gets it (rpc.Known keeps its identity).
		{fmt.Errorf("rpc Writer.Mailboxes to 127.0.0.1:1: user u@example.org mailbox 1: reservations claimed by another writer: %w", writer.ErrFenced), "[UNAVAILABLE]"},
		{errors.New("message m1: record damaged"), "[SERVERBUG]"},
	} {
		var logs lockedBuffer
		srv := New(failingBodies{e.store, c.err}, proxy.IMAPAuth{P: e.core.Proxy}, Config{AuthFailDelay: time.Millisecond, IdlePoll: time.Minute,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		t.Cleanup(func() { l.Close() })
		r := (&env{t: t, addr: l.Addr().String()}).raw(true)
		r.ok("SELECT INBOX")
		_, st := r.cmd("FETCH 1 BODY[]")
		ref := refPattern.FindStringSubmatch(st)
		if !strings.HasPrefix(st, "NO "+c.code) || ref == nil || strings.Contains(st, c.err.Error()) {
			t.Fatalf("FETCH with the body failing (%v): %q, want NO %s with a reference and not the cause", c.err, st, c.code)
		}
		if l := logs.String(); !strings.Contains(l, ref[1]) || !strings.Contains(l, c.err.Error()) {
			t.Errorf("the log does not hold reference %s with the cause %v:\n%s", ref[1], c.err, l)
		}
		// The session goes on.
		r.ok("NOOP")
	}
}

// blockingMessages is the production store whose Messages waits for its
// context to end, as a view load waits on a fragment of a paused node, and
// says when it did.
type blockingMessages struct {
	*proxy.IMAPStore
	entered, ended chan struct{}
}

func (b blockingMessages) Messages(ctx context.Context, user string, mbox uint64) ([]mailbox.Message, error) {
	close(b.entered)
	<-ctx.Done()
	close(b.ended)
	return nil, ctx.Err()
}

// A client that hangs up in the middle of a command cancels the work the
// command started (the store's context), instead of leaving it to run to
// its deadline (30 s for an operation).
func TestHangUpCancelsTheCommandsWork(t *testing.T) {
	e := newEnv(t)
	store := blockingMessages{e.store, make(chan struct{}), make(chan struct{})}
	srv := New(store, proxy.IMAPAuth{P: e.core.Proxy}, Config{AuthFailDelay: time.Millisecond, IdlePoll: time.Minute})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { l.Close() })
	r := (&env{t: t, addr: l.Addr().String()}).raw(true)
	r.send("SELECT INBOX")
	select {
	case <-store.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("SELECT never reached the store")
	}
	r.c.Close()
	select {
	case <-store.ended:
	case <-time.After(3 * time.Second):
		t.Fatal("the store's work went on after the client hung up")
	}
}
