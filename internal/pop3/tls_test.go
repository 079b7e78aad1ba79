package pop3

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/tlscert"
)

// testTLS returns a server config with a fresh self-signed certificate for
// localhost and a client config that trusts exactly that certificate.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	certPEM, keyPEM, err := tlscert.SelfSigned("localhost", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool, ServerName: "localhost"}
}

// neverPlaintext treats every connection as coming over a network.
func neverPlaintext(net.Conn) bool { return false }

func TestSTLSThenLogin(t *testing.T) {
	b, _ := newFake()
	srvTLS, cliTLS := testTLS(t)
	ts := startServer(t, b, Config{TLSConfig: srvTLS, PlaintextAuth: neverPlaintext})
	c := dial(t, ts.addr)

	c.do("CAPA", "+OK")
	caps := c.multi()
	if !strings.Contains(caps, "STLS\r\n") || strings.Contains(caps, "USER") || strings.Contains(caps, "SASL") {
		t.Fatalf("CAPA before TLS = %q, want STLS and neither USER nor SASL", caps)
	}
	c.do("USER alice", "-ERR USER: a password needs TLS first")
	c.do("AUTH PLAIN "+b64("\x00alice\x00secret"), "-ERR AUTH: a password needs TLS first")

	c.do("STLS", "+OK")
	tc := tls.Client(c.conn, cliTLS)
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake after STLS: %v", err)
	}
	c.conn, c.r = tc, bufio.NewReader(tc)
	c.do("CAPA", "+OK")
	caps = c.multi()
	if strings.Contains(caps, "STLS") || !strings.Contains(caps, "USER\r\n") || !strings.Contains(caps, "SASL SCRAM-SHA-256 PLAIN LOGIN") {
		t.Fatalf("CAPA under TLS = %q, want USER and SASL PLAIN and no STLS", caps)
	}
	c.do("STLS", "-ERR STLS: TLS is already on")
	c.login()
	c.do("QUIT", "+OK")
}

func TestSTLSWithDataPipelinedAfterItCloses(t *testing.T) {
	b, _ := newFake()
	srvTLS, _ := testTLS(t)
	ts := startServer(t, b, Config{TLSConfig: srvTLS, PlaintextAuth: neverPlaintext})
	c := dial(t, ts.addr)
	// A man in the middle's injected command rides behind STLS in the
	// same packet; it must not run under TLS.
	c.send("STLS\r\nUSER alice")
	c.expect("STLS", "-ERR STLS: data after STLS")
	c.expectClosed()
}

func TestSTLSNotOfferedWithoutACertificate(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{})
	c := dial(t, ts.addr)
	c.do("CAPA", "+OK")
	if caps := c.multi(); strings.Contains(caps, "STLS") {
		t.Fatalf("CAPA = %q offers STLS with no TLS config", caps)
	}
	c.do("STLS", "-ERR STLS: TLS is not offered here")
	c.login()
	c.do("STLS", "-ERR STLS not allowed after login")
}

func TestImplicitTLSListenerAllowsLogin(t *testing.T) {
	b, _ := newFake()
	srvTLS, cliTLS := testTLS(t)
	cfg := Config{TLSConfig: srvTLS, PlaintextAuth: neverPlaintext, Hostname: "pop.test", AuthFailDelay: -1}
	s := New(b, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(tls.NewListener(l, srvTLS))
	defer s.Shutdown(t.Context())
	conn, err := tls.Dial("tcp", l.Addr().String(), cliTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := &client{t: t, conn: conn, r: bufio.NewReader(conn)}
	c.expect("greeting", "+OK pop.test")
	c.do("CAPA", "+OK")
	if caps := c.multi(); strings.Contains(caps, "STLS") || !strings.Contains(caps, "USER") {
		t.Fatalf("CAPA on POP3S = %q, want USER and no STLS", caps)
	}
	c.login()
}

func TestFailedLoginsCloseTheConnection(t *testing.T) {
	b, _ := newFake()
	ts := startServer(t, b, Config{MaxFailedLogins: 3})
	c := dial(t, ts.addr)
	for i := 0; i < 2; i++ {
		c.do("USER alice", "+OK")
		c.do("PASS wrong", "-ERR [AUTH] PASS: authentication failed")
	}
	c.do("USER alice", "+OK")
	c.do("PASS wrong", "-ERR [AUTH] PASS: authentication failed; too many failed logins, closing connection")
	c.expectClosed()
}

// FuzzSTLS drives the STLS state change (RFC 2595 §4) with arbitrary
// commands before it and arbitrary commands under TLS after it, over a
// real connection: no input may panic the server or leave a session
// behind, and a login before TLS is always refused (the server treats
// every connection as coming over a network).
func FuzzSTLS(f *testing.F) {
	for _, s := range [][2]string{
		{"CAPA\r\n", "USER alice\r\nPASS secret\r\nSTAT\r\n"},
		{"USER alice\r\nPASS secret\r\n", "AUTH PLAIN " + b64("\x00alice\x00secret") + "\r\nLIST\r\n"},
		{"STLS\r\nCAPA\r\n", "STLS\r\n"},
		{"AUTH LOGIN\r\n", "AUTH LOGIN\r\n" + b64("alice") + "\r\n" + b64("secret") + "\r\nRETR 1\r\n"},
		{"", "AUTH SCRAM-SHA-256 " + b64("n,,n=alice,r=abc") + "\r\n*\r\n"},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	certPEM, keyPEM, err := tlscert.SelfSigned("localhost", time.Now(), time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	cert, _ := tls.X509KeyPair(certPEM, keyPEM)
	logs := &logRecorder{}
	b, _ := newFake()
	srv := New(b, Config{Hostname: "fuzz", AuthFailDelay: -1, MaxBadCommands: 1 << 20, Logger: slog.New(logs),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, PlaintextAuth: neverPlaintext})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(context.Background())

	f.Fuzz(func(t *testing.T, before, after []byte) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(before)
		c.Write([]byte("\r\nSTLS\r\n"))
		r := bufio.NewReader(c)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return // closed (pipelined data after an STLS in before) or timed out
			}
			if strings.HasPrefix(l, "+OK maildrop") {
				t.Fatalf("login before TLS accepted: %q", before)
			}
			if strings.HasPrefix(l, "+OK begin TLS") {
				break
			}
		}
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			return // the STLS in before took the handshake's place
		}
		tc.Write(after)
		tc.Write([]byte("\r\nQUIT\r\n"))
		io.Copy(io.Discard, tc)
		if logs.has("panic") {
			t.Fatalf("session panicked on %q / %q", before, after)
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for srv.ActiveSessions() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.ActiveSessions(); n != 0 {
		f.Fatalf("%d sessions still active", n)
	}
}
