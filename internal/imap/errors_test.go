package imap

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/rpc"
)

// failingBodies is the production store whose Body fails with err, as it
// does when no node holding the message answers.
type failingBodies struct {
	*proxy.IMAPStore
	err error
}

func (f failingBodies) Body(user, id string) ([]byte, error) { return nil, f.err }

// A command that fails for a cause the session did not turn into an IMAP
// answer is NO with the command and the cause in the text; UNAVAILABLE
// (RFC 5530) when trying again may work, SERVERBUG otherwise.
func TestFailedCommandNamesCodeAndCause(t *testing.T) {
	e := newEnv(t)
	e.deliver("Subject: one\r\n\r\nbody\r\n")
	for _, c := range []struct {
		err  error
		code string
	}{
		{fmt.Errorf("read message m1 from n-2: rpc body: %w", rpc.ErrUnavailable), "[UNAVAILABLE]"},
		{fmt.Errorf("deliver to u@example.org: 0 live nodes with disk space: %w", proxy.ErrTryLater), "[UNAVAILABLE]"},
		{errors.New("message m1: record damaged"), "[SERVERBUG]"},
	} {
		srv := New(failingBodies{e.store, c.err}, proxy.IMAPAuth{P: e.core.Proxy}, Config{AuthFailDelay: time.Millisecond, IdlePoll: time.Minute})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		t.Cleanup(func() { l.Close() })
		r := (&env{t: t, addr: l.Addr().String()}).raw(true)
		r.ok("SELECT INBOX")
		_, st := r.cmd("FETCH 1 BODY[]")
		if !strings.HasPrefix(st, "NO "+c.code) || !strings.Contains(st, c.err.Error()) {
			t.Errorf("FETCH with the body failing (%v): %q, want NO %s naming the cause", c.err, st, c.code)
		}
		// The session goes on.
		r.ok("NOOP")
	}
}
