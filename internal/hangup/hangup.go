// Package hangup cancels the work a client's command started when the
// client goes away in the middle of it. The protocol servers read a command
// and run it on one goroutine, so without this a client that hangs up during
// a long command (a view loaded from fragments on other nodes, a delivery
// replicated to them) would keep that remote work going to its deadline.
//
// While a command runs, Watch asks the kernel whether the peer has hung up
// (Linux's POLLRDHUP; a reset: POLLHUP, POLLERR), without reading anything
// from the socket: bytes the client pipelined stay for the server to read.
// A peer that only closed its sending side may still read its replies (a
// script piping its session into nc -N), so that counts only once the
// command has run for halfCloseGrace. Written by hand because no
// library offers it; where the platform or the connection cannot tell, the
// command simply runs to its deadline as before.
package hangup

import (
	"context"
	"crypto/tls"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pollEvery is how often the watcher looks. Each look is one poll(2) on one
// socket, and a watcher runs only while a command runs.
const pollEvery = 200 * time.Millisecond

// halfCloseGrace is how long a command runs before a peer that closed its
// sending side is taken for gone. A client that pipelined its whole session
// and shut down its side (nc -N) still reads the replies, and from here it
// looks like one that left: its commands already sit in the session's read
// buffer, not the socket's. Its commands normally take milliseconds, so
// they end well within the grace; one stuck on an unreachable node (30 s)
// is let go after it, whoever the client is.
const halfCloseGrace = time.Second

// Watch returns a context that is cancelled when parent is, or when conn's
// peer hangs up, and a stop function to call when the command is over.
func Watch(parent context.Context, conn net.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	rc := rawConn(conn)
	if rc == nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		for {
			if reset, closed := hungUp(rc); reset || closed && time.Since(start) >= halfCloseGrace {
				cancel()
				return
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(pollEvery):
			}
		}
	}()
	return ctx, func() {
		close(done)
		<-stopped
		cancel()
	}
}

// rawConn returns the socket under conn (through TLS), or nil.
func rawConn(conn net.Conn) syscall.RawConn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// hungUp reports whether the connection is reset or failed, and whether
// the peer closed its sending side. Control holds the file descriptor open
// while it runs, so it cannot be closed and reused under the poll.
func hungUp(rc syscall.RawConn) (reset, closed bool) {
	rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			reset = fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
			closed = fds[0].Revents&unix.POLLRDHUP != 0
		}
	})
	return reset, closed
}
