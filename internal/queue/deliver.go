package queue

// Delivery to another domain's servers (RFC 5321 §5 and §4.5.3.2): the
// domain's MX records in preference order (equal preferences shuffled by
// the resolver), the domain itself when it has none, no delivery at all
// for a null MX (RFC 7505); each host's addresses in turn; STARTTLS
// whenever the server offers it, without verifying the certificate
// (opportunistic TLS, RFC 7435: a passive eavesdropper is kept out, and a
// server with a self-signed certificate still gets its mail), falling back
// to plain text on the same address when the handshake fails; one
// transaction carrying every recipient of the domain.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"syscall"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// Timeouts of a delivery, after RFC 5321 §4.5.3.2.
const (
	// DefaultConnectTimeout bounds the TCP connection to one address; an
	// address that does not answer in that time is passed over.
	DefaultConnectTimeout = 30 * time.Second
	// commandTimeout bounds the greeting and each command's reply (the
	// RFC's 5 minutes for the greeting, MAIL and RCPT).
	commandTimeout = 5 * time.Minute
	// dataTimeout bounds sending the message and the reply to its final
	// dot (the RFC's 3 minutes per block and 10 for the dot).
	dataTimeout = 10 * time.Minute
	// dnsTimeout bounds the lookups of one domain.
	dnsTimeout = 30 * time.Second
)

// Dialer delivers messages to other domains' servers.
type Dialer struct {
	// Resolver answers the MX and address lookups (--dns names its
	// server; nil: the system's).
	Resolver *net.Resolver
	// Port is the port the servers listen on: 25, or another for a test
	// rig.
	Port int
	// Hostname is this node's name in EHLO.
	Hostname string
	// ConnectTimeout bounds each TCP connection.
	ConnectTimeout time.Duration
	// RootCAs verify the certificates MTA-STS asks to verify (the
	// policy host's and the MX hosts'); nil: the system's.
	RootCAs *x509.CertPool
	// STSPort is the HTTPS port of policy hosts: 443, or another for a
	// test rig.
	STSPort int

	sts stsCache
}

// tlsMode is how a session uses TLS.
type tlsMode int

const (
	tlsNone   tlsMode = iota // plain text (a handshake failed before)
	tlsTry                   // STARTTLS when offered, certificate not verified
	tlsVerify                // STARTTLS required, certificate verified (MTA-STS enforce)
)

func (d *Dialer) resolver() *net.Resolver {
	if d.Resolver != nil {
		return d.Resolver
	}
	return net.DefaultResolver
}

// Hosts returns the hosts to try for a domain, best first: its MX hosts,
// or the domain itself when it has no MX (RFC 5321 §5.1). A null MX
// (RFC 7505) or a domain that does not exist is a permanent failure;
// a lookup that failed is a temporary one.
func (d *Dialer) Hosts(ctx context.Context, domain string) ([]string, *Result) {
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	mxs, err := d.resolver().LookupMX(ctx, domain)
	var dnsErr *net.DNSError
	switch {
	case len(mxs) > 0:
		// Go returns the usable records with an error when some records
		// were malformed; the usable ones are still tried.
		if len(mxs) == 1 && (mxs[0].Host == "." || mxs[0].Host == "") {
			return nil, &Result{Permanent: true, Status: "5.1.10",
				Text: fmt.Sprintf("domain %s accepts no mail (null MX, RFC 7505)", domain)}
		}
		var hosts []string
		for _, mx := range mxs {
			if h := strings.TrimSuffix(mx.Host, "."); h != "" {
				hosts = append(hosts, h)
			}
		}
		return hosts, nil
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		// No MX: the domain's own address records (implicit MX). If it
		// has none either, the address resolution below says so.
		return []string{domain}, nil
	default:
		return nil, &Result{Status: "4.4.3", Text: fmt.Sprintf("MX lookup of %s failed: %s", domain, why(err))}
	}
}

