package pop3

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/xdg-go/scram"
)

// ErrServerClosed is returned by Serve once Shutdown has been called.
var ErrServerClosed = errors.New("pop3: server closed")

// Config tunes a Server. Every zero field takes the default in its comment,
// so the zero Config is ready for production.
type Config struct {
	// Hostname names this server in the greeting. Default: os.Hostname(),
	// or "localhost" if that fails.
	Hostname string
	// AuthFailDelay is the short delay before the -ERR [AUTH] that answers
	// a wrong password, to slow down password guessing. Default 1s; a
	// negative value means no delay.
	AuthFailDelay time.Duration
	// IdleTimeout ends a session whose client sends nothing for this long,
	// or whose writes make no progress for this long. RFC 1939 §3 asks for
	// an autologout timer of at least 10 minutes. Default 10m.
	IdleTimeout time.Duration
	// MaxLineLength is the longest client line accepted, CRLF included.
	// RFC 2449 §4 limits commands to 255 octets; the default, 1024, leaves
	// room for long AUTH PLAIN responses. A longer line is discarded and
	// answered with -ERR.
	MaxLineLength int
	// MaxBadCommands is how many failed commands (unknown, malformed, out
	// of state, failed logins) a session may send; the last one is
	// answered and the connection closed. Default 20.
	MaxBadCommands int
	// Logger receives session events; passwords are never logged.
	// Default: discard.
	Logger *slog.Logger
	// CommandContext, if set, makes the context each command runs under
	// from the session's, so that a client that hangs up during a command
	// cancels the work it started (hangup.Watch); stop is called when the
	// command is over.
	CommandContext func(parent context.Context, conn net.Conn) (ctx context.Context, stop func())
	// TLSConfig, if set, offers STLS (RFC 2595 §4) to clients on plain
	// connections.
	TLSConfig *tls.Config
	// PlaintextAuth says whether a connection not (yet) under TLS may send
	// a password: RFC 8314 §3 wants none in clear over a network. nil
	// allows it everywhere. When it says no, CAPA hides USER and SASL and
	// both answer -ERR asking for STLS.
	PlaintextAuth func(net.Conn) bool
	// HandshakeTimeout bounds a TLS handshake after STLS. Default 30s.
	HandshakeTimeout time.Duration
	// Logins, if set, decides the delay after a failed login (growing per
	// address and account) and locks out an address that fails too
	// often; without it every failure waits AuthFailDelay.
	Logins guard.Logins
	// MaxFailedLogins is how many failed logins a connection may make
	// before it is closed (IMAP closes after the same number). Default 5.
	MaxFailedLogins int
}

func (c Config) withDefaults() Config {
	if c.Hostname == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "localhost"
		}
		c.Hostname = h
	}
	if c.AuthFailDelay == 0 {
		c.AuthFailDelay = time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.MaxLineLength <= 0 {
		c.MaxLineLength = 1024
	}
	if c.MaxBadCommands <= 0 {
		c.MaxBadCommands = 20
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 30 * time.Second
	}
	if c.MaxFailedLogins <= 0 {
		c.MaxFailedLogins = 5
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server is a POP3 server. Its methods are safe for concurrent use.
type Server struct {
	backend Backend
	cfg     Config
	log     *slog.Logger

	// ctx is the parent of every session's context; Shutdown cancels it
	// when it gives up waiting, to abort backend calls in flight.
	ctx    context.Context
	cancel context.CancelFunc

	nextID   atomic.Uint64
	sessions sync.WaitGroup

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	active    map[*session]struct{}
}

// New returns a Server that authenticates users and reads their mail
// through b.
func New(b Backend, cfg Config) *Server {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		backend:   b,
		cfg:       cfg,
		log:       cfg.Logger,
		ctx:       ctx,
		cancel:    cancel,
		listeners: make(map[net.Listener]struct{}),
		active:    make(map[*session]struct{}),
	}
}

// Serve accepts connections on l and serves each in its own goroutine. It
// returns ErrServerClosed after Shutdown, or the error that stopped
// Accept. It closes l when it returns. TLS (POP3S) is the caller's to
// add, by passing a tls.Listener.
func (s *Server) Serve(l net.Listener) error {
	defer l.Close()
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if s.shuttingDown() {
				return ErrServerClosed
			}
			// Running out of file descriptors is temporary: back off
			// rather than spin or give up, as net/http does.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("pop3: accept failed; retrying", "addr", l.Addr().String(), "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("pop3: accept on %s: %w", l.Addr(), err)
		}
		backoff = 0
		c := s.newSession(conn)
		if c == nil {
			conn.Close()
			return ErrServerClosed
		}
		go s.serveSession(c)
	}
}

