package pop3

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/xdg-go/scram"
)

// fakeBackend is an in-memory Backend: users with passwords, one maildrop
// each, and knobs to make calls fail.
type fakeBackend struct {
	passwords map[string]string
	boxes     map[string]*fakeBox
	loginErr  error // when set, every Login fails with it
}

type fakeMsg struct{ uid, body string }

type fakeBox struct {
	mu          sync.Mutex
	msgs        []fakeMsg
	listErr     error
	openErr     error
	readErr     error // when set, message reads fail with it after a few bytes
	deleteErr   error
	panicOnList bool
	deletes     [][]string // the uids of each Delete call
	closes      int
}

// SCRAMKeys derives keys from the test password, as setting it would.
func (b *fakeBackend) SCRAMKeys(_ context.Context, user string) (scram.StoredCredentials, error) {
	p, ok := b.passwords[user]
	if !ok {
		return scram.StoredCredentials{}, saslsrv.NotFound
	}
	keys, err := userdb.DeriveSCRAM(p)
	if err != nil {
		return scram.StoredCredentials{}, err
	}
	return userdb.ParseSCRAM(keys)
}

func (b *fakeBackend) Open(_ context.Context, user string) (Maildrop, error) {
	if b.loginErr != nil {
		return nil, b.loginErr
	}
	if _, ok := b.passwords[user]; !ok {
		return nil, fmt.Errorf("open %q: %w", user, ErrAuthFailed)
	}
	return fakeMaildrop{b.boxes[user]}, nil
}

func (b *fakeBackend) Login(_ context.Context, user, pass string) (Maildrop, error) {
	if b.loginErr != nil {
		return nil, b.loginErr
	}
	if p, ok := b.passwords[user]; !ok || p != pass {
		return nil, fmt.Errorf("login %q: %w", user, ErrAuthFailed)
	}
	return fakeMaildrop{b.boxes[user]}, nil
}

type fakeMaildrop struct{ box *fakeBox }

func (m fakeMaildrop) List(context.Context) ([]Message, error) {
	m.box.mu.Lock()
	defer m.box.mu.Unlock()
	if m.box.panicOnList {
		panic("fake maildrop: List exploded")
	}
	if m.box.listErr != nil {
		return nil, m.box.listErr
	}
	var out []Message
	for _, msg := range m.box.msgs {
		out = append(out, Message{UID: msg.uid, Size: int64(len(msg.body))})
	}
	return out, nil
}

func (m fakeMaildrop) Open(_ context.Context, uid string) (io.ReadCloser, error) {
	m.box.mu.Lock()
	defer m.box.mu.Unlock()
	if m.box.openErr != nil {
		return nil, m.box.openErr
	}
	for _, msg := range m.box.msgs {
		if msg.uid == uid {
			// Small reads exercise the dot writer's state across writes.
			var r io.Reader = &chunkReader{s: msg.body, n: 7}
			if m.box.readErr != nil {
				r = io.MultiReader(strings.NewReader(msg.body[:5]), iotest.ErrReader(m.box.readErr))
			}
			return io.NopCloser(r), nil
		}
	}
	return nil, fmt.Errorf("open %s: no such message", uid)
}

func (m fakeMaildrop) Delete(_ context.Context, uids []string) error {
	m.box.mu.Lock()
	defer m.box.mu.Unlock()
	if m.box.deleteErr != nil {
		return m.box.deleteErr
	}
	m.box.deletes = append(m.box.deletes, slices.Clone(uids))
	return nil
}

func (m fakeMaildrop) Close() error {
	m.box.mu.Lock()
	defer m.box.mu.Unlock()
	m.box.closes++
	return nil
}

func (b *fakeBox) state() (deletes [][]string, closes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.deletes), b.closes
}

// chunkReader returns at most n bytes per Read.
type chunkReader struct {
	s string
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.s)
	r.s = r.s[k:]
	return k, nil
}

const (
	msg1 = "Subject: one\r\n\r\nhello\r\n"
	// msg2 has lines that need dot-stuffing, 8-bit bytes and a last line
	// without CRLF.
	msg2 = "Subject: dots\r\n\r\n.hidden\r\n..two\r\n.\r\nmid.dot\r\n\xff\xfe 8-bit \x80\r\nlast line no crlf"
	msg3 = "Subject: three\r\nX-Test: y\r\n\r\nl1\r\nl2\r\nl3\r\n"
)

