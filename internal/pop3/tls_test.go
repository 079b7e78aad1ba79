package pop3

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
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
	if strings.Contains(caps, "STLS") || !strings.Contains(caps, "USER\r\n") || !strings.Contains(caps, "SASL PLAIN") {
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
