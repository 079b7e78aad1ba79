package queue

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/dnstest"
)

// testCA issues certificates for names, trusted through its pool.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "quill test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, name string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// testDNS answers from maps of A, MX and TXT records.
func testDNS(t *testing.T, a, mx, txt map[string]string) *net.Resolver {
	_, r := dnstest.Serve(t, dnstest.Zone{A: a, MX: mx, TXT: txt})
	return r
}

// receiver is an SMTP server with STARTTLS that records what it got and
// whether it came under TLS.
type receiver struct {
	mu    sync.Mutex
	got   int
	tlsOn []bool
	port  int
}

func (r *receiver) NewSession(c *gosmtp.Conn) (gosmtp.Session, error) { return &rsess{r: r, c: c}, nil }

type rsess struct {
	r *receiver
	c *gosmtp.Conn
}

func (s *rsess) Mail(string, *gosmtp.MailOptions) error { return nil }
func (s *rsess) Rcpt(string, *gosmtp.RcptOptions) error { return nil }
func (s *rsess) Reset()                                 {}
func (s *rsess) Logout() error                          { return nil }
func (s *rsess) Data(rd io.Reader) error {
	io.Copy(io.Discard, rd)
	_, on := s.c.TLSConnectionState()
	s.r.mu.Lock()
	s.r.got++
	s.r.tlsOn = append(s.r.tlsOn, on)
	s.r.mu.Unlock()
	return nil
}

func startReceiver(t *testing.T, cert tls.Certificate) *receiver {
	r := &receiver{}
	srv := gosmtp.NewServer(r)
	srv.Domain = "mx.remote.test"
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.AllowInsecureAuth = true
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.port = l.Addr().(*net.TCPAddr).Port
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return r
}

// stsServer serves a policy over HTTPS with a certificate for
// mta-sts.<domain>, and returns its port.
func stsServer(t *testing.T, ca *testCA, domain, policy string) int {
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/mta-sts.txt" || r.Host == "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, policy)
	}))
	s.TLS = &tls.Config{Certificates: []tls.Certificate{ca.issue(t, "mta-sts."+domain)}}
	s.StartTLS()
	t.Cleanup(s.Close)
	_, port, _ := net.SplitHostPort(s.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return p
}

func TestMTASTSEnforce(t *testing.T) {
	ca := newCA(t)
	policy := "version: STSv1\nmode: enforce\nmx: *.remote.test\nmax_age: 86400\n"
	cases := []struct {
		name, certFor, mx string
		delivered         bool
		status            string
	}{
		{"valid certificate for the MX", "mx.remote.test", "mx.remote.test", true, ""},
		{"certificate for another name", "wrong.example", "mx.remote.test", false, "4.7.5"},
		{"MX the policy does not name", "mx.elsewhere.test", "mx.elsewhere.test", false, "4.7.5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rcv := startReceiver(t, ca.issue(t, c.certFor))
			res := testDNS(t, map[string]string{c.mx: "127.0.0.1", "mta-sts.remote.test": "127.0.0.1"},
				map[string]string{"remote.test": c.mx},
				map[string]string{"_mta-sts.remote.test": "v=STSv1; id=20261124"})
			d := &Dialer{Resolver: res, Port: rcv.port, Hostname: "quill.test", RootCAs: ca.pool,
				STSPort: stsServer(t, ca, "remote.test", policy)}
			r := d.Deliver(context.Background(), "remote.test", "a@quill.test", []string{"b@remote.test"}, []byte("Subject: x\r\n\r\nx\r\n"))[0]
			if r.Delivered != c.delivered || (c.status != "" && r.Status != c.status) || r.Permanent {
				t.Fatalf("result %+v, want delivered=%v status %s", r, c.delivered, c.status)
			}
			rcv.mu.Lock()
			defer rcv.mu.Unlock()
			if c.delivered && (rcv.got != 1 || !rcv.tlsOn[0]) {
				t.Fatalf("receiver got %d (TLS %v)", rcv.got, rcv.tlsOn)
			}
			if !c.delivered && rcv.got != 0 {
				t.Fatalf("delivered in plain text despite the policy")
			}
		})
	}
}

// Without a policy, a certificate for the wrong name is still used
// (opportunistic TLS), and the message goes.
func TestOpportunisticTLSTakesAnyCertificate(t *testing.T) {
	ca := newCA(t)
	rcv := startReceiver(t, ca.issue(t, "wrong.example"))
	res := testDNS(t, map[string]string{"mx.plain.test": "127.0.0.1"}, map[string]string{"plain.test": "mx.plain.test"}, nil)
	d := &Dialer{Resolver: res, Port: rcv.port, Hostname: "quill.test"}
	r := d.Deliver(context.Background(), "plain.test", "a@quill.test", []string{"b@plain.test"}, []byte("Subject: x\r\n\r\nx\r\n"))[0]
	if !r.Delivered || rcv.got != 1 || !rcv.tlsOn[0] {
		t.Fatalf("result %+v, receiver %d %v", r, rcv.got, rcv.tlsOn)
	}
}