// Shutdown stops accepting connections and waits for the active sessions
// to end on their own (a client's QUIT). When ctx is done first, it closes
// the remaining connections, cancels their backend calls and returns
// ctx.Err() without waiting further. Sessions cut off this way do not
// enter the UPDATE state, so they delete nothing (RFC 1939 §6).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.sessions.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
	}
	s.cancel()
	s.mu.Lock()
	n := len(s.active)
	for c := range s.active {
		c.raw.Close()
	}
	s.mu.Unlock()
	s.log.Warn("pop3: shutdown deadline passed; closed remaining sessions", "sessions", n)
	return ctx.Err()
}

// ActiveSessions returns the number of connections being served.
func (s *Server) ActiveSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

func (s *Server) shuttingDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// newSession registers a session for conn, or returns nil once Shutdown
// has begun. Registering under mu orders sessions.Add before
// Shutdown's Wait.
func (s *Server) newSession(conn net.Conn) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil
	}
	id := s.nextID.Add(1)
	c := &session{
		srv:  s,
		conn: conn,
		raw:  conn,
		log:  s.log.With("session", id, "remote", conn.RemoteAddr().String()),
		r:    bufio.NewReader(conn),
		w:    bufio.NewWriterSize(timeoutWriter{conn, s.cfg.IdleTimeout}, 32<<10),
	}
	s.active[c] = struct{}{}
	s.sessions.Add(1)
	return c
}

// serveSession runs one session to its end and releases everything it
// holds. A panic is contained here: it ends this session, not the server.
func (s *Server) serveSession(c *session) {
	defer s.sessions.Done()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	c.ctx = ctx
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("pop3: session panic; closing connection", "panic", v, "stack", string(debug.Stack()))
		}
		c.close()
		s.mu.Lock()
		delete(s.active, c)
		s.mu.Unlock()
	}()
	c.log.Debug("pop3: session started")
	err := c.run()
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, errTooManyBad), errors.Is(err, errHandshake):
		c.log.Debug("pop3: session ended", "reason", err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// RFC 1939 §3: autologout closes the connection without a reply.
		c.log.Info("pop3: session idle too long; closed")
	default:
		c.log.Warn("pop3: session ended by error", "err", err)
	}
}

// timeoutWriter bounds each write to the client, so a client that stops
// reading a long RETR cannot hold its session forever.
type timeoutWriter struct {
	conn    net.Conn
	timeout time.Duration
}

func (t timeoutWriter) Write(p []byte) (int, error) {
	if err := t.conn.SetWriteDeadline(time.Now().Add(t.timeout)); err != nil {
		return 0, err
	}
	return t.conn.Write(p)
}

var (
	errLineTooLong = errors.New("line too long")
	errTooManyBad  = errors.New("too many bad commands")
	errQuit        = errors.New("client quit")
	errHandshake   = errors.New("TLS handshake failed")
)

// maxReplyLine is the longest status line sent, CRLF included (RFC 2449 §4).
const maxReplyLine = 512

// session is one client connection. Only its own goroutine touches it,
// except Shutdown closing conn.
type session struct {
	srv  *Server
	conn net.Conn // the client's connection, under TLS after STLS
	raw  net.Conn // the accepted connection, which Shutdown closes
	log  *slog.Logger
	ctx  context.Context // the session's: ends with it, or at Shutdown
	cmd  context.Context // the running command's (backend calls use it)
	r    *bufio.Reader
	w    *bufio.Writer
	line []byte // readLine's buffer, reused

	user    string   // name from USER, waiting for PASS
	md      Maildrop // nil in the AUTHORIZATION state
	msgs    []Message
	deleted []bool // marked by DELE, indexed like msgs
	bad     int    // failed commands so far
	failed  int    // failed logins so far
	closing bool   // the last reply ended the session
	// status is the first status indicator the running command was
	// answered with: ok (+OK) or err (-ERR), "" before any.
	status string
}