func newFake() (*fakeBackend, *fakeBox) {
	box := &fakeBox{msgs: []fakeMsg{{"u1", msg1}, {"u2", msg2}, {"u3", msg3}}}
	return &fakeBackend{
		passwords: map[string]string{"alice": "secret", "bob": "pass word"},
		boxes:     map[string]*fakeBox{"alice": box, "bob": {}},
	}, box
}

// logRecorder is a slog.Handler that keeps record messages.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}

func (h *logRecorder) has(sub string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

type testServer struct {
	*Server
	addr  string
	logs  *logRecorder
	serve chan error
}

func startServer(t *testing.T, b Backend, cfg Config) *testServer {
	t.Helper()
	if cfg.AuthFailDelay == 0 {
		cfg.AuthFailDelay = -1
	}
	cfg.Hostname = "pop.test"
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: New(b, cfg), addr: l.Addr().String(), logs: logs, serve: make(chan error, 1)}
	go func() { ts.serve <- ts.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ts.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-ts.serve; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return ts
}

type client struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	c := &client{t: t, conn: conn, r: bufio.NewReader(conn)}
	if g := c.line(); !strings.HasPrefix(g, "+OK pop.test ") {
		t.Fatalf("greeting %q", g)
	}
	return c
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s+"\r\n"); err != nil {
		c.t.Fatalf("send %q: %v", s, err)
	}
}

func (c *client) line() string {
	c.t.Helper()
	l, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reading reply: %v (got %q)", err, l)
	}
	if !strings.HasSuffix(l, "\r\n") {
		c.t.Fatalf("reply %q does not end in CRLF", l)
	}
	return strings.TrimSuffix(l, "\r\n")
}

// do sends a command and checks that the reply starts with want.
func (c *client) do(cmd, want string) string {
	c.t.Helper()
	c.send(cmd)
	return c.expect(cmd, want)
}

func (c *client) expect(cmd, want string) string {
	c.t.Helper()
	got := c.line()
	if !strings.HasPrefix(got, want) {
		c.t.Fatalf("%q: reply %q, want prefix %q", cmd, got, want)
	}
	return got
}

// challenge reads a SASL challenge ("+ base64") and decodes it.
func (c *client) challenge(t *testing.T) string {
	t.Helper()
	l := strings.TrimSuffix(c.line(), "\r\n")
	text, ok := strings.CutPrefix(l, "+ ")
	if !ok {
		t.Fatalf("want a SASL challenge, got %q", l)
	}
	b, err := base64.StdEncoding.DecodeString(text)
	if err != nil {
		t.Fatalf("challenge %q: %v", l, err)
	}
	return string(b)
}

// multi reads the body of a multi-line reply raw (CRLFs kept), undoing
// the dot-stuffing.
func (c *client) multi() string {
	c.t.Helper()
	var b strings.Builder
	for {
		l, err := c.r.ReadString('\n')
		if err != nil {
			c.t.Fatalf("reading multi-line reply: %v (so far %q)", err, b.String())
		}
		if !strings.HasSuffix(l, "\r\n") {
			c.t.Fatalf("line %q does not end in CRLF", l)
		}
		if l == ".\r\n" {
			return b.String()
		}
		b.WriteString(strings.TrimPrefix(l, "."))
	}
}

func (c *client) login() {
	c.t.Helper()
	c.do("USER alice", "+OK")
	c.do("PASS secret", "+OK maildrop has 3 messages")
}

// expectClosed checks the server closed the connection with no more data.
func (c *client) expectClosed() {
	c.t.Helper()
	if b, err := io.ReadAll(c.r); err != nil || len(b) != 0 {
		c.t.Fatalf("after close: read %q, %v; want EOF", b, err)
	}
}

