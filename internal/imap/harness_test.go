package imap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/xdg-go/scram"
)

// testAuth accepts the users in the map with their passwords; the real
// user manager (argon2id) is exercised end to end by tests/e2e.
type testAuth map[string]string

func (a testAuth) Login(ctx context.Context, user, password string) (*userdb.Profile, error) {
	if p, ok := a[user]; ok && p == password {
		return &userdb.Profile{Address: user}, nil
	}
	return nil, userdb.ErrPasswordMismatch
}

// SCRAMKeys derives keys from the test password, as setting it would.
func (a testAuth) SCRAMKeys(ctx context.Context, user string) (scram.StoredCredentials, error) {
	p, ok := a[user]
	if !ok {
		return scram.StoredCredentials{}, saslsrv.NotFound
	}
	keys, err := userdb.DeriveSCRAM(p)
	if err != nil {
		return scram.StoredCredentials{}, err
	}
	return userdb.ParseSCRAM(keys)
}

func (a testAuth) Proven(ctx context.Context, user string) (*userdb.Profile, error) {
	if _, ok := a[user]; ok {
		return &userdb.Profile{Address: user}, nil
	}
	return nil, userdb.ErrNotFound
}

const testUser, testPass = "u@example.org", "secret"

type env struct {
	t     *testing.T
	dir   string
	core  *core.Core
	store *proxy.IMAPStore
	srv   *Server
	addr  string
	// configure, if set, changes the server's Config before it starts.
	configure func(*Config)
}

// openCore opens a one-node core (the production store: the user's
// mailbox writer over the node's fragments) in dir, with the test user.
func openCore(tb testing.TB, dir string) *core.Core {
	tb.Helper()
	c, err := core.New(core.Options{DataDir: dir, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := c.Users.AddUser(context.Background(), testUser, testPass); err != nil && !errors.Is(err, userdb.ErrExists) {
		tb.Fatal(err)
	}
	return c
}

// deliverTo stores a message for the test user as SMTP would.
func deliverTo(tb testing.TB, c *core.Core, raw string) {
	tb.Helper()
	if err := c.Proxy.Deliver(context.Background(), []string{testUser}, []byte(raw)); err != nil {
		tb.Fatal(err)
	}
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir()}
	e.open()
	return e
}

// open (re)opens the store in e.dir and starts a server on it.
func (e *env) open() {
	t := e.t
	e.core = openCore(t, e.dir)
	e.store = &proxy.IMAPStore{P: e.core.Proxy}
	cfg := Config{AuthFailDelay: 10 * time.Millisecond, IdlePoll: time.Minute}
	if e.configure != nil {
		e.configure(&cfg)
	}
	e.srv = New(e.store, proxy.IMAPAuth{P: e.core.Proxy}, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	go e.srv.Serve(l)
	t.Cleanup(e.close)
}

func (e *env) close() {
	if e.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	e.srv.Shutdown(ctx)
	e.core.Close()
	e.srv = nil
}

// restart closes the server and the store and opens both again.
func (e *env) restart() {
	e.close()
	e.open()
}

func (e *env) deliver(raw string) {
	e.t.Helper()
	deliverTo(e.t, e.core, raw)
}

// client returns a logged-in library client.
func (e *env) client(opts *imapclient.Options) *imapclient.Client {
	e.t.Helper()
	c, err := imapclient.DialInsecure(e.addr, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	if err := c.Login(testUser, testPass).Wait(); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// raw is a line-level client, for checking exactly what the server sends
// and when.
type raw struct {
	t   *testing.T
	c   net.Conn
	r   *bufio.Reader
	tag int
}

func (e *env) raw(login bool) *raw {
	e.t.Helper()
	return rawAt(e.t, e.addr, login)
}

// rawAt is a raw connection to the server at addr.
func rawAt(t *testing.T, addr string, login bool) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &raw{t: t, c: c, r: bufio.NewReader(c)}
	if g := r.line(); !strings.HasPrefix(g, "* OK") {
		t.Fatalf("greeting %q", g)
	}
	if login {
		r.ok("LOGIN " + testUser + " " + testPass)
	}
	return r
}

// line reads one response, with any literals it contains inlined.
func (r *raw) line() string {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var sb strings.Builder
	for {
		l, err := r.r.ReadString('\n')
		if err != nil {
			r.t.Fatalf("read: %v (so far %q)", err, sb.String())
		}
		sb.WriteString(l)
		s := strings.TrimRight(l, "\r\n")
		if i := strings.LastIndexByte(s, '{'); i >= 0 && strings.HasSuffix(s, "}") {
			n, err := strconv.Atoi(strings.TrimSuffix(s[i+1:len(s)-1], "+"))
			if err == nil {
				buf := make([]byte, n)
				if _, err := io.ReadFull(r.r, buf); err != nil {
					r.t.Fatal(err)
				}
				sb.Write(buf)
				continue
			}
		}
		return strings.TrimRight(sb.String(), "\r\n")
	}
}

func (r *raw) send(s string) string {
	r.tag++
	tag := fmt.Sprintf("t%d", r.tag)
	fmt.Fprintf(r.c, "%s %s\r\n", tag, s)
	return tag
}

// cmd sends a command and returns its untagged responses and the tagged
// status line (without the tag).
func (r *raw) cmd(s string) (untagged []string, status string) {
	r.t.Helper()
	tag := r.send(s)
	return r.until(tag)
}

func (r *raw) until(tag string) (untagged []string, status string) {
	r.t.Helper()
	for {
		l := r.line()
		if strings.HasPrefix(l, tag+" ") {
			return untagged, l[len(tag)+1:]
		}
		untagged = append(untagged, l)
	}
}

func (r *raw) ok(s string) []string {
	r.t.Helper()
	u, st := r.cmd(s)
	if !strings.HasPrefix(st, "OK") {
		r.t.Fatalf("%s: %s (untagged %q)", s, st, u)
	}
	return u
}

func has(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}