func (c *session) close() {
	c.w.Flush()
	if c.md != nil {
		if err := c.md.Close(); err != nil {
			c.log.Warn("pop3: closing maildrop failed", "err", err)
		}
		c.md = nil
	}
	c.conn.Close()
}

func (c *session) run() error {
	// RFC 1939 §4: the greeting opens the AUTHORIZATION state.
	c.ok("%s Quill POP3 server ready", c.srv.cfg.Hostname)
	for {
		line, err := c.readLine()
		c.status = ""
		switch {
		case errors.Is(err, errLineTooLong):
			c.fail("line too long: limit is %d octets including CRLF", c.srv.cfg.MaxLineLength)
			countCommand("", c.status)
		case err != nil:
			return err
		default:
			cmd, args, perr := parseCommand(line)
			if perr != nil {
				c.fail("%v", perr)
				countCommand("", c.status)
				break
			}
			c.cmd = c.ctx
			stop := func() {}
			if cc := c.srv.cfg.CommandContext; cc != nil {
				c.cmd, stop = cc(c.ctx, c.conn)
			}
			err := c.dispatch(cmd, args)
			stop()
			countCommand(cmd, c.status)
			if err != nil {
				if errors.Is(err, errQuit) {
					return nil
				}
				return err
			}
		}
		if c.closing {
			return errTooManyBad
		}
	}
}