// Deliver sends body from from to rcpts, all of one domain, and returns
// each recipient's result.
func (d *Dialer) Deliver(ctx context.Context, domain, from string, rcpts []string, body []byte) []Result {
	hosts, fail := d.Hosts(ctx, domain)
	if fail != nil {
		return each(rcpts, *fail)
	}
	mode := tlsTry
	if pol := d.policy(ctx, domain); pol != nil && pol.Mode == "enforce" {
		// RFC 8461 §5: only the MX hosts the policy names, only over TLS
		// with a certificate valid for the host.
		var ok []string
		for _, h := range hosts {
			if pol.matches(h) {
				ok = append(ok, h)
			}
		}
		if len(ok) == 0 {
			return each(rcpts, Result{Status: "4.7.5",
				Text: fmt.Sprintf("no MX host of %s is one its MTA-STS policy names (%s)", domain, strings.Join(pol.MX, ", "))})
		}
		hosts, mode = ok, tlsVerify
	}
	last := Result{Status: "4.4.1", Text: "no server of " + domain + " could be reached"}
	unknown := 0
	for _, host := range hosts {
		lctx, cancel := context.WithTimeout(ctx, dnsTimeout)
		addrs, err := d.resolver().LookupIPAddr(lctx, host)
		cancel()
		if err != nil {
			var dnsErr *net.DNSError
			if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
				unknown++
			}
			last = Result{Status: "4.4.3", Text: fmt.Sprintf("address lookup of %s failed: %s", host, why(err))}
			continue
		}
		for _, a := range addrs {
			addr := net.JoinHostPort(a.IP.String(), strconv.Itoa(d.port()))
			res, next := d.session(ctx, host, addr, from, rcpts, body, mode)
			if next {
				if res != nil {
					last = res[0]
				}
				continue
			}
			return res
		}
	}
	if unknown == len(hosts) {
		// RFC 5321 §5.1: no host of the domain has an address; the
		// domain cannot be reached, now or later.
		return each(rcpts, Result{Permanent: true, Status: "5.1.2",
			Text: fmt.Sprintf("domain %s has no mail server with an address", domain)})
	}
	return each(rcpts, last)
}

func (d *Dialer) port() int {
	if d.Port == 0 {
		return 25
	}
	return d.Port
}

func each(rcpts []string, r Result) []Result {
	out := make([]Result, len(rcpts))
	for i, rc := range rcpts {
		out[i] = r
		out[i].Rcpt = rc
	}
	return out
}