func TestUserPassSession(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.do("CAPA", "+OK")
	if got, want := c.multi(), "TOP\r\nUIDL\r\nRESP-CODES\r\nAUTH-RESP-CODE\r\nPIPELINING\r\nUSER\r\nSASL SCRAM-SHA-256 PLAIN LOGIN\r\nIMPLEMENTATION Quill\r\n"; got != want {
		t.Errorf("CAPA = %q, want %q", got, want)
	}
	c.do("user alice", "+OK")
	size := len(msg1) + len(msg2) + len(msg3)
	c.do("pass secret", fmt.Sprintf("+OK maildrop has 3 messages (%d octets)", size))
	c.do("STAT", fmt.Sprintf("+OK 3 %d", size))
	c.do("list", "+OK 3 messages")
	if got, want := c.multi(), fmt.Sprintf("1 %d\r\n2 %d\r\n3 %d\r\n", len(msg1), len(msg2), len(msg3)); got != want {
		t.Errorf("LIST = %q, want %q", got, want)
	}
	c.do("LIST 2", fmt.Sprintf("+OK 2 %d", len(msg2)))
	c.do("UIDL", "+OK")
	if got, want := c.multi(), "1 u1\r\n2 u2\r\n3 u3\r\n"; got != want {
		t.Errorf("UIDL = %q, want %q", got, want)
	}
	c.do("Uidl 3", "+OK 3 u3")
	c.do("NOOP", "+OK")
	c.do("CAPA", "+OK")
	c.multi()
	c.do("QUIT", "+OK pop.test Quill POP3 server signing off (3 messages left)")
	c.expectClosed()
	waitClosed(t, box, 1)
	if deletes, _ := box.state(); len(deletes) != 0 {
		t.Errorf("Delete called %v with nothing marked", deletes)
	}
}

// waitClosed waits until the session has released the maildrop.
func waitClosed(t *testing.T, box *fakeBox, want int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, n := box.state(); n >= want {
			if n > want {
				t.Fatalf("maildrop closed %d times, want %d", n, want)
			}
			return
		}
	}
	t.Fatalf("maildrop not closed")
}

func TestPasswordWithSpaces(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.do("USER bob", "+OK")
	c.do("PASS pass word", "+OK maildrop has 0 messages (0 octets)")
	c.do("LIST", "+OK 0 messages")
	if got := c.multi(); got != "" {
		t.Errorf("LIST of empty maildrop = %q", got)
	}
}