func TestSTSPolicyParseAndMatch(t *testing.T) {
	p, err := parseSTSPolicy("version: STSv1\r\nmode: enforce\r\nmx: mail.example.com\r\nmx: *.example.net\r\nmax_age: 604800\r\n")
	if err != nil || p.Mode != "enforce" || p.MaxAge != 7*24*time.Hour {
		t.Fatalf("%+v %v", p, err)
	}
	for host, want := range map[string]bool{"mail.example.com": true, "MAIL.example.com.": true, "a.example.net": true,
		"a.b.example.net": false, "example.net": false, "other.example.com": false} {
		if p.matches(host) != want {
			t.Errorf("%s: match %v", host, !want)
		}
	}
	for _, bad := range []string{"mode: enforce\nmx: a\nmax_age: 1", "version: STSv1\nmode: sometimes\nmx: a\nmax_age: 1",
		"version: STSv1\nmode: enforce\nmax_age: 1", "version: STSv1\nmode: enforce\nmx: a\nmax_age: -1"} {
		if _, err := parseSTSPolicy(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if id := stsRecordID([]string{"v=STSv1; id=abc;"}); id != "abc" {
		t.Errorf("id %q", id)
	}
	if id := stsRecordID([]string{"v=STSv1; id=a", "v=STSv1; id=b"}); id != "" {
		t.Errorf("two records: id %q, want none", id)
	}
}

// A server that streams an endless greeting line is cut off after
// maxSessionRead, not read into memory until the timeout.
func TestEndlessReplyIsCutOff(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("220 "))
		junk := []byte(strings.Repeat("a", 64<<10))
		for i := 0; i < 64; i++ { // 4 MB, past the budget
			if _, err := c.Write(junk); err != nil {
				return
			}
		}
	}()
	res := testDNS(t, map[string]string{"mx.flood.test": "127.0.0.1"}, map[string]string{"flood.test": "mx.flood.test"}, nil)
	d := &Dialer{Resolver: res, Port: l.Addr().(*net.TCPAddr).Port, Hostname: "quill.test"}
	r := d.Deliver(context.Background(), "flood.test", "a@quill.test", []string{"b@flood.test"}, []byte("x\r\n"))[0]
	if r.Delivered || r.Permanent || !strings.Contains(r.Text, "more than a session's replies can hold") || len(r.Text) > 600 {
		t.Fatalf("%+v", r)
	}
}

// A server that offers PIPELINING gets MAIL, every RCPT and DATA in one
// go before it has replied to any (RFC 2920); a refused recipient gets its
// own permanent result with the enhanced code, the others the message.
func TestPipelinedTransaction(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type seen struct {
		group []string // the lines read before the server's first reply
		body  string
	}
	done := make(chan seen, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		tp := textproto.NewConn(c)
		tp.PrintfLine("220 mx.pipe.test ESMTP")
		var s seen
		for {
			line, err := tp.ReadLine()
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "EHLO ") {
				// The client says EHLO twice (once to look for STARTTLS).
				tp.PrintfLine("250-mx.pipe.test\r\n250-PIPELINING\r\n250-8BITMIME\r\n250 SIZE 1000000")
				continue
			}
			s.group = append(s.group, line)
			if line == "DATA" {
				break
			}
		}
		tp.PrintfLine("250 2.1.0 ok")
		tp.PrintfLine("250 2.1.5 ok")
		tp.PrintfLine("550 5.1.1 no such user")
		tp.PrintfLine("250 2.1.5 ok")
		tp.PrintfLine("354 go ahead")
		b, _ := tp.ReadDotBytes()
		s.body = string(b)
		tp.PrintfLine("250 2.0.0 queued as 42")
		tp.ReadLine() // QUIT
		tp.PrintfLine("221 bye")
		done <- s
	}()
	res := testDNS(t, map[string]string{"mx.pipe.test": "127.0.0.1"}, map[string]string{"pipe.test": "mx.pipe.test"}, nil)
	d := &Dialer{Resolver: res, Port: l.Addr().(*net.TCPAddr).Port, Hostname: "quill.test"}
	msg := "Subject: p\r\n\r\n.leading dot\r\nbody\r\n"
	out := d.Deliver(context.Background(), "pipe.test", "a@quill.test", []string{"b@pipe.test", "nobody@pipe.test", "c@pipe.test"}, []byte(msg))
	s := <-done
	if len(s.group) != 5 || s.group[4] != "DATA" || !strings.HasPrefix(s.group[0], "MAIL FROM:<a@quill.test> BODY=8BITMIME SIZE=") ||
		s.group[1] != "RCPT TO:<b@pipe.test>" || s.group[3] != "RCPT TO:<c@pipe.test>" {
		t.Fatalf("commands before the first reply: %q; want MAIL, three RCPT and DATA in one group", s.group)
	}
	if s.body != "Subject: p\n\n.leading dot\nbody\n" {
		t.Errorf("body as received (dot-unstuffed): %q", s.body)
	}
	if !out[0].Delivered || !out[2].Delivered || out[0].Text != "2.0.0 queued as 42" && !strings.Contains(out[0].Text, "queued as 42") {
		t.Errorf("accepted recipients: %+v, %+v", out[0], out[2])
	}
	if r := out[1]; r.Delivered || !r.Permanent || r.Code != 550 || r.Status != "5.1.1" || r.Rcpt != "nobody@pipe.test" {
		t.Errorf("refused recipient: %+v", r)
	}
}
