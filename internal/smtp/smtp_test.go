package smtp_test

import (
	"bytes"
	"context"
	"errors"
	"github.com/quillmail/quill/internal/domain"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/smtp"
)

func startServer(t *testing.T, maxSize int64) (string, *proxy.Proxy) {
	t.Helper()
	return startServerWith(t, maxSize, nil)
}

// startServerWith is startServer with a change to the configuration.
func startServerWith(t *testing.T, maxSize int64, configure func(*smtp.Config)) (string, *proxy.Proxy) {
	t.Helper()
	addr, c := startCore(t, maxSize, configure)
	return addr, c.Proxy
}

// startCore is startServerWith, returning the node's core.
func startCore(t testing.TB, maxSize int64, configure func(*smtp.Config)) (string, *core.Core) {
	t.Helper()
	c, err := core.New(core.Options{DataDir: t.TempDir(), Log: slog.New(slog.DiscardHandler), SubaddressSeparator: "+"})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice@example.org", "bob@example.org"} {
		if _, err := c.Users.AddUser(context.Background(), u, "pw"); err != nil {
			t.Fatal(err)
		}
	}
	p := c.Proxy
	cfg := smtp.DefaultConfig()
	cfg.Hostname = "mx.test"
	cfg.MaxMessageBytes = maxSize
	cfg.Logger = slog.New(slog.DiscardHandler)
	if configure != nil {
		configure(&cfg)
	}
	s := smtp.New(p, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close(); c.Close() })
	return l.Addr().String(), c
}

func inboxBodies(t *testing.T, p *proxy.Proxy, user string) [][]byte {
	mb, err := p.Boxes.Mailbox(user, mailbox.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := p.Boxes.Messages(user, mb.ID)
	var out [][]byte
	for _, m := range msgs {
		b, _ := p.Boxes.Body(user, m.ID)
		out = append(out, b)
	}
	return out
}

func TestDeliverySeveralRecipientsAndTrace(t *testing.T) {
	addr, p := startServer(t, 1<<20)
	msg := "Subject: hi\r\n\r\n.dot\r\n\xff\r\n"
	c, err := gosmtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SendMail("sender@far.net", []string{"alice@example.org", "Bob@Example.org"}, strings.NewReader(msg)); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice@example.org", "bob@example.org"} {
		bodies := inboxBodies(t, p, u)
		if len(bodies) != 1 {
			t.Fatalf("%s has %d messages", u, len(bodies))
		}
		b := bodies[0]
		if !bytes.HasPrefix(b, []byte("Return-Path: <sender@far.net>\r\nReceived: from ")) {
			t.Fatalf("trace headers missing: %q", b)
		}
		if !bytes.HasSuffix(b, []byte(msg)) || !bytes.Contains(b, []byte("by mx.test (Quill)")) {
			t.Fatalf("body not kept exactly: %q", b)
		}
	}
}

func smtpCode(err error) int {
	var se *gosmtp.SMTPError
	if errors.As(err, &se) {
		return se.Code*10 + se.EnhancedCode[1]
	}
	return 0
}

// refusals reads quill_smtp_refusals_total of the listener for other
// servers' mail, by stage and reason.
func refusals(stage, reason string) float64 {
	return testutil.ToFloat64(metrics.Refusals.WithLabelValues("smtp", stage, reason))
}

