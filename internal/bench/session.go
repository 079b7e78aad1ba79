package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Network deadlines. Every operation of a run is bounded by them, so a run
// ends by itself even against a server that stops answering.
const (
	// DialTimeout bounds opening a TCP connection.
	DialTimeout = 5 * time.Second
	// SessionTimeout bounds a whole SMTP or POP3 session, from dial to the
	// reply to QUIT. A session that reaches it fails with ErrTimeout. It is
	// much longer than the 2 s latency deadline so that slow sessions are
	// measured (and counted as late) rather than cut off.
	SessionTimeout = 30 * time.Second
	// DrainTimeout is how long requests still in flight when the run's
	// duration is over may take to finish before they are cut off and
	// counted as aborted.
	DrainTimeout = 5 * time.Second
)

// boundedConn keeps every deadline of a connection at or before the end of
// its session, and of its current operation if one is set, whatever the
// protocol client sets (go-smtp's client resets its deadline to "none"
// after each command, go-imap's to its own 30 s per response), and lets the
// run cut the session off. The deadline is applied under the lock, so a
// client goroutine setting its own deadline cannot undo a later
// setOpDeadline.
type boundedConn struct {
	net.Conn
	mu      sync.Mutex
	limit   time.Time // end of the session
	op      time.Time // end of the current operation; zero for none
	aborted bool
}

var pastDeadline = time.Unix(1, 0)

// clampLocked returns t brought within the session's and the operation's
// deadline; zero t means "no deadline of my own".
func (c *boundedConn) clampLocked(t time.Time) time.Time {
	if c.aborted {
		return pastDeadline
	}
	end := c.limit
	if !c.op.IsZero() && c.op.Before(end) {
		end = c.op
	}
	if t.IsZero() || t.After(end) {
		return end
	}
	return t
}

func (c *boundedConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.SetDeadline(c.clampLocked(t))
}

func (c *boundedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.SetReadDeadline(c.clampLocked(t))
}

func (c *boundedConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Conn.SetWriteDeadline(c.clampLocked(t))
}

// setOpDeadline starts an operation that must end within d (and within the
// session): it sets the connection's deadline to that instant, which it
// returns, and keeps every later deadline the client sets at or before it.
func (c *boundedConn) setOpDeadline(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.op = time.Now().Add(d)
	end := c.clampLocked(time.Time{})
	c.Conn.SetDeadline(end)
	return end
}

func (c *boundedConn) abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.aborted = true
	c.Conn.SetDeadline(pastDeadline)
}