func TestQuitBeforeLogin(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.do("QUIT", "+OK")
	c.expectClosed()
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestAuthPlain(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})

	t.Run("initial response", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.do("AUTH PLAIN "+b64("\x00alice\x00secret"), "+OK maildrop has 3 messages")
		c.do("STAT", "+OK 3 ")
	})
	t.Run("continuation", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.send("auth plain")
		if got := c.line(); got != "+ " {
			t.Fatalf("continuation %q, want %q", got, "+ ")
		}
		c.send(b64("alice\x00alice\x00secret"))
		c.expect("response", "+OK maildrop has 3 messages")
	})
	t.Run("cancel", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.send("AUTH PLAIN")
		c.expect("AUTH PLAIN", "+ ")
		c.send("*")
		c.expect("*", "-ERR AUTH PLAIN: cancelled")
		c.do("STAT", "-ERR STAT not allowed before login")
	})
	t.Run("login", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.send("AUTH LOGIN")
		c.expect("AUTH LOGIN", "+ "+b64("Username:"))
		c.send(b64("alice"))
		c.expect("user name", "+ "+b64("Password:"))
		c.send(b64("secret"))
		c.expect("password", "+OK maildrop has 3 messages")
	})
	t.Run("login with initial response", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.send("AUTH LOGIN " + b64("alice"))
		c.expect("AUTH LOGIN", "+ "+b64("Password:"))
		c.send(b64("wrong"))
		c.expect("password", "-ERR [AUTH] AUTH LOGIN: authentication failed")
		c.send("AUTH LOGIN")
		c.expect("AUTH LOGIN", "+ "+b64("Username:"))
		c.send("*")
		c.expect("*", "-ERR AUTH LOGIN: cancelled")
	})
	for _, tc := range []struct{ name, user, pass, want string }{
		{"scram", "alice", "secret", "+OK maildrop has 3 messages"},
		{"scram wrong password", "alice", "wrong", "-ERR [AUTH] AUTH SCRAM-SHA-256: authentication failed"},
		{"scram unknown user", "nobody", "secret", "-ERR [AUTH] AUTH SCRAM-SHA-256: authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, ts.addr)
			cl, err := scram.SHA256.NewClient(tc.user, tc.pass, "")
			if err != nil {
				t.Fatal(err)
			}
			conv := cl.NewConversation()
			first, _ := conv.Step("")
			c.send("AUTH SCRAM-SHA-256 " + b64(first))
			serverFirst := c.challenge(t)
			final, err := conv.Step(serverFirst)
			if err != nil {
				t.Fatal(err)
			}
			c.send(b64(final))
			if !strings.HasPrefix(tc.want, "+OK") {
				c.expect("client-final", tc.want)
				return
			}
			serverFinal := c.challenge(t)
			if _, err := conv.Step(serverFinal); err != nil || !conv.Valid() {
				t.Fatalf("server's final message %q does not prove it knows the keys: %v", serverFinal, err)
			}
			c.send("")
			c.expect("empty response", tc.want)
		})
	}
	t.Run("scram malformed", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.do("AUTH SCRAM-SHA-256 "+b64("x,,n=alice,r=abc"), "-ERR AUTH SCRAM-SHA-256: malformed SASL message")
		c.do("AUTH SCRAM-SHA-256 "+b64("n,a=bob,n=alice,r=abc"), `-ERR [AUTH] AUTH SCRAM-SHA-256: authentication failed: may not act as "bob"`)
	})
	t.Run("errors", func(t *testing.T) {
		c := dial(t, ts.addr)
		c.do("AUTH", "+OK")
		if got := c.multi(); got != "SCRAM-SHA-256\r\nPLAIN\r\nLOGIN\r\n" {
			t.Errorf("AUTH mechanism list %q", got)
		}
		c.do("AUTH CRAM-MD5", `-ERR AUTH: unsupported SASL mechanism "CRAM-MD5"`)
		c.do("AUTH PLAIN !!!", "-ERR AUTH PLAIN: response is not valid base64")
		c.do("AUTH PLAIN =", "-ERR AUTH PLAIN: malformed SASL message")
		c.do("AUTH PLAIN "+b64("alice\x00secret"), "-ERR AUTH PLAIN: malformed SASL message")
		c.do("AUTH PLAIN "+b64("\x00alice\x00wrong"), "-ERR [AUTH] AUTH PLAIN: authentication failed")
		c.do("AUTH PLAIN "+b64("bob\x00alice\x00secret"), `-ERR [AUTH] AUTH PLAIN: authentication failed: may not act as "bob"`)
		c.do("AUTH PLAIN "+b64("\x00alice\x00secret"), "+OK")
		c.do("AUTH PLAIN "+b64("\x00alice\x00secret"), "-ERR AUTH not allowed after login")
	})
}

func TestWrongPasswordDelay(t *testing.T) {
	b, _ := newFake()
	const delay = 50 * time.Millisecond
	ts := startServer(t, b, Config{AuthFailDelay: delay})
	c := dial(t, ts.addr)
	c.do("USER alice", "+OK")
	start := time.Now()
	c.do("PASS nope", "-ERR [AUTH] PASS: authentication failed")
	if d := time.Since(start); d < delay {
		t.Errorf("wrong password answered after %v, want at least %v", d, delay)
	}
	c.do("PASS secret", "-ERR PASS: send USER first")
	c.do("USER nobody", "+OK")
	c.do("PASS secret", "-ERR [AUTH]")
	c.login()
	if !ts.logs.has("login failed") {
		t.Error("failed login not logged")
	}
}

func TestRetrDotStuffing(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.send("RETR 2")
	c.expect("RETR 2", fmt.Sprintf("+OK %d octets", len(msg2)))
	// The exact bytes on the wire.
	want := "Subject: dots\r\n\r\n..hidden\r\n...two\r\n..\r\nmid.dot\r\n\xff\xfe 8-bit \x80\r\nlast line no crlf\r\n.\r\n"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c.r, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("RETR 2 wire bytes\n got %q\nwant %q", got, want)
	}
	// Round trip: unstuffed, the message comes back byte for byte (plus
	// the CRLF its last line lacked).
	c.do("RETR 2", "+OK")
	if got := c.multi(); got != msg2+"\r\n" {
		t.Errorf("RETR 2 round trip %q", got)
	}
	c.do("RETR 1", "+OK")
	if got := c.multi(); got != msg1 {
		t.Errorf("RETR 1 = %q, want %q", got, msg1)
	}
	c.do("RETR 4", "-ERR RETR: no such message 4, maildrop has 3")
	c.do("RETR 0", "-ERR RETR: no such message 0")
	c.do("RETR 99999999999999999999999", "-ERR RETR: no such message")
	c.do("RETR x", `-ERR RETR: invalid message number "x"`)
	c.do("RETR", "-ERR RETR: missing argument")
}