// Each refusal is answered with its code and counted under its reason.
func TestRejections(t *testing.T) {
	counted := [][2]string{{"rcpt", metrics.ReasonUnknownUser}, {"rcpt", metrics.ReasonRelay}, {"data", metrics.ReasonSize}}
	var before []float64
	for _, c := range counted {
		before = append(before, refusals(c[0], c[1]))
	}
	addr, _ := startServer(t, 1000)
	c, err := gosmtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Hello("client.test")
	if err := c.Mail("a@far.net", nil); err != nil {
		t.Fatal(err)
	}
	// Unknown user in a served domain: 550 5.1.1.
	if err := c.Rcpt("nobody@example.org", nil); smtpCode(err) != 5501 {
		t.Fatalf("unknown user: %v", err)
	}
	// A domain we do not serve: 550 5.7.1, no open relay.
	if err := c.Rcpt("x@elsewhere.net", nil); smtpCode(err) != 5507 {
		t.Fatalf("foreign domain: %v", err)
	}
	if err := c.Rcpt("alice@example.org", nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	w.Write(bytes.Repeat([]byte("0123456789\r\n"), 200))
	if err := w.Close(); smtpCode(err) != 5523 {
		t.Fatalf("oversized message: %v", err)
	}
	for i, c := range counted {
		if d := refusals(c[0], c[1]) - before[i]; d != 1 {
			t.Errorf("quill_smtp_refusals_total{stage=%q,reason=%q} moved by %v, want 1", c[0], c[1], d)
		}
	}
}

func TestSizeAdvertised(t *testing.T) {
	addr, _ := startServer(t, 12345)
	c, err := gosmtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Hello("client.test")
	for _, ext := range []string{"PIPELINING", "8BITMIME", "ENHANCEDSTATUSCODES"} {
		if ok, _ := c.Extension(ext); !ok {
			t.Errorf("%s not advertised", ext)
		}
	}
	if ok, _ := c.Extension("SIZE"); !ok {
		t.Error("SIZE not advertised")
	}
	// A declared size over the limit is refused at MAIL (RFC 1870 §6.1).
	if err := c.Mail("a@far.net", &gosmtp.MailOptions{Size: 12346}); smtpCode(err) != 5523 {
		t.Fatalf("MAIL SIZE over the limit: %v", err)
	}
}

// A message of exactly the limit is accepted, one octet more is refused, and
// bare LFs are stored as CRLF.
func TestSizeBoundaryAndBareLF(t *testing.T) {
	addr, p := startServer(t, 1000)
	send := func(body string) error {
		c, err := gosmtp.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.SendMail("a@far.net", []string{"alice@example.org"}, strings.NewReader(body))
	}
	exact := strings.Repeat("x", 998) + "\r\n"
	if err := send(exact); err != nil {
		t.Fatalf("message of exactly the limit: %v", err)
	}
	if err := send("y" + exact); smtpCode(err) != 5523 {
		t.Fatalf("limit+1: %v", err)
	}
	if err := send("Subject: lf\n\nbare\nlines\r\n"); err != nil {
		t.Fatal(err)
	}
	bodies := inboxBodies(t, p, "alice@example.org")
	last := bodies[len(bodies)-1]
	if !bytes.HasSuffix(last, []byte("Subject: lf\r\n\r\nbare\r\nlines\r\n")) {
		t.Fatalf("bare LF not normalised: %q", last)
	}
}

// SMTPUTF8 (RFC 6531): advertised; an address in UTF-8 needs it at MAIL
// (553 5.6.7 without), and with it a UTF-8 sender and UTF-8 header fields
// are taken, stored as they came, with "UTF8SMTP" in the trace.
func TestSMTPUTF8(t *testing.T) {
	addr, p := startServer(t, 1<<20)
	c, err := gosmtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Extension("SMTPUTF8"); !ok {
		t.Fatal("SMTPUTF8 not advertised")
	}
	if err := c.Mail("jürgen@münchen.example", nil); smtpCode(err) != 5536 {
		t.Fatalf("UTF-8 sender without SMTPUTF8: %v, want 553 5.6.7", err)
	}
	if err := c.Mail("a@far.net", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("jürgen@example.org", nil); smtpCode(err) != 5536 {
		t.Fatalf("UTF-8 recipient without SMTPUTF8: %v, want 553 5.6.7", err)
	}
	c.Reset()
	if err := c.Mail("jürgen@münchen.example", &gosmtp.MailOptions{UTF8: true}); err != nil {
		t.Fatalf("UTF-8 sender with SMTPUTF8: %v", err)
	}
	if err := c.Rcpt("jürgen@example.org", nil); smtpCode(err) != 5501 {
		t.Fatalf("UTF-8 recipient with SMTPUTF8: %v, want 550 5.1.1 (no such user)", err)
	}
	if err := c.Rcpt("alice@example.org", nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	msg := "From: Jürgen <jürgen@münchen.example>\r\nTo: alice@example.org\r\nSubject: Grüße\r\n\r\nHallo\r\n"
	w.Write([]byte(msg))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	bodies := inboxBodies(t, p, "alice@example.org")
	if len(bodies) != 1 {
		t.Fatalf("%d messages", len(bodies))
	}
	got := string(bodies[0])
	if !strings.Contains(got, "Return-Path: <jürgen@münchen.example>") || !strings.Contains(got, "with UTF8SMTP") || !strings.HasSuffix(got, msg) {
		t.Errorf("stored message:\n%s", got)
	}
}

// deferred records what a session handed to Config.Defer (the outbound
// queue in a node, which has tests of its own).
type deferred struct {
	mu    sync.Mutex
	calls [][]string
	raws  [][]byte
}

func (d *deferred) Enqueue(ctx context.Context, user, from string, rcpts []string, raw []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, append([]string{user, from}, rcpts...))
	d.raws = append(d.raws, raw)
	return nil
}

// A message whose size MAIL did not declare (or understated) is checked
// against the recipients' quotas again at DATA, with its real size: if no
// recipient has room it is refused with 452 4.2.2; if some have, it goes
// to the queue (Config.Defer), which delivers to those now and retries the
// others; with no queue it is delivered to all.
func TestOverQuotaAtData(t *testing.T) {
	var q deferred
	for _, withQueue := range []bool{true, false} {
		addr, p := startServerWith(t, 1<<20, func(c *smtp.Config) {
			if withQueue {
				c.Defer = &q
			}
		})
		if err := p.Users.SetQuota(context.Background(), "alice@example.org", 2000, 0); err != nil {
			t.Fatal(err)
		}
		send := func(declared, size int, rcpts ...string) error {
			c, err := gosmtp.Dial(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Hello("client.test")
			if err := c.Mail("a@far.net", &gosmtp.MailOptions{Size: int64(declared)}); err != nil {
				t.Fatal(err)
			}
			for _, r := range rcpts {
				if err := c.Rcpt(r, nil); err != nil {
					t.Fatalf("RCPT %s: %v", r, err)
				}
			}
			w, err := c.Data()
			if err != nil {
				t.Fatal(err)
			}
			w.Write([]byte("Subject: q\r\n\r\n"))
			for ; size > 0; size -= 100 {
				w.Write(append(bytes.Repeat([]byte("x"), 98), "\r\n"...))
			}
			return w.Close()
		}
		// A first small message makes both INBOXes.
		if err := send(0, 100, "alice@example.org", "bob@example.org"); err != nil {
			t.Fatal(err)
		}
		// Undeclared, or declared too small: refused at DATA for Alice alone.
		for _, declared := range []int{0, 100} {
			if err := send(declared, 3000, "alice@example.org"); smtpCode(err) != 4522 || !strings.Contains(err.Error(), "mailbox full") {
				t.Errorf("3,000 bytes declared as %d for Alice's 2,000: %v, want 452 4.2.2", declared, err)
			}
		}
		if n := len(inboxBodies(t, p, "alice@example.org")); n != 1 {
			t.Fatalf("alice has %d messages after refusals, want 1", n)
		}
		// A message that fits is delivered as ever, whatever was declared.
		before := len(q.calls)
		if err := send(0, 100, "alice@example.org"); err != nil {
			t.Fatalf("100 bytes for Alice: %v", err)
		}
		if len(q.calls) != before || len(inboxBodies(t, p, "alice@example.org")) != 2 {
			t.Errorf("a message with room was not delivered at once")
		}
		// Alice and Bob: Bob has room.
		if err := send(0, 3000, "alice@example.org", "bob@example.org"); err != nil {
			t.Fatalf("Alice (full) and Bob: %v", err)
		}
		alice, bob := len(inboxBodies(t, p, "alice@example.org")), len(inboxBodies(t, p, "bob@example.org"))
		if withQueue {
			if len(q.calls) != before+1 || strings.Join(q.calls[before], " ") != " a@far.net alice@example.org bob@example.org" {
				t.Fatalf("queued %q, want one entry for both", q.calls[before:])
			}
			if raw := q.raws[before]; !bytes.HasPrefix(raw, []byte("Received: from ")) {
				t.Errorf("queued message starts %q, want the Received field (the queue adds Return-Path)", raw[:40])
			}
			if alice != 2 || bob != 1 {
				t.Errorf("with a queue: alice %d, bob %d messages, want 2 and 1 (the queue delivers the new one)", alice, bob)
			}
		} else if alice != 3 || bob != 2 {
			t.Errorf("without a queue: alice %d, bob %d messages, want 3 and 2 (past the quota)", alice, bob)
		}
	}
}

// A recipient at their quota, or one whose room is smaller than the size
// MAIL declared, is refused at RCPT with 452 4.2.2 (RFC 3463: mailbox
// full, a temporary failure); the other recipients still get the message.
func TestOverQuotaAtRcpt(t *testing.T) {
	addr, p := startServer(t, 1<<20)
	ctx := context.Background()
	if err := p.Users.SetQuota(ctx, "alice@example.org", 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Users.SetQuota(ctx, "bob@example.org", 2000, 0); err != nil {
		t.Fatal(err)
	}
	send := func(size int, rcpts ...string) []error {
		c, err := gosmtp.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Hello("client.test")
		if err := c.Mail("a@far.net", &gosmtp.MailOptions{Size: int64(size)}); err != nil {
			t.Fatal(err)
		}
		var errs []error
		ok := 0
		for _, r := range rcpts {
			err := c.Rcpt(r, nil)
			errs = append(errs, err)
			if err == nil {
				ok++
			}
		}
		if ok > 0 {
			w, err := c.Data()
			if err != nil {
				t.Fatal(err)
			}
			w.Write(bytes.Repeat([]byte("x"), max(size-2, 0)))
			w.Write([]byte("\r\n"))
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return errs
	}
	if errs := send(100, "alice@example.org"); errs[0] != nil {
		t.Fatalf("first message within quota: %v", errs[0])
	}
	// Alice is at her one message; Bob's 2,000 bytes do not hold 3,000.
	errs := send(3000, "alice@example.org", "bob@example.org")
	for i, err := range errs {
		if smtpCode(err) != 4522 || !strings.Contains(err.Error(), "mailbox full") {
			t.Errorf("recipient %d over quota: %v, want 452 4.2.2", i, err)
		}
	}
	// Bob has room for a small one.
	if errs := send(100, "bob@example.org"); errs[0] != nil {
		t.Fatalf("small message within Bob's quota: %v", errs[0])
	}
	if n := len(inboxBodies(t, p, "alice@example.org")); n != 1 {
		t.Fatalf("alice has %d messages, want 1", n)
	}
}

// Mail to an alias, a sub-address and postmaster@ reaches the users they
// stand for, each user once however many of the recipients name them; an
// address nothing takes is refused at RCPT.
func TestAliasesAtRcpt(t *testing.T) {
	addr, c := startCore(t, 1<<20, nil)
	ctx := context.Background()
	if _, err := c.AddDomain(ctx, domain.Domain{Name: "example.org", Postmaster: "bob@example.org"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetAlias(ctx, domain.Alias{Address: "team@example.org", Targets: []string{"alice@example.org", "bob@example.org"}}); err != nil {
		t.Fatal(err)
	}
	cl, err := gosmtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Mail("a@far.net", nil); err != nil {
		t.Fatal(err)
	}
	if err := cl.Rcpt("nobody@example.org", nil); smtpCode(err) != 5501 {
		t.Errorf("RCPT nobody@: %v, want 550 5.1.1", err)
	}
	for _, r := range []string{"team@example.org", "alice+lists@example.org", "postmaster@example.org"} {
		if err := cl.Rcpt(r, nil); err != nil {
			t.Fatalf("RCPT %s: %v", r, err)
		}
	}
	w, err := cl.Data()
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("Subject: to the team\r\n\r\nhello\r\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice@example.org", "bob@example.org"} {
		if n := len(inboxBodies(t, c.Proxy, u)); n != 1 {
			t.Errorf("%s has %d messages, want 1", u, n)
		}
	}
}

// The client hears the addresses it gave, not the mailboxes behind them:
// a full alias is named in the 452 and in the Received line; and a second
// MAIL without RSET forgets the first transaction's recipients, quota
// marks included.
func TestAliasNamedNotItsMailbox(t *testing.T) {
	addr, c := startCore(t, 1<<20, nil)
	ctx := context.Background()
	if _, err := c.AddDomain(ctx, domain.Domain{Name: "example.org"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetAlias(ctx, domain.Alias{Address: "solo@example.org", Targets: []string{"alice@example.org"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Users.SetQuota(ctx, "alice@example.org", 2000, 0); err != nil {
		t.Fatal(err)
	}
	cl, err := gosmtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	data := func(size int) error {
		w, err := cl.Data()
		if err != nil {
			return err
		}
		w.Write([]byte("Subject: s\r\n\r\n"))
		for ; size > 0; size -= 100 {
			w.Write(append(bytes.Repeat([]byte("x"), 98), "\r\n"...))
		}
		return w.Close()
	}
	mailTo := func(rcpt string) {
		t.Helper()
		if err := cl.Mail("a@far.net", nil); err != nil {
			t.Fatal(err)
		}
		if err := cl.Rcpt(rcpt, nil); err != nil {
			t.Fatalf("RCPT %s: %v", rcpt, err)
		}
	}
	mailTo("solo@example.org")
	if err := data(100); err != nil {
		t.Fatal(err)
	}
	if b := inboxBodies(t, c.Proxy, "alice@example.org"); len(b) != 1 || !bytes.Contains(b[0], []byte("for <solo@example.org>")) {
		t.Errorf("Received line of mail to solo@: %q", b)
	}
	mailTo("solo@example.org")
	err = data(3000)
	if smtpCode(err) != 4522 || !strings.Contains(err.Error(), "solo@example.org") || strings.Contains(err.Error(), "alice") {
		t.Errorf("3,000 bytes to solo@ (alice@ full): %v, want 452 naming solo@ only", err)
	}
	// MAIL, RCPT solo@ (a quota), MAIL again, RCPT bob@ (none): the
	// second transaction is bob's alone.
	mailTo("solo@example.org")
	mailTo("bob@example.org")
	if err := data(3000); err != nil {
		t.Errorf("3,000 bytes to bob@ after a MAIL without RSET: %v", err)
	}
	if n := len(inboxBodies(t, c.Proxy, "bob@example.org")); n != 1 {
		t.Errorf("bob has %d messages, want 1", n)
	}
}

// A domain's quota covers its users together (each user's own quota still
// holds): RCPT for any user of a full domain gets 452 4.2.2, or 552 5.2.2
// once the domain makes quota refusals permanent; a user of another domain
// is not held back.
func TestDomainQuota(t *testing.T) {
	addr, c := startCore(t, 1<<20, nil)
	ctx := context.Background()
	for _, d := range []string{"example.org", "other.test"} {
		if _, err := c.AddDomain(ctx, domain.Domain{Name: d}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Users.AddUser(ctx, "carol@other.test", "pw"); err != nil {
		t.Fatal(err)
	}
	rcpt := func(to string) error {
		cl, err := gosmtp.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		cl.Hello("client.test")
		if err := cl.Mail("a@far.net", nil); err != nil {
			t.Fatal(err)
		}
		if err := cl.Rcpt(to, nil); err != nil {
			return err
		}
		w, err := cl.Data()
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("Subject: d\r\n\r\nhello\r\n"))
		return w.Close()
	}
	for _, to := range []string{"alice@example.org", "bob@example.org", "alice@example.org", "carol@other.test"} {
		if err := rcpt(to); err != nil {
			t.Fatalf("delivery to %s before any quota: %v", to, err)
		}
	}
	set := func(d domain.Domain) {
		if _, err := c.SetDomain(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	// example.org's users hold three messages: a limit of three is full.
	set(domain.Domain{Name: "example.org", QuotaMessages: 3})
	for _, to := range []string{"alice@example.org", "bob@example.org"} {
		if err := rcpt(to); smtpCode(err) != 4522 || !strings.Contains(err.Error(), "mailbox full") {
			t.Fatalf("RCPT %s in a full domain: %v, want 452 4.2.2", to, err)
		}
	}
	if err := rcpt("carol@other.test"); err != nil {
		t.Fatalf("a user of another domain: %v", err)
	}
	set(domain.Domain{Name: "example.org", QuotaMessages: 3, QuotaPermanent: true})
	if err := rcpt("bob@example.org"); smtpCode(err) != 5522 {
		t.Fatalf("RCPT in a full domain that refuses for good: %v, want 552 5.2.2", err)
	}
	// The same reply for a user's own quota in that domain.
	set(domain.Domain{Name: "example.org", QuotaPermanent: true})
	if err := c.Users.SetQuota(ctx, "alice@example.org", 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := rcpt("alice@example.org"); smtpCode(err) != 5522 {
		t.Fatalf("RCPT over the user's quota in a domain that refuses for good: %v, want 552 5.2.2", err)
	}
	set(domain.Domain{Name: "example.org", QuotaMessages: 100})
	if err := rcpt("bob@example.org"); err != nil {
		t.Fatalf("after the domain's limit was raised: %v", err)
	}
	if u, err := c.Users.DomainUsage(ctx, "example.org"); err != nil || u.Users != 2 {
		t.Fatalf("domain usage %+v, %v: want 2 users", u, err)
	}
}