// dialSession opens a connection for one session that starts at start. The
// connection is cut off when abort is done.
//
// With tlsCfg, the session speaks implicit TLS (RFC 8314): the handshake
// is part of the session's time, and res learns whether it resumed an
// earlier session (tlsCfg's ClientSessionCache) or made a full one.
func dialSession(abort context.Context, addr string, tlsCfg *tls.Config, start time.Time, res *Result) (*boundedConn, func(), error) {
	d := net.Dialer{Timeout: DialTimeout}
	raw, err := d.DialContext(abort, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	var conn net.Conn = raw
	if tlsCfg != nil {
		conn = tls.Client(raw, tlsCfg)
	}
	c := &boundedConn{Conn: conn, limit: start.Add(SessionTimeout)}
	c.SetDeadline(time.Time{})
	stop := context.AfterFunc(abort, c.abort)
	closeConn := func() { stop(); raw.Close() }
	if tc, ok := conn.(*tls.Conn); ok {
		hsStart := time.Now()
		if err := tc.HandshakeContext(abort); err != nil {
			closeConn()
			return nil, nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		res.TLS, res.TLSResumed, res.Handshake = true, tc.ConnectionState().DidResume, time.Since(hsStart)
	}
	return c, closeConn, nil
}

// classify maps a session error to its kind.
func classify(err error) ErrKind {
	var se *smtp.SMTPError
	var pe *popError
	var ne net.Error
	switch {
	case err == nil:
		return ErrNone
	case errors.As(err, &se) && se.Code >= 400 && se.Code < 500:
		return ErrSMTP4xx
	case errors.As(err, &se) && se.Code >= 500:
		return ErrSMTP5xx
	case errors.As(err, &pe):
		return ErrPOP
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	}
	return ErrOther
}

// dialFailed classifies a failed dial: a connect error, or an abort if the
// run was cutting requests off.
func dialFailed(abort context.Context, res Result, err error) Result {
	if abort.Err() != nil {
		res.Aborted = true
	} else {
		res.Err, res.ErrMsg = ErrConnect, err.Error()
	}
	return res
}

// smtpTarget is what one SMTP session needs.
type smtpTarget struct {
	addr string
	tls  *tls.Config // implicit TLS (submissions port) when set
	helo string
	from string
	to   []string
	msg  []byte
	// user and pass, when set, log in first (AUTH PLAIN: submission).
	user, pass string
}

// deliver runs one SMTP session (RFC 5321 §3.3): EHLO, AUTH for a
// submission, MAIL, RCPT, DATA with one message, QUIT.
func deliver(abort context.Context, t smtpTarget) (res Result, err error) {
	res.Op = OpSMTP
	start := time.Now()
	defer func() {
		res.Latency = time.Since(start)
		if err != nil {
			res.Err, res.ErrMsg = classify(err), err.Error()
			if abort.Err() != nil {
				res.Aborted, res.Err, res.ErrMsg = true, ErrNone, ""
			}
		}
	}()
	conn, closeConn, err := dialSession(abort, t.addr, t.tls, start, &res)
	if err != nil {
		return dialFailed(abort, res, err), nil // classified here, not by the deferred code
	}
	defer closeConn()
	c := smtp.NewClient(conn)
	c.CommandTimeout, c.SubmissionTimeout = SessionTimeout, SessionTimeout
	if err := c.Hello(t.helo); err != nil {
		return res, err
	}
	if t.user != "" {
		if err := c.Auth(sasl.NewPlainClient("", t.user, t.pass)); err != nil {
			return res, err
		}
	}
	if err := c.Mail(t.from, nil); err != nil {
		return res, err
	}
	for _, to := range t.to {
		if err := c.Rcpt(to, nil); err != nil {
			return res, err
		}
	}
	w, err := c.Data()
	if err != nil {
		return res, err
	}
	if _, err := w.Write(t.msg); err != nil {
		return res, err
	}
	if err := w.Close(); err != nil {
		return res, err
	}
	res.Delivered, res.BytesSent = true, int64(len(t.msg))
	return res, c.Quit()
}

// popTarget is what one POP3 session needs.
type popTarget struct {
	addr       string
	tls        *tls.Config // implicit TLS (POP3S) when set
	user, pass string
}

// retrieveAll runs one POP3 session (RFC 1939): log in, LIST, RETR and
// DELE every message, QUIT.
func retrieveAll(abort context.Context, t popTarget) (res Result, err error) {
	res.Op = OpPOP
	start := time.Now()
	defer func() {
		res.Latency = time.Since(start)
		if err != nil {
			res.Err, res.ErrMsg = classify(err), err.Error()
			if abort.Err() != nil {
				res.Aborted, res.Err, res.ErrMsg = true, ErrNone, ""
			}
		}
	}()
	conn, closeConn, err := dialSession(abort, t.addr, t.tls, start, &res)
	if err != nil {
		return dialFailed(abort, res, err), nil
	}
	defer closeConn()
	c := newPOPClient(conn)
	if err := c.greeting(); err != nil {
		return res, err
	}
	if err := c.login(t.user, t.pass); err != nil {
		return res, err
	}
	nums, err := c.list()
	if err != nil {
		return res, err
	}
	for _, n := range nums {
		size, err := c.retr(n)
		if err != nil {
			return res, err
		}
		res.Retrieved++
		res.BytesRetrieved += size
		if err := c.dele(n); err != nil {
			return res, err
		}
	}
	return res, c.quit()
}
