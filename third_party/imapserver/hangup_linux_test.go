//go:build linux

package imapserver

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// watchHangup is a CommandContext hook like Quill's: its context is
// cancelled when the peer closes its side while the command runs. It peeks
// at the socket (MSG_PEEK, so pipelined bytes stay for the server) and reads
// end-of-file as a hang-up.
func watchHangup(parent context.Context, conn net.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return ctx, cancel
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if peerClosed(rc) {
				cancel()
				return
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return ctx, func() {
		close(done)
		<-stopped
		cancel()
	}
}

func peerClosed(rc syscall.RawConn) bool {
	closed := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			closed = n == 0
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
		default:
			closed = true
		}
	})
	return closed
}

// QUILL.md row 14: with a hang-up watcher as Options.CommandContext, a
// session method waiting on Conn.Context is cancelled when the client hangs
// up in the middle of the command.
func TestCommandContextCancelledWhenClientHangsUp(t *testing.T) {
	ts := newTestServer(t, func(o *Options) { o.CommandContext = watchHangup })
	c := ts.login()
	// Pipelined bytes are not taken for a hang-up: the watcher of this
	// STATUS sees them and the next command still runs.
	c.write("a STATUS INBOX (MESSAGES)\r\nb NOOP\r\n")
	c.expect("* STATUS INBOX (MESSAGES 3)", "a OK STATUS completed", "b OK NOOP completed")

	c.send("s STATUS Slow (MESSAGES)")
	select {
	case <-ts.backend.slowStarted:
	case <-time.After(testTimeout):
		t.Fatal("STATUS Slow did not start")
	}
	c.conn.Close()
	select {
	case err := <-ts.backend.slowResult:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("STATUS Slow ended with %v, want context.Canceled", err)
		}
	case <-time.After(2 * testTimeout):
		t.Fatal("STATUS Slow did not end")
	}
}