// session runs one SMTP transaction with the server at addr (host's
// address). next says the caller should try the next address: the
// connection failed, or the server refused the session itself. Under
// tlsTry a failed handshake tries the same address again without TLS;
// under tlsVerify it moves on to the next address.
func (d *Dialer) session(ctx context.Context, host, addr, from string, rcpts []string, body []byte, mode tlsMode) (res []Result, next bool) {
	remote := host + " [" + addr + "]"
	timeout := d.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	conn, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return []Result{{Status: "4.4.1", Text: fmt.Sprintf("connection to %s failed: %s", remote, why(err)), Remote: remote}}, true
	}
	// What the server sends is bounded (textproto reads a reply line of
	// any length), and the context ends the session early.
	conn = &capped{Conn: conn, left: maxSessionRead}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()
	c, cc, tlsErr, err := d.open(ctx, conn, host, mode)
	switch {
	case tlsErr != nil && mode == tlsVerify:
		return []Result{{Status: "4.7.5", Remote: remote,
			Text: fmt.Sprintf("TLS with %s, which the domain's MTA-STS policy requires, failed: %s", remote, why(tlsErr))}}, true
	case tlsErr != nil:
		// A server that offers STARTTLS and then fails the handshake
		// gets the message in plain text (RFC 7435: better than none).
		conn.Close()
		return d.session(ctx, host, addr, from, rcpts, body, tlsNone)
	}
	fail := func(err error) Result {
		r := Result{Remote: remote}
		var se *gosmtp.SMTPError
		var te *textproto.Error
		switch {
		case errors.As(err, &se):
			r.Code, r.Text, r.Permanent = se.Code, oneLine(se.Message), se.Code >= 500
			if se.EnhancedCode != (gosmtp.EnhancedCode{}) && se.EnhancedCode != gosmtp.NoEnhancedCode {
				r.Status = fmt.Sprintf("%d.%d.%d", se.EnhancedCode[0], se.EnhancedCode[1], se.EnhancedCode[2])
			}
		case errors.As(err, &te):
			r.Code, r.Text, r.Permanent = te.Code, oneLine(te.Msg), te.Code >= 500
		default:
			r.Status, r.Text = "4.4.2", fmt.Sprintf("connection to %s broke: %s", remote, why(err))
		}
		return r
	}
	if err != nil {
		// A refused greeting (or EHLO) says nothing about the
		// recipients: RFC 5321 §5.1 has the next host tried.
		return []Result{fail(err)}, true
	}
	defer c.Close()
	opts := &gosmtp.MailOptions{Size: int64(len(body)), UTF8: needsUTF8(from, rcpts)}
	if opts.UTF8 {
		if ok, _ := c.Extension("SMTPUTF8"); !ok {
			return each(rcpts, Result{Permanent: true, Status: "5.6.7", Remote: remote,
				Text: fmt.Sprintf("%s does not take internationalized addresses (no SMTPUTF8)", remote)}), false
		}
	}
	if ok, _ := c.Extension("PIPELINING"); ok {
		// RFC 2920: MAIL, every RCPT and DATA in one write, their
		// replies read in order; one round trip instead of 2+n.
		return d.pipelined(cc, remote, from, opts, c, rcpts, body, fail), false
	}
	if err := c.Mail(from, opts); err != nil {
		return each(rcpts, fail(err)), false
	}
	out := make([]Result, len(rcpts))
	var accepted []int
	for i, rc := range rcpts {
		if err := c.Rcpt(rc, nil); err != nil {
			out[i] = fail(err)
		} else {
			accepted = append(accepted, i)
		}
		out[i].Rcpt = rc
	}
	if len(accepted) == 0 {
		c.Quit()
		return out, false
	}
	final := Result{Delivered: true, Code: 250, Remote: remote}
	w, err := c.Data()
	if err == nil {
		_, err = w.Write(body)
		if err == nil {
			var resp *gosmtp.DataResponse
			resp, err = w.CloseWithResponse()
			if resp != nil {
				final.Text = oneLine(resp.StatusText)
			}
		} else {
			w.Close()
		}
	}
	if err != nil {
		final = fail(err)
	}
	for _, i := range accepted {
		out[i] = final
		out[i].Rcpt = rcpts[i]
	}
	c.Quit()
	return out, false
}

// open reads the server's greeting and introduces this node (EHLO) on a
// fresh connection, with STARTTLS first when the server offers it and
// tryTLS is set, and returns the go-smtp client to carry on with. go-smtp
// (v0.25.1) has no exported STARTTLS for a client that already sent its
// own EHLO, so this first exchange is done here with net/textproto and
// the client is handed the connection as if it had just been greeted.
// tlsErr reports a failed STARTTLS or handshake (or, under tlsVerify,
// none offered); err a refused greeting or a broken connection.
func (d *Dialer) open(ctx context.Context, conn net.Conn, host string, mode tlsMode) (c *gosmtp.Client, cc net.Conn, tlsErr, err error) {
	conn.SetDeadline(time.Now().Add(commandTimeout))
	tp := textproto.NewConn(conn)
	if _, _, err := tp.ReadResponse(220); err != nil {
		return nil, nil, nil, err
	}
	var rd io.Reader = tp.R
	if mode != tlsNone {
		id, err := tp.Cmd("EHLO %s", d.Hostname)
		if err != nil {
			return nil, nil, nil, err
		}
		tp.StartResponse(id)
		_, msg, err := tp.ReadResponse(250)
		tp.EndResponse(id)
		switch {
		case err == nil && offers(msg, "STARTTLS"):
			// Opportunistic TLS takes any certificate; MTA-STS wants
			// one valid for the MX host's name.
			cfg := &tls.Config{ServerName: host, InsecureSkipVerify: mode == tlsTry, RootCAs: d.RootCAs, MinVersion: tls.VersionTLS12}
			tc, err := startTLS(ctx, conn, tp, cfg)
			if err != nil {
				return nil, nil, err, nil
			}
			conn, rd = tc, tc
		case mode == tlsVerify:
			return nil, nil, errors.New("the server does not offer STARTTLS"), nil
		}
	}
	conn.SetDeadline(time.Time{})
	cc = greeted{Conn: conn, r: io.MultiReader(strings.NewReader("220 "+host+"\r\n"), rd)}
	c = gosmtp.NewClient(cc)
	c.CommandTimeout, c.SubmissionTimeout = commandTimeout, dataTimeout
	if err := c.Hello(d.Hostname); err != nil {
		return nil, nil, nil, err
	}
	return c, cc, nil, nil
}