func TestTop(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	for _, tc := range []struct{ cmd, want string }{
		{"TOP 3 0", "Subject: three\r\nX-Test: y\r\n\r\n"},
		{"TOP 3 1", "Subject: three\r\nX-Test: y\r\n\r\nl1\r\n"},
		{"top 3 99", msg3},
		{"TOP 3 99999999999999999999999", msg3},
		{"TOP 2 1", "Subject: dots\r\n\r\n.hidden\r\n"},
		{"TOP 2 100", msg2 + "\r\n"},
	} {
		c.do(tc.cmd, "+OK")
		if got := c.multi(); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.cmd, got, tc.want)
		}
	}
	c.do("TOP 1", "-ERR TOP: missing argument")
	c.do("TOP 1 -1", `-ERR TOP: invalid line count "-1"`)
	c.do("TOP 9 1", "-ERR TOP: no such message 9")
}

func TestDeleRset(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 1", "+OK message 1 deleted")
	c.do("STAT", fmt.Sprintf("+OK 2 %d", len(msg2)+len(msg3)))
	c.do("RSET", fmt.Sprintf("+OK maildrop has 3 messages (%d octets)", len(msg1)+len(msg2)+len(msg3)))
	c.do("RETR 1", "+OK")
	c.multi()
	c.do("QUIT", "+OK")
	c.expectClosed()
	waitClosed(t, box, 1)
	if deletes, _ := box.state(); len(deletes) != 0 {
		t.Errorf("Delete called %v after RSET", deletes)
	}
}

func TestDeleQuit(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 1", "+OK message 1 deleted")
	c.do("dele 3", "+OK message 3 deleted")
	c.do("DELE 3", "-ERR DELE: message 3 already deleted")
	c.do("LIST 1", "-ERR LIST: message 1 already deleted")
	c.do("UIDL 3", "-ERR UIDL: message 3 already deleted")
	c.do("RETR 1", "-ERR RETR: message 1 already deleted")
	c.do("TOP 1 0", "-ERR TOP: message 1 already deleted")
	c.do("STAT", fmt.Sprintf("+OK 1 %d", len(msg2)))
	c.do("LIST", fmt.Sprintf("+OK 1 messages (%d octets)", len(msg2)))
	if got, want := c.multi(), fmt.Sprintf("2 %d\r\n", len(msg2)); got != want {
		t.Errorf("LIST = %q, want %q", got, want)
	}
	c.do("UIDL", "+OK")
	if got := c.multi(); got != "2 u2\r\n" {
		t.Errorf("UIDL = %q", got)
	}
	c.do("QUIT", "+OK pop.test Quill POP3 server signing off (1 messages left)")
	c.expectClosed()
	waitClosed(t, box, 1)
	deletes, _ := box.state()
	if want := [][]string{{"u1", "u3"}}; fmt.Sprint(deletes) != fmt.Sprint(want) {
		t.Errorf("Delete calls %v, want %v", deletes, want)
	}
}

func TestDeleDroppedConnectionKeepsMail(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 1", "+OK")
	c.do("DELE 2", "+OK")
	c.conn.Close()
	waitClosed(t, box, 1)
	if deletes, _ := box.state(); len(deletes) != 0 {
		t.Errorf("Delete called %v without QUIT (RFC 1939 §6)", deletes)
	}
}

func TestQuitDeleteFails(t *testing.T) {
	b, box := newFake()
	box.deleteErr = errors.New("mailbox manager unreachable")
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 2", "+OK")
	c.do("QUIT", "-ERR [SYS/TEMP] QUIT: some deleted messages not removed; try again later (reference ")
	c.expectClosed()
}