// readLine returns the next line from the client without its line ending.
// A line longer than MaxLineLength is read to its end, discarded, and
// reported as errLineTooLong, so the session can go on.
func (c *session) readLine() ([]byte, error) {
	// Flush replies only when no whole command is waiting, so that a
	// pipelined batch (RFC 2449 §6.6) is answered in one write.
	if buf, _ := c.r.Peek(c.r.Buffered()); bytes.IndexByte(buf, '\n') < 0 {
		if err := c.w.Flush(); err != nil {
			return nil, err
		}
	}
	if err := c.conn.SetReadDeadline(time.Now().Add(c.srv.cfg.IdleTimeout)); err != nil {
		return nil, err
	}
	c.line = c.line[:0]
	tooLong := false
	for {
		frag, err := c.r.ReadSlice('\n')
		if !tooLong {
			if len(c.line)+len(frag) > c.srv.cfg.MaxLineLength {
				tooLong = true
				c.line = c.line[:0]
			} else {
				c.line = append(c.line, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	if tooLong {
		return nil, errLineTooLong
	}
	line := bytes.TrimSuffix(c.line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), nil
}

// writeLine queues one reply line. Control characters (say, from a backend
// error) become spaces so they cannot break the framing, and the line is
// cut to the RFC 2449 §4 limit.
func (c *session) writeLine(s string) {
	if c.status == "" {
		if strings.HasPrefix(s, "+OK") {
			c.status = "ok"
		} else if strings.HasPrefix(s, "-ERR") {
			c.status = "err"
		}
	}
	if len(s) > maxReplyLine-2 {
		s = s[:maxReplyLine-2]
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b < 0x20 || b == 0x7f {
			b = ' '
		}
		c.w.WriteByte(b)
	}
	c.w.WriteString("\r\n")
}

func (c *session) ok(format string, a ...any) {
	c.writeLine("+OK " + fmt.Sprintf(format, a...))
}

// fail answers a command the client got wrong. Those count towards
// MaxBadCommands; the reply that reaches it also closes the session.
func (c *session) fail(format string, a ...any) {
	c.bad++
	msg := fmt.Sprintf(format, a...)
	if c.bad >= c.srv.cfg.MaxBadCommands {
		c.closing = true
		msg += "; too many bad commands, closing connection"
	}
	c.writeLine("-ERR " + msg)
}

// sysTemp answers a command the backend could not carry out; not the
// client's fault, so it does not count as a bad command (RFC 3206 §4).
//
// The reply names the command and a reference to the log line that holds
// the cause; the cause itself (node addresses, RPC errors) stays inside.
func (c *session) sysTemp(what string, err error) {
	ref := fmt.Sprintf("%08x", rand.Uint32())
	c.log.Warn("pop3: backend error", "op", what, "err", err, "ref", ref)
	c.writeLine(fmt.Sprintf("-ERR [SYS/TEMP] %s; try again later (reference %s)", what, ref))
}

// parseCommand splits a command line, line ending removed, into its
// upper-cased keyword and its arguments. RFC 1939 §3: a keyword of three
// or four characters, case-insensitive, then arguments separated by
// spaces; runs of spaces are tolerated. PASS keeps everything after the
// keyword as one argument, since a password may hold spaces (RFC 1939 §7).
func parseCommand(line []byte) (cmd string, args []string, err error) {
	for _, b := range line {
		if b < 0x20 || b == 0x7f {
			return "", nil, fmt.Errorf("command line contains control character 0x%02x", b)
		}
	}
	if len(bytes.TrimLeft(line, " ")) == 0 {
		return "", nil, errors.New("empty command line")
	}
	kw, rest, _ := bytes.Cut(line, []byte(" "))
	if len(kw) < 3 || len(kw) > 4 || !isLetters(kw) {
		return "", nil, fmt.Errorf("invalid command keyword %s: want 3 or 4 letters (RFC 1939 §3)", short(string(kw)))
	}
	cmd = strings.ToUpper(string(kw))
	if cmd == "PASS" {
		if len(rest) > 0 {
			args = []string{string(rest)}
		}
		return cmd, args, nil
	}
	for f := range bytes.SplitSeq(rest, []byte(" ")) {
		if len(f) > 0 {
			args = append(args, string(f))
		}
	}
	return cmd, args, nil
}

func isLetters(b []byte) bool {
	for _, c := range b {
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// short quotes a client-supplied value for a reply, cut to a readable size.
func short(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:40]) + "..."
	}
	return strconv.Quote(s)
}

// dispatch runs one parsed command. It returns an error only when the
// session must end: errQuit after QUIT, or a failure of the connection.
func (c *session) dispatch(cmd string, args []string) error {
	switch cmd {
	case "CAPA":
		if c.nargs(cmd, args, 0, 0) {
			c.capa()
		}
		return nil
	case "QUIT":
		if !c.nargs(cmd, args, 0, 0) {
			return nil
		}
		return c.quit()
	case "APOP":
		c.fail("APOP not supported; use USER/PASS or AUTH PLAIN")
		return nil
	}
	if c.md == nil {
		// AUTHORIZATION state (RFC 1939 §4).
		switch cmd {
		case "STLS":
			return c.cmdSTLS(args)
		case "USER":
			c.cmdUser(args)
		case "PASS":
			c.cmdPass(args)
		case "AUTH":
			return c.cmdAuth(args)
		case "STAT", "LIST", "UIDL", "RETR", "TOP", "DELE", "RSET", "NOOP":
			c.fail("%s not allowed before login", cmd)
		default:
			c.fail("unknown command %s", cmd)
		}
		return nil
	}
	// TRANSACTION state (RFC 1939 §5).
	switch cmd {
	case "STAT":
		if c.nargs(cmd, args, 0, 0) {
			n, size := c.stat()
			c.ok("%d %d", n, size)
		}
	case "LIST":
		c.cmdList(args)
	case "UIDL":
		c.cmdUIDL(args)
	case "RETR":
		if !c.nargs(cmd, args, 1, 1) {
			return nil
		}
		if i, ok := c.msgArg(cmd, args[0]); ok {
			return c.send(cmd, i, -1)
		}
	case "TOP":
		if !c.nargs(cmd, args, 2, 2) {
			return nil
		}
		i, ok := c.msgArg(cmd, args[0])
		if !ok {
			return nil
		}
		lines, err := parseCount(args[1])
		if err != nil {
			c.fail("TOP: invalid line count %s: want a non-negative number", short(args[1]))
			return nil
		}
		return c.send(cmd, i, lines)
	case "DELE":
		if !c.nargs(cmd, args, 1, 1) {
			return nil
		}
		if i, ok := c.msgArg(cmd, args[0]); ok {
			c.deleted[i] = true
			c.ok("message %d deleted", i+1)
		}
	case "RSET":
		if c.nargs(cmd, args, 0, 0) {
			clear(c.deleted)
			n, size := c.stat()
			c.ok("maildrop has %d messages (%d octets)", n, size)
		}
	case "NOOP":
		if c.nargs(cmd, args, 0, 0) {
			c.writeLine("+OK")
		}
	case "USER", "PASS", "AUTH", "STLS":
		c.fail("%s not allowed after login", cmd)
	default:
		c.fail("unknown command %s", cmd)
	}
	return nil
}

// commands are the POP3 commands counted under their own name
// (metrics.Commands); any other is counted as UNKNOWN, so a client cannot
// make up label values.
var commands = map[string]bool{"CAPA": true, "QUIT": true, "APOP": true, "STLS": true, "USER": true, "PASS": true,
	"AUTH": true, "STAT": true, "LIST": true, "UIDL": true, "RETR": true, "TOP": true, "DELE": true, "RSET": true, "NOOP": true}

// countCommand counts a command by the first status it was answered with
// (none: the connection failed before an answer, not counted).
func countCommand(cmd, status string) {
	if status == "" {
		return
	}
	if !commands[cmd] {
		cmd = "UNKNOWN"
	}
	metrics.Commands.WithLabelValues("pop3", cmd, status).Inc()
}

// nargs checks the argument count and answers -ERR when it is wrong.
func (c *session) nargs(cmd string, args []string, lo, hi int) bool {
	switch {
	case len(args) < lo:
		c.fail("%s: missing argument: want %d, got %d", cmd, lo, len(args))
	case len(args) > hi:
		c.fail("%s: too many arguments: want at most %d, got %d", cmd, hi, len(args))
	default:
		return true
	}
	return false
}

// msgArg resolves a message number (RFC 1939 §5: 1-based, fixed for the
// session, deleted messages may not be referred to) to an index in msgs.
func (c *session) msgArg(cmd, arg string) (int, bool) {
	n, err := parseCount(arg)
	switch {
	case err != nil:
		c.fail("%s: invalid message number %s", cmd, short(arg))
	case n < 1 || n > len(c.msgs):
		c.fail("%s: no such message %d, maildrop has %d", cmd, n, len(c.msgs))
	case c.deleted[n-1]:
		c.fail("%s: message %d already deleted", cmd, n)
	default:
		return n - 1, true
	}
	return 0, false
}

// parseCount parses a decimal number of digits only; values too large for
// an int become math.MaxInt, which is "no such message" or "all lines".
func parseCount(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not a decimal number")
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return math.MaxInt, nil
	}
	return n, nil
}

// stat counts the messages not marked deleted and their octets.
func (c *session) stat() (n int, size int64) {
	for i, m := range c.msgs {
		if !c.deleted[i] {
			n++
			size += m.Size
		}
	}
	return n, size
}

func (c *session) capa() {
	// RFC 2449 §5, §6; AUTH-RESP-CODE is from RFC 3206, SASL from RFC
	// 5034, STLS from RFC 2595 §4 (not offered once TLS is on, nor after
	// login).
	c.ok("capability list follows")
	lines := []string{"TOP", "UIDL", "RESP-CODES", "AUTH-RESP-CODE", "PIPELINING"}
	if c.md == nil && c.srv.cfg.TLSConfig != nil && !c.tlsOn() {
		lines = append(lines, "STLS")
	}
	if c.plaintextOK() {
		lines = append(lines, "USER", "SASL "+strings.Join(saslsrv.Mechanisms, " "))
	}
	for _, l := range append(lines, "IMPLEMENTATION Quill") {
		c.writeLine(l)
	}
	c.writeLine(".")
}

func (c *session) tlsOn() bool {
	_, ok := c.conn.(*tls.Conn)
	return ok
}

// plaintextOK says whether this connection may carry a password.
func (c *session) plaintextOK() bool {
	f := c.srv.cfg.PlaintextAuth
	return f == nil || c.tlsOn() || f(c.conn)
}

// needTLS refuses a login on a connection that may not carry a password.
func (c *session) needTLS(cmd string) bool {
	if c.plaintextOK() {
		return false
	}
	c.log.Info("pop3: login refused before TLS", "cmd", cmd)
	c.fail("%s: a password needs TLS first: send STLS, or use the POP3S port", cmd)
	return true
}

// cmdSTLS starts TLS on the connection (RFC 2595 §4).
func (c *session) cmdSTLS(args []string) error {
	if !c.nargs("STLS", args, 0, 0) {
		return nil
	}
	cfg := c.srv.cfg.TLSConfig
	switch {
	case cfg == nil:
		c.fail("STLS: TLS is not offered here")
		return nil
	case c.tlsOn():
		c.fail("STLS: TLS is already on")
		return nil
	}
	// Anything the client sent after STLS, before it could have seen the
	// +OK, is not its TLS handshake: reading it as commands under TLS is
	// the STARTTLS injection of CVE-2011-0411, so the session ends.
	if c.r.Buffered() > 0 {
		c.log.Info("pop3: data pipelined after STLS; closing")
		c.fail("STLS: data after STLS before the TLS handshake; closing connection")
		c.closing = true
		return nil
	}
	c.user = ""
	c.ok("begin TLS negotiation")
	if err := c.w.Flush(); err != nil {
		return err
	}
	tc := tls.Server(c.conn, cfg)
	c.conn.SetDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	if err := tc.HandshakeContext(c.ctx); err != nil {
		return fmt.Errorf("%w: %v", errHandshake, err)
	}
	c.conn.SetDeadline(time.Time{})
	c.conn = tc
	c.r = bufio.NewReader(tc)
	c.w = bufio.NewWriterSize(timeoutWriter{tc, c.srv.cfg.IdleTimeout}, 32<<10)
	c.log.Info("pop3: TLS on", "version", tls.VersionName(tc.ConnectionState().Version))
	return nil
}

func (c *session) cmdUser(args []string) {
	if !c.nargs("USER", args, 1, 1) || c.needTLS("USER") {
		return
	}
	c.user = args[0]
	c.ok("send PASS")
}

func (c *session) cmdPass(args []string) {
	user := c.user
	c.user = "" // RFC 1939 §7: after a failed PASS, authentication starts over.
	switch {
	case user == "":
		c.fail("PASS: send USER first")
	case len(args) == 0 || args[0] == "":
		c.fail("PASS: missing password")
	case c.needTLS("PASS"):
	default:
		c.login(saslsrv.Credentials{Mechanism: "PASS", User: user, Password: args[0]}, nil)
	}
}

// errAnswered ends a SASL exchange whose outcome login already sent.
var errAnswered = errors.New("login answered")

// cmdAuth runs AUTH (RFC 5034 §4) with any mechanism of saslsrv: the
// exchange's challenges go out as "+ base64", the client's answers come
// back one per line, and "*" cancels.
func (c *session) cmdAuth(args []string) error {
	if len(args) == 0 {
		// Not in RFC 5034, but many clients probe mechanisms this way.
		c.ok("SASL mechanisms follow")
		if c.plaintextOK() {
			for _, m := range saslsrv.Mechanisms {
				c.writeLine(m)
			}
		}
		c.writeLine(".")
		return nil
	}
	if !c.nargs("AUTH", args, 1, 2) || c.needTLS("AUTH") {
		return nil
	}
	mech := strings.ToUpper(args[0])
	if c.lockedOut("AUTH "+mech, "") {
		return nil
	}
	srv, err := saslsrv.New(mech, func(user string) (scram.StoredCredentials, error) {
		return c.srv.backend.SCRAMKeys(c.cmd, user)
	}, func(creds saslsrv.Credentials, err error) error {
		c.login(creds, err)
		return errAnswered
	})
	if err != nil {
		c.fail("AUTH: unsupported SASL mechanism %s; offered: %s", short(args[0]), strings.Join(saslsrv.Mechanisms, " "))
		return nil
	}
	var resp []byte // nil: no initial response
	if len(args) == 2 {
		if resp, err = decodeSASL(args[1]); err != nil {
			c.fail("AUTH %s: response is not valid base64", mech)
			return nil
		}
	}
	for {
		challenge, done, err := srv.Next(resp)
		switch {
		case done || errors.Is(err, errAnswered):
			return nil
		case err != nil:
			c.fail("AUTH %s: %v", mech, err)
			return nil
		}
		c.writeLine("+ " + base64.StdEncoding.EncodeToString(challenge))
		line, err := c.readLine()
		if errors.Is(err, errLineTooLong) {
			c.fail("AUTH %s: response too long: limit is %d octets including CRLF", mech, c.srv.cfg.MaxLineLength)
			return nil
		}
		if err != nil {
			return err
		}
		text := string(bytes.Trim(line, " "))
		if text == "*" {
			c.fail("AUTH %s: cancelled by client", mech)
			return nil
		}
		if resp, err = decodeSASL(text); err != nil {
			c.fail("AUTH %s: response is not valid base64", mech)
			return nil
		}
	}
}

// lockedOut refuses a login from an address locked out, before any
// credential is looked at. AUTH asks it before the exchange starts, so a
// SCRAM exchange from a locked-out address never reaches the proof.
func (c *session) lockedOut(mech, user string) bool {
	logins := c.srv.cfg.Logins
	if logins == nil || logins.LoginAllowed(c.conn.RemoteAddr()) == nil {
		return false
	}
	c.failed++
	metrics.Login("pop3", metrics.LoginLockedOut)
	c.log.Warn("pop3: login refused: address locked out", "user", user)
	c.writeLine("-ERR [SYS/TEMP] " + mech + ": too many failed logins from your address; try again later")
	if c.failed >= c.srv.cfg.MaxFailedLogins {
		c.closing = true
	}
	return true
}

// decodeSASL decodes a client's SASL message; "=" is an empty initial
// response (RFC 5034 §4), and an empty line an empty response.
func decodeSASL(s string) ([]byte, error) {
	if s == "=" {
		return []byte{}, nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if b == nil {
		b = []byte{}
	}
	return b, err
}

// login authenticates and, on success, takes the snapshot that numbers the
// messages for the rest of the session, entering the TRANSACTION state.
func (c *session) login(creds saslsrv.Credentials, exErr error) {
	user, mech := creds.User, creds.Mechanism
	if mech != "PASS" {
		mech = "AUTH " + mech
	}
	logins, remote := c.srv.cfg.Logins, c.conn.RemoteAddr()
	if c.lockedOut(mech, user) {
		return
	}
	var md Maildrop
	err := exErr
	switch {
	case err != nil:
	case creds.Proven:
		md, err = c.srv.backend.Open(c.cmd, user)
	default:
		md, err = c.srv.backend.Login(c.cmd, user, creds.Password)
	}
	if errors.Is(err, ErrAuthFailed) || errors.Is(err, saslsrv.ErrAuthFailed) {
		c.failed++
		metrics.Login("pop3", metrics.LoginFailed)
		d := c.srv.cfg.AuthFailDelay
		if logins != nil {
			d = logins.LoginFailed(remote, user)
		}
		c.log.Info("pop3: login failed", "user", user, "mech", mech, "failures", c.failed, "delay", d, "err", err)
		c.authFailDelay(d)
		// RFC 3206 §5: [AUTH] says the credentials were wrong, so the
		// client need not retry blindly.
		msg := "[AUTH] " + mech + ": authentication failed"
		if errors.Is(err, saslsrv.ErrAuthFailed) {
			msg = "[AUTH] " + mech + ": " + err.Error() // says why: an authorization identity refused
		}
		if c.failed >= c.srv.cfg.MaxFailedLogins {
			c.closing = true
			msg += "; too many failed logins, closing connection"
		}
		c.fail("%s", msg)
		return
	}
	if err == nil && md == nil {
		err = errors.New("backend returned no maildrop")
	}
	if err != nil {
		metrics.Login("pop3", metrics.LoginUnavailable)
		c.sysTemp(mech+": login", err)
		return
	}
	opened := false
	defer func() { // also on panic: a maildrop not kept is released
		if !opened {
			if err := md.Close(); err != nil {
				c.log.Warn("pop3: closing maildrop failed", "err", err)
			}
		}
	}()
	msgs, err := md.List(c.cmd)
	if err != nil {
		metrics.Login("pop3", metrics.LoginUnavailable)
		c.sysTemp(mech+": listing maildrop", err)
		return
	}
	opened = true
	metrics.Login("pop3", metrics.LoginOK)
	if logins != nil {
		logins.LoginSucceeded(remote)
	}
	c.md, c.msgs, c.deleted = md, msgs, make([]bool, len(msgs))
	c.log = c.log.With("user", user)
	n, size := c.stat()
	c.log.Info("pop3: logged in", "mech", mech, "messages", n)
	c.ok("maildrop has %d messages (%d octets)", n, size)
}

func (c *session) authFailDelay(d time.Duration) {
	if d > 0 {
		retry.Sleep(c.ctx, d)
	}
}

// cmdList and cmdUIDL share a shape (RFC 1939 §5, §7): with an argument,
// one "+OK n value" line; without, a multi-line listing of the messages
// not marked deleted.
func (c *session) cmdList(args []string) {
	if !c.nargs("LIST", args, 0, 1) {
		return
	}
	if len(args) == 1 {
		if i, ok := c.msgArg("LIST", args[0]); ok {
			c.ok("%d %d", i+1, c.msgs[i].Size)
		}
		return
	}
	n, size := c.stat()
	c.ok("%d messages (%d octets)", n, size)
	for i, m := range c.msgs {
		if !c.deleted[i] {
			c.writeLine(strconv.Itoa(i+1) + " " + strconv.FormatInt(m.Size, 10))
		}
	}
	c.writeLine(".")
}

func (c *session) cmdUIDL(args []string) {
	if !c.nargs("UIDL", args, 0, 1) {
		return
	}
	if len(args) == 1 {
		if i, ok := c.msgArg("UIDL", args[0]); ok {
			c.ok("%d %s", i+1, c.msgs[i].UID)
		}
		return
	}
	c.ok("unique-id listing follows")
	for i, m := range c.msgs {
		if !c.deleted[i] {
			c.writeLine(strconv.Itoa(i+1) + " " + m.UID)
		}
	}
	c.writeLine(".")
}

// send streams message i for RETR (lines < 0) or TOP. Once "+OK" is out
// a failure cannot be reported in-band, so it ends the session; nothing
// is deleted, and the client will retry.
func (c *session) send(cmd string, i, lines int) error {
	m := c.msgs[i]
	rc, err := c.md.Open(c.cmd, m.UID)
	if err != nil {
		c.sysTemp(fmt.Sprintf("%s %d: opening message", cmd, i+1), err)
		return nil
	}
	defer rc.Close()
	if lines < 0 {
		c.ok("%d octets", m.Size)
	} else {
		c.ok("top of message %d follows", i+1)
	}
	dw := newDotWriter(c.w)
	if lines < 0 {
		_, err = io.Copy(dw, rc)
	} else {
		err = copyTop(dw, rc, lines)
	}
	if err == nil {
		err = dw.Close()
	}
	if err != nil {
		return fmt.Errorf("%s %d (uid %s): streaming message: %w", cmd, i+1, m.UID, err)
	}
	return nil
}

// quit ends the session. In the TRANSACTION state it enters the UPDATE
// state (RFC 1939 §6): only here are DELE marks applied.
func (c *session) quit() error {
	if c.md == nil {
		c.ok("%s Quill POP3 server signing off", c.srv.cfg.Hostname)
		return errQuit
	}
	var uids []string
	for i, m := range c.msgs {
		if c.deleted[i] {
			uids = append(uids, m.UID)
		}
	}
	if len(uids) > 0 {
		// Under the session's context, not the command's: a client may
		// pipeline DELE and QUIT and half-close, which looks like a
		// hang-up, and RFC 1939 §6 has the deletions happen once QUIT is
		// received. Shutdown's deadline still cancels it.
		if err := c.md.Delete(c.ctx, uids); err != nil {
			c.sysTemp("QUIT: some deleted messages not removed", err)
			return errQuit
		}
		c.log.Info("pop3: deleted messages", "count", len(uids))
	}
	n := len(c.msgs) - len(uids)
	c.ok("%s Quill POP3 server signing off (%d messages left)", c.srv.cfg.Hostname, n)
	return errQuit
}