// startTLS sends STARTTLS and makes the handshake.
func startTLS(ctx context.Context, conn net.Conn, tp *textproto.Conn, cfg *tls.Config) (*tls.Conn, error) {
	if _, _, err := tlsCmd(tp); err != nil {
		return nil, err
	}
	if tp.R.Buffered() > 0 {
		return nil, errors.New("server sent data before the TLS handshake")
	}
	tc := tls.Client(conn, cfg)
	hctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return nil, err
	}
	return tc, nil
}

func tlsCmd(tp *textproto.Conn) (int, string, error) {
	id, err := tp.Cmd("STARTTLS")
	if err != nil {
		return 0, "", err
	}
	tp.StartResponse(id)
	defer tp.EndResponse(id)
	return tp.ReadResponse(220)
}

// offers reports whether an EHLO reply's extension lines name ext.
func offers(ehlo, ext string) bool {
	lines := strings.Split(ehlo, "\n")
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) > 0 && strings.EqualFold(f[0], ext) {
			return true
		}
	}
	return false
}

// greeted is a connection whose reads start with a greeting already had.
type greeted struct {
	net.Conn
	r io.Reader
}

func (g greeted) Read(b []byte) (int, error) { return g.r.Read(b) }

// needsUTF8 reports addresses that only SMTPUTF8 (RFC 6531) can carry.
func needsUTF8(from string, rcpts []string) bool {
	for _, s := range append([]string{from}, rcpts...) {
		for i := 0; i < len(s); i++ {
			if s[i] >= 0x80 {
				return true
			}
		}
	}
	return false
}

// maxSessionRead bounds what one session reads from a server: replies
// are a few KB; a server streaming an endless reply line is cut off
// instead of filling memory.
const maxSessionRead = 1 << 20

// capped is a connection that fails reads past its budget.
type capped struct {
	net.Conn
	left int64
}

var errTooMuch = errors.New("the server sent more than a session's replies can hold")

func (c *capped) Read(b []byte) (int, error) {
	if c.left <= 0 {
		return 0, errTooMuch
	}
	if int64(len(b)) > c.left {
		b = b[:c.left]
	}
	n, err := c.Conn.Read(b)
	c.left -= int64(n)
	return n, err
}

// why says what went wrong with a lookup or a connection in words fit
// for a DSN: the kind of failure, not the Go error, which names this
// node's own addresses and its resolver.
func why(err error) string {
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.As(err, &dnsErr):
		if dnsErr.IsNotFound {
			return "no such domain"
		}
		if dnsErr.IsTimeout {
			return "DNS timed out"
		}
		return "DNS failure"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return "no route to host"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the server"
	case errors.Is(err, errTooMuch):
		return errTooMuch.Error()
	case errors.Is(err, context.Canceled):
		return "attempt cut short (node shutting down)"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return oneLine(certErr.Err.Error())
	}
	var tlsAlert tls.AlertError
	if errors.As(err, &tlsAlert) {
		return "TLS alert: " + oneLine(tlsAlert.Error())
	}
	if errors.As(err, &netErr) {
		return "connection failed"
	}
	return oneLine(err.Error())
}