func TestBackendErrors(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})

	b.loginErr = errors.New("user manager\r\nunreachable")
	c := dial(t, ts.addr)
	c.do("USER alice", "+OK")
	// The cause stays in the log: a client sees the command and a
	// reference, never internal errors.
	if got := c.do("PASS secret", "-ERR [SYS/TEMP] PASS: login; try again later (reference "); strings.Contains(got, "unreachable") {
		t.Errorf("reply %q shows the internal error", got)
	}
	b.loginErr = nil

	box.listErr = errors.New("fragment list failed")
	c.do("AUTH PLAIN "+b64("\x00alice\x00secret"), "-ERR [SYS/TEMP] AUTH PLAIN: listing maildrop; try again later")
	waitClosed(t, box, 1)
	box.listErr = nil

	c.login()
	box.openErr = errors.New("disk on fire")
	c.do("RETR 1", "-ERR [SYS/TEMP] RETR 1: opening message; try again later")
	c.do("TOP 1 1", "-ERR [SYS/TEMP] TOP 1: opening message; try again later")
	box.openErr = nil
	c.do("RETR 1", "+OK")
	c.multi()
}

func TestRetrFailsMidStream(t *testing.T) {
	b, box := newFake()
	box.readErr = errors.New("fragment vanished")
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 2", "+OK")
	// After "+OK" an error cannot be reported in-band: the server must cut
	// the connection rather than end the reply with ".", and delete nothing.
	c.do("RETR 1", "+OK")
	if b, _ := io.ReadAll(c.r); string(b) != msg1[:5] {
		t.Errorf("after failed RETR read %q, want %q then close", b, msg1[:5])
	}
	waitClosed(t, box, 1)
	if deletes, _ := box.state(); len(deletes) != 0 {
		t.Errorf("Delete called %v", deletes)
	}
	if !ts.logs.has("session ended by error") {
		t.Error("stream failure not logged")
	}
}

func TestBadCommandsContinue(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	for _, tc := range []struct{ cmd, want string }{
		{"FROB", "-ERR unknown command FROB"},
		{"XYZZY 1", `-ERR invalid command keyword "XYZZY"`},
		{"", "-ERR empty command line"},
		{"   ", "-ERR empty command line"},
		{" STAT", `-ERR invalid command keyword ""`},
		{"ST\x00T", "-ERR command line contains control character 0x00"},
		{"STAT", "-ERR STAT not allowed before login"},
		{"PASS secret", "-ERR PASS: send USER first"},
		{"USER", "-ERR USER: missing argument"},
		{"USER a b", "-ERR USER: too many arguments"},
		{"APOP alice c4c9334bac560ecc979e58001b3e22fb", "-ERR APOP not supported"},
		{"CAPA x", "-ERR CAPA: too many arguments"},
	} {
		c.do(tc.cmd, tc.want)
	}
	c.login()
	for _, tc := range []struct{ cmd, want string }{
		{"FROB", "-ERR unknown command FROB"},
		{"USER alice", "-ERR USER not allowed after login"},
		{"STAT 1", "-ERR STAT: too many arguments"},
		{"LIST 1 2", "-ERR LIST: too many arguments"},
		{"DELE", "-ERR DELE: missing argument"},
		{"DELE +1", `-ERR DELE: invalid message number "+1"`},
		{"NOOP x", "-ERR NOOP: too many arguments"},
	} {
		c.do(tc.cmd, tc.want)
	}
	c.do("STAT", "+OK 3")
}

func TestTooManyBadCommands(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{MaxBadCommands: 3})
	c := dial(t, ts.addr)
	c.do("FROB", "-ERR")
	c.do("USER alice", "+OK")
	c.do("PASS wrong", "-ERR [AUTH]")
	c.do("FROB", "-ERR unknown command FROB; too many bad commands, closing connection")
	c.expectClosed()
}

func TestLineTooLong(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.do("USER "+strings.Repeat("x", 5000), "-ERR line too long: limit is 1024 octets")
	c.do("USER "+strings.Repeat("x", 1024-len("USER \r\n")), "+OK")
	c.do("USER "+strings.Repeat("x", 1024-len("USER \r\n")+1), "-ERR line too long")
	c.send("AUTH PLAIN")
	c.expect("AUTH PLAIN", "+ ")
	c.do(strings.Repeat("A", 2000), "-ERR AUTH PLAIN: response too long")
	c.login()
}

