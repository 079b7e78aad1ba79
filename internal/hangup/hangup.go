// Package hangup cancels the work a client's command started when the
// client goes away in the middle of it. The protocol servers read a command
// and run it on one goroutine, so without this a client that hangs up during
// a long command (a view loaded from fragments on other nodes, a delivery
// replicated to them) would keep that remote work going to its deadline.
//
// While a command runs, Watch asks the kernel whether the connection is
// gone (reset: POLLHUP, POLLERR), without reading anything from the socket:
// bytes the client pipelined stay for the server to read, and a client that
// only closed its sending side may still read its replies (hungUp). Written by hand because no
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
	go func() {
		defer close(stopped)
		for {
			if hungUp(rc) {
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

// hungUp reports whether the connection is gone: reset by the peer, or
// failed. Control holds the file descriptor open while it runs, so it
// cannot be closed and reused under the poll.
//
// A peer that only shut down its sending side (POLLRDHUP: a script piping
// its commands into nc -N, or a client that closed politely) is not taken
// for gone: the first may still read the replies, and from here the two
// look alike, since the commands it pipelined already sit in the session's
// read buffer, not the socket's. Cutting the last command of such a client
// short would refuse mail that Postfix accepts; the work of one that left
// runs to its deadline instead, as it did before.
func hungUp(rc syscall.RawConn) bool {
	gone := false
	rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			gone = fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
	})
	return gone
}