// oneLine keeps a remote's reply to one printable line of at most 512
// bytes: it goes into the entry, the log and a DSN.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			return ' '
		case r < 0x20 || r == 0x7f:
			return -1
		}
		return r
	}, s)
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// pipelined runs the transaction with PIPELINING (RFC 2920) on the
// connection the go-smtp client has greeted and introduced (it has
// nothing buffered: the server says nothing until asked): MAIL, the
// RCPTs and DATA go out in one write, and their replies are read in
// order. go-smtp (v0.25.1) has no pipelining, so this part of the session
// is written here over net/textproto. The MAIL parameters are what go-smtp
// sends: BODY=8BITMIME and SIZE where offered, SMTPUTF8 when needed.
func (d *Dialer) pipelined(conn net.Conn, remote, from string, opts *gosmtp.MailOptions, c *gosmtp.Client,
	rcpts []string, body []byte, fail func(error) Result) []Result {
	tp := textproto.NewConn(conn)
	var cmds strings.Builder
	fmt.Fprintf(&cmds, "MAIL FROM:<%s>", from)
	if ok, _ := c.Extension("8BITMIME"); ok {
		cmds.WriteString(" BODY=8BITMIME")
	}
	if ok, _ := c.Extension("SIZE"); ok {
		fmt.Fprintf(&cmds, " SIZE=%d", opts.Size)
	}
	if opts.UTF8 {
		cmds.WriteString(" SMTPUTF8")
	}
	cmds.WriteString("\r\n")
	for _, rc := range rcpts {
		fmt.Fprintf(&cmds, "RCPT TO:<%s>\r\n", rc)
	}
	cmds.WriteString("DATA\r\n")
	conn.SetDeadline(time.Now().Add(commandTimeout))
	if _, err := io.WriteString(conn, cmds.String()); err != nil {
		return each(rcpts, fail(err))
	}
	reply := func(want int) error {
		_, _, err := tp.ReadResponse(want)
		return replyErr(err)
	}
	out := make([]Result, len(rcpts))
	mailErr := reply(250)
	var accepted []int
	for i, rc := range rcpts {
		err := reply(25)
		switch {
		case mailErr != nil:
			out[i] = fail(mailErr)
		case err != nil:
			out[i] = fail(err)
		default:
			accepted = append(accepted, i)
		}
		out[i].Rcpt = rc
	}
	dataErr := reply(354)
	if isBroken(mailErr) || isBroken(dataErr) {
		err := mailErr
		if err == nil {
			err = dataErr
		}
		return each(rcpts, fail(err))
	}
	if dataErr == nil && len(accepted) == 0 {
		// §3.1: a server that took DATA with no recipient gets an empty
		// message, which it cannot deliver to anyone.
		io.WriteString(conn, ".\r\n")
		reply(250)
	}
	if dataErr != nil || len(accepted) == 0 {
		tp.PrintfLine("QUIT")
		return out
	}
	conn.SetDeadline(time.Now().Add(dataTimeout))
	final := Result{Delivered: true, Code: 250, Remote: remote}
	w := tp.DotWriter()
	_, err := w.Write(body)
	if err == nil {
		err = w.Close()
	}
	if err == nil {
		var msg string
		_, msg, err = tp.ReadResponse(250)
		err = replyErr(err)
		final.Text = oneLine(msg)
	}
	if err != nil {
		final = fail(err)
	}
	for _, i := range accepted {
		out[i] = final
		out[i].Rcpt = rcpts[i]
	}
	conn.SetDeadline(time.Now().Add(commandTimeout))
	tp.PrintfLine("QUIT")
	tp.ReadResponse(221)
	return out
}

// replyErr makes a server's refusal an SMTPError (with its enhanced status
// code, RFC 3463, when the text starts with one), as go-smtp's client
// does; other errors (a broken connection) stay as they are.
func replyErr(err error) error {
	var te *textproto.Error
	if !errors.As(err, &te) {
		return err
	}
	se := &gosmtp.SMTPError{Code: te.Code, EnhancedCode: gosmtp.NoEnhancedCode, Message: te.Msg}
	if f := strings.SplitN(te.Msg, " ", 2); len(f) == 2 {
		var a, b, c int
		if n, _ := fmt.Sscanf(f[0], "%d.%d.%d", &a, &b, &c); n == 3 && f[0] == fmt.Sprintf("%d.%d.%d", a, b, c) {
			se.EnhancedCode, se.Message = gosmtp.EnhancedCode{a, b, c}, f[1]
		}
	}
	return se
}

// isBroken: the connection failed (not a refusal the server replied).
func isBroken(err error) bool {
	var se *gosmtp.SMTPError
	return err != nil && !errors.As(err, &se)
}