func TestPipelining(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	batch := "USER alice\r\nPASS secret\r\nSTAT\r\nLIST\r\nUIDL 1\r\nRETR 1\r\nBOGUS\r\nDELE 1\r\nSTAT\r\nNOOP\r\nQUIT\r\n"
	if _, err := io.WriteString(c.conn, batch); err != nil {
		t.Fatal(err)
	}
	c.expect("USER", "+OK")
	c.expect("PASS", "+OK maildrop has 3")
	c.expect("STAT", "+OK 3 ")
	c.expect("LIST", "+OK 3 messages")
	c.multi()
	c.expect("UIDL 1", "+OK 1 u1")
	c.expect("RETR 1", "+OK")
	if got := c.multi(); got != msg1 {
		t.Errorf("RETR 1 = %q", got)
	}
	c.expect("BOGUS", "-ERR")
	c.expect("DELE 1", "+OK")
	c.expect("STAT", "+OK 2 ")
	c.expect("NOOP", "+OK")
	c.expect("QUIT", "+OK")
	c.expectClosed()
}

func TestIdleTimeout(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{IdleTimeout: 100 * time.Millisecond})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 1", "+OK")
	start := time.Now()
	// RFC 1939 §3: autologout closes without a reply and deletes nothing.
	c.expectClosed()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("idle session closed after %v", d)
	}
	waitClosed(t, box, 1)
	if deletes, _ := box.state(); len(deletes) != 0 {
		t.Errorf("Delete called %v on autologout", deletes)
	}
}

func TestSessionPanicIsContained(t *testing.T) {
	b, box := newFake()
	box.panicOnList = true
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.do("USER alice", "+OK")
	c.send("PASS secret")
	c.expectClosed()
	if !ts.logs.has("session panic") {
		t.Error("panic not logged")
	}
	box.mu.Lock()
	box.panicOnList = false
	box.mu.Unlock()
	c = dial(t, ts.addr)
	c.login()
}

func TestShutdownDrains(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	if n := ts.ActiveSessions(); n != 1 {
		t.Errorf("ActiveSessions = %d, want 1", n)
	}
	done := make(chan error, 1)
	go func() { done <- ts.Shutdown(context.Background()) }()
	if err := <-ts.serve; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v, want ErrServerClosed", err)
	}
	ts.serve <- ErrServerClosed // for the cleanup
	if _, err := net.Dial("tcp", ts.addr); err == nil {
		t.Error("new connection accepted during shutdown")
	}
	// The open session still works and its QUIT still deletes.
	c.do("DELE 2", "+OK")
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v before the session ended", err)
	default:
	}
	c.do("QUIT", "+OK")
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if deletes, _ := box.state(); fmt.Sprint(deletes) != "[[u2]]" {
		t.Errorf("Delete calls %v, want [[u2]]", deletes)
	}
	if n := ts.ActiveSessions(); n != 0 {
		t.Errorf("ActiveSessions = %d after Shutdown", n)
	}
}

func TestShutdownDeadlineClosesSessions(t *testing.T) {
	b, box := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.login()
	c.do("DELE 1", "+OK")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ts.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	c.expectClosed()
	waitClosed(t, box, 1)
	if deletes, _ := box.state(); len(deletes) != 0 {
		t.Errorf("Delete called %v for a session cut off by shutdown", deletes)
	}
}

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		line    string
		cmd     string
		args    []string
		wantErr string
	}{
		{line: "STAT", cmd: "STAT"},
		{line: "stat", cmd: "STAT"},
		{line: "LIST 1", cmd: "LIST", args: []string{"1"}},
		{line: "top  1   2 ", cmd: "TOP", args: []string{"1", "2"}},
		{line: "PASS  two  spaces ", cmd: "PASS", args: []string{" two  spaces "}},
		{line: "PASS", cmd: "PASS"},
		{line: "USER \xc3\xa9l\xc3\xa8ve", cmd: "USER", args: []string{"\xc3\xa9l\xc3\xa8ve"}},
		{line: "", wantErr: "empty command line"},
		{line: "  ", wantErr: "empty command line"},
		{line: "AB", wantErr: "invalid command keyword"},
		{line: "ABCDE", wantErr: "invalid command keyword"},
		{line: "ST4T", wantErr: "invalid command keyword"},
		{line: "LIST\t1", wantErr: "control character 0x09"},
		{line: "LIST 1\r", wantErr: "control character 0x0d"},
		{line: "NOOP\x7f", wantErr: "control character 0x7f"},
	} {
		cmd, args, err := parseCommand([]byte(tc.line))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseCommand(%q) error = %v, want %q", tc.line, err, tc.wantErr)
			}
			continue
		}
		if err != nil || cmd != tc.cmd || !slices.Equal(args, tc.args) {
			t.Errorf("parseCommand(%q) = %q, %q, %v; want %q, %q", tc.line, cmd, args, err, tc.cmd, tc.args)
		}
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{"STAT", "LIST 1", "TOP 1 10", "PASS a b c", "AUTH PLAIN =", "", " ", "X\x00", "retr  7 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		cmd, args, err := parseCommand(line)
		if err != nil {
			if cmd != "" || args != nil {
				t.Fatalf("error %v with results %q %q", err, cmd, args)
			}
			return
		}
		if len(cmd) < 3 || len(cmd) > 4 || !isLetters([]byte(cmd)) || strings.ToUpper(cmd) != cmd {
			t.Fatalf("bad keyword %q", cmd)
		}
		if bytes.ContainsFunc(line, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("accepted control character in %q", line)
		}
		for _, a := range args {
			if a == "" || (cmd != "PASS" && strings.Contains(a, " ")) {
				t.Fatalf("bad argument %q in %q", a, args)
			}
		}
	})
}

