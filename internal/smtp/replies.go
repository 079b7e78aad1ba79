package smtp

import (
	"crypto/tls"
	"net"
	"sync"
	"syscall"
	"time"
)

// Reply batching (RFC 2920 §3.1): go-smtp writes each reply line through
// net/textproto, which flushes it to the socket at once, so a pipelined
// MAIL, RCPT and DATA cost a write(2) each and a multi-line EHLO reply one
// per line. A replyConn holds what the session writes and sends it when
// the session next reads from the socket, that is when it has no buffered
// command left to answer and would wait for the client: the point where
// RFC 2920 says a server must flush. A reply is therefore never held
// while the client waits for it, and a 250 after DATA still leaves only
// once the message is fsync'd (the write comes after the delivery). go-smtp
// has no hook for this (v0.25.1), hence the wrapper around its connections.

// replyListener hands go-smtp connections whose replies wait for the next
// read. A connection with implicit TLS is left as it is: go-smtp looks for
// *tls.Conn to know a session is encrypted.
type replyListener struct{ net.Listener }

func (l replyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if _, ok := c.(*tls.Conn); ok {
		return c, nil
	}
	return &replyConn{Conn: c}, nil
}

// replyConn is a connection whose writes wait until the next Read or Close.
type replyConn struct {
	net.Conn
	// mu orders Write and flush with a Close from another goroutine
	// (Server.Close while a session writes).
	mu  sync.Mutex
	out []byte
}

// maxHeldReplies bounds what a connection holds before writing it out
// anyway: replies are short, and a client pipelining thousands of commands
// (RFC 2920 allows any number) must not grow the buffer without end.
const maxHeldReplies = 16 << 10

func (c *replyConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, p...)
	if len(c.out) >= maxHeldReplies {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *replyConn) flushLocked() error {
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.out)
	c.out = c.out[:0]
	return err
}

// Read sends the held replies first: the session is about to wait for the
// client, which may be waiting for them.
func (c *replyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	err := c.flushLocked()
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

// closeFlushTimeout bounds sending the held replies at Close, whatever
// write deadline the connection had: crypto/tls sets one in the past after
// its close_notify (as it writes nothing more itself), which would lose
// the 221 and the alert held behind it. 5 seconds is what crypto/tls gives
// its close_notify.
const closeFlushTimeout = 5 * time.Second

// Close sends the held replies (a 221 after QUIT, a 421) and closes.
func (c *replyConn) Close() error {
	c.mu.Lock()
	if len(c.out) > 0 {
		c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		c.flushLocked() // the connection closes all the same; nothing to tell the client otherwise
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// SyscallConn gives hangup.Watch the socket under the wrapper.
func (c *replyConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}