// pipeConn is a net.Conn that reads a fixed client session and discards
// what the server writes.
type pipeConn struct {
	r io.Reader
}

func (p *pipeConn) Read(b []byte) (int, error)       { return p.r.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error)      { return len(b), nil }
func (p *pipeConn) Close() error                     { return nil }
func (p *pipeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (p *pipeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (p *pipeConn) SetDeadline(time.Time) error      { return nil }
func (p *pipeConn) SetReadDeadline(time.Time) error  { return nil }
func (p *pipeConn) SetWriteDeadline(time.Time) error { return nil }

func FuzzSession(f *testing.F) {
	for _, s := range []string{
		"USER alice\r\nPASS secret\r\nSTAT\r\nLIST\r\nRETR 2\r\nTOP 3 1\r\nDELE 1\r\nRSET\r\nDELE 2\r\nQUIT\r\n",
		"AUTH PLAIN\r\n" + b64("\x00alice\x00secret") + "\r\nUIDL\r\nRETR 1\r\n",
		"AUTH PLAIN " + b64("\x00alice\x00secret") + "\r\nTOP 2 0\r\nDELE 3\r\nUIDL 3\r\n",
		"CAPA\r\nAUTH\r\nAUTH PLAIN\r\n*\r\nAPOP a b\r\n\x00\r\n\n\n",
		"USER alice\nPASS secret\nLIST 99999999999999999999\nTOP 1 x\n" + strings.Repeat("A", 1100),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		b, _ := newFake()
		logs := &logRecorder{}
		s := New(b, Config{Hostname: "fuzz", AuthFailDelay: -1, MaxBadCommands: 1 << 20, Logger: slog.New(logs)})
		sess := s.newSession(&pipeConn{r: bytes.NewReader(in)})
		done := make(chan struct{})
		go func() {
			s.serveSession(sess)
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("session did not end at end of input")
		}
		if logs.has("panic") {
			t.Fatalf("session panicked on %q", in)
		}
		if n := s.ActiveSessions(); n != 0 {
			t.Fatalf("%d sessions still active", n)
		}
	})
}

// TestSCRAMFromALockedOutAddress: an address locked out gets no SCRAM
// exchange at all, so it cannot learn from the server's answer to a proof
// whether a guess was right.
func TestSCRAMFromALockedOutAddress(t *testing.T) {
	b, _ := newFake()
	g := guard.New(guard.Limits{LockoutAfter: 1, LockoutFor: time.Minute, AuthFailDelay: time.Millisecond, AuthMaxDelay: time.Millisecond}, nil)
	ts := startServer(t, b, Config{Logins: g})
	c := dial(t, ts.addr)
	c.do("USER alice", "+OK")
	c.do("PASS wrong", "-ERR [AUTH]")
	cl, _ := scram.SHA256.NewClient("alice", "secret", "")
	first, _ := cl.NewConversation().Step("")
	c.do("AUTH SCRAM-SHA-256 "+b64(first), "-ERR [SYS/TEMP] AUTH SCRAM-SHA-256: too many failed logins")
	c.do("AUTH PLAIN "+b64("\x00alice\x00secret"), "-ERR [SYS/TEMP]")
}
