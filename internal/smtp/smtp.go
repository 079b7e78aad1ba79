// Package smtp is the SMTP delivery proxy of Porcupine §2.3.1: it accepts
// mail from other MTAs with github.com/emersion/go-smtp (RFC 5321) and hands
// each message to the protocol-independent proxy, which stores it. The 250
// after DATA is sent only when the store says the message is fsync'd.
package smtp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/hangup"
	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/userdb"
)

// Config holds the delivery proxy's tunables.
type Config struct {
	// Hostname names this node in the greeting and Received headers.
	Hostname string
	// MaxMessageBytes is the SIZE limit (RFC 1870); larger messages get 552.
	MaxMessageBytes int64
	// MaxRecipients bounds RCPT per transaction; RFC 5321 §4.5.3.1.8 asks
	// servers to accept at least 100.
	MaxRecipients int
	// ReadTimeout and WriteTimeout bound each command read and reply write;
	// RFC 5321 §4.5.3.2 suggests 5 minutes for commands.
	ReadTimeout, WriteTimeout time.Duration
	// DeliverTimeout bounds the storage of one message after DATA.
	DeliverTimeout time.Duration
	// RcptTimeout bounds the lookup of a recipient at its user manager.
	RcptTimeout time.Duration
	Logger      *slog.Logger
	// TLSConfig, if set, offers STARTTLS (RFC 3207).
	TLSConfig *tls.Config
	// AuthConfig, with Auth set, offers SMTP AUTH (auth.go).
	AuthConfig AuthConfig
	// Submission makes the listener a message submission agent (RFC
	// 6409, submission.go); it needs AuthConfig.
	Submission bool
	// Queue takes a submission's recipients in other domains (the
	// outbound queue); nil refuses them.
	Queue Queuer
	// Defer takes a message whose local recipients cannot all take it
	// now (one's mailbox too full for its size, learnt at DATA): the
	// outbound queue, whose local delivery delivers to those with room at
	// once and retries the others until they have room or the entry
	// expires (then a DSN to the sender). The user is "". nil delivers
	// past the quota instead.
	Defer Queuer
	// Checker, if set, checks SPF, DKIM and DMARC (and a spam score) of
	// mail that is not from an authenticated user: a mailauth.Checker in
	// the node, or SNS filter workers (sns.Filter).
	Checker OriginChecker
	// Sealer, if set, adds an ARC set to what Checker let in (the node's
	// SealARC).
	Sealer ARCSealer
	// Policy, if set, gives the recipient domains' say over a DMARC
	// failure (the node's InboundPolicy).
	Policy InboundPolicy
	// SubmitRecipients bounds the recipients of one submitted message
	// (0: only MaxRecipients); Sends, if set, bounds the messages a user
	// submits per hour.
	SubmitRecipients int
	Sends            SendLimit
	// AuthFailDelay is the delay after a failed AUTH when AuthConfig has
	// no Logins.
	AuthFailDelay time.Duration
}

// DefaultConfig returns the defaults an operator would expect.
func DefaultConfig() Config {
	return Config{
		Hostname:        "localhost",
		MaxMessageBytes: 25 << 20,
		MaxRecipients:   100,
		ReadTimeout:     5 * time.Minute,
		WriteTimeout:    5 * time.Minute,
		DeliverTimeout:  2 * time.Minute,
		RcptTimeout:     30 * time.Second,
		Logger:          slog.Default(),
	}
}

// Deliverer is what the delivery proxy needs of the node: proxy.Proxy.
type Deliverer interface {
	// CheckRecipient says whether mail for addr is accepted here: nil,
	// an error wrapping userdb.ErrNotFound (no such user) or
	// proxy.ErrForeignDomain (not ours to relay), or another error (a
	// temporary failure).
	// size is the size the client declared (RFC 1870), 0 when it did not;
	// an error wrapping userdb.ErrOverQuota says the recipient's quota
	// leaves no room. limited says the recipient has a quota at all.
	CheckRecipient(ctx context.Context, addr string, size int64) (limited bool, err error)
	// Recipients is CheckRecipient for an address that may stand for
	// other users (an alias, a sub-address, a role address, a catch-all):
	// the users it reaches, and those of them with a quota.
	Recipients(ctx context.Context, addr string, size int64) (users, limited []string, err error)
	// Deliver stores a message for the recipients and returns once it is
	// durable under their write policy; DeliverJunk the same into their
	// junk mailboxes (a DMARC p=quarantine, a spam verdict).
	Deliver(ctx context.Context, rcpts []string, raw []byte) error
	DeliverJunk(ctx context.Context, rcpts []string, raw []byte) error
	// ServesDomain says whether the cluster takes mail for a domain (it
	// has a user there): what a submission sends elsewhere is relayed.
	ServesDomain(domain string) bool
}

// Server is a go-smtp server whose Serve batches a session's replies
// (replies.go).
type Server struct{ *gosmtp.Server }

// Serve serves SMTP on l, each connection's replies held until the session
// next reads (RFC 2920 §3.1).
func (s *Server) Serve(l net.Listener) error { return s.Server.Serve(replyListener{l}) }

// New returns a go-smtp server delivering through p.
func New(p Deliverer, cfg Config) *Server {
	s := gosmtp.NewServer(&backend{p: p, cfg: cfg})
	s.Domain = cfg.Hostname
	// The size limit is enforced here, not by go-smtp: its DATA reader
	// (v0.25.1) refuses a message of exactly MaxMessageBytes octets because
	// it runs out of budget before reading the final dot line. Left at 0,
	// go-smtp advertises a bare SIZE (RFC 1870 §4: no fixed maximum
	// declared), and Mail and Data below apply the limit exactly.
	s.MaxMessageBytes = 0
	s.MaxRecipients = cfg.MaxRecipients
	s.ReadTimeout = cfg.ReadTimeout
	s.WriteTimeout = cfg.WriteTimeout
	// RFC 5321 §4.5.3.1.6: a text line is at most 1000 octets with CRLF;
	// go-smtp's default is 2000, which we keep to be lenient with senders.
	s.ErrorLog = slogLogger{cfg.Logger}
	s.TLSConfig = cfg.TLSConfig
	// AUTH is refused per connection before TLS (authSession.Auth), where
	// go-smtp's switch is for the whole server.
	s.AllowInsecureAuth = cfg.AuthConfig.Auth != nil
	// RFC 6531: a sender or recipient address in UTF-8, and a message
	// with UTF-8 header fields (RFC 6532), come with MAIL's SMTPUTF8; the
	// message is stored as it came (IMAP gives it out under UTF8=ACCEPT),
	// and the outbound queue asks the next hop for SMTPUTF8 when an
	// address needs it. Users' own addresses stay ASCII (ValidateAddress).
	s.EnableSMTPUTF8 = true
	return &Server{s}
}

type backend struct {
	p   Deliverer
	cfg Config
}

func (b *backend) NewSession(c *gosmtp.Conn) (gosmtp.Session, error) {
	proto := b.protocol()
	metrics.Sessions.WithLabelValues(proto).Inc()
	if b.cfg.AuthConfig.Auth != nil {
		s := &authSession{session: &session{b: b, conn: c}}
		return countedAuth{counted{s, proto}, s}, nil
	}
	return counted{&session{b: b, conn: c}, proto}, nil
}

type session struct {
	b     *backend
	conn  *gosmtp.Conn
	from  string
	rcpts []string
	// remote are a submission's recipients in other domains: they go to
	// the outbound queue.
	remote []string
	// inTx: MAIL was given (the null sender too) and no RSET since.
	inTx bool
	// utf8: MAIL had SMTPUTF8 (RFC 6531 §3.4).
	utf8 bool
	// authUser is the user authenticated by AUTH, if any (the Received
	// line then says ESMTPSA, RFC 3848).
	authUser string
	// size is the message size MAIL declared (RFC 1870), 0 if none.
	size int64
	// limited are the recipients of rcpts that have a quota: only they
	// are checked again at DATA against the message's real size.
	limited []string
	// asked maps each user of rcpts to the address the client gave for
	// it (an alias, a sub-address, a catch-all's): replies and trace
	// headers name that, never the mailbox behind it.
	asked map[string]string
}

// askedFor returns the addresses the client gave for users.
func (s *session) askedFor(users []string) []string {
	out := make([]string, 0, len(users))
	for _, u := range users {
		a := s.asked[u]
		if a == "" {
			a = u
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// command returns the context of one command's work, bounded by d: it ends
// early if the client hangs up meanwhile (hangup.Watch).
func (s *session) command(d time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	wctx, stop := hangup.Watch(ctx, s.conn.Conn())
	return wctx, func() { stop(); cancel() }
}

func (s *session) Reset() {
	s.from, s.rcpts, s.remote, s.limited, s.asked, s.inTx, s.utf8, s.size = "", nil, nil, nil, nil, false, false, 0
}

func (s *session) Logout() error { return nil }

func (s *session) Mail(from string, opts *gosmtp.MailOptions) error {
	if opts != nil && opts.Size > s.b.cfg.MaxMessageBytes {
		// RFC 1870 §6.1: a declared size over the limit is refused at MAIL.
		return errTooLarge(s.b.cfg.MaxMessageBytes)
	}
	utf8 := opts != nil && opts.UTF8
	if !utf8 && !isASCII(from) {
		return errNeedsUTF8("sender", from)
	}
	s.from, s.inTx, s.utf8 = from, true, utf8
	// A second MAIL without RSET starts a new transaction too (go-smtp
	// does not refuse it): nothing of the last one's recipients stays.
	s.rcpts, s.remote, s.limited, s.asked, s.size = nil, nil, nil, nil, 0
	if opts != nil {
		s.size = opts.Size
	}
	return nil
}

// errNeedsUTF8 refuses an address in UTF-8 in a transaction that did not
// say SMTPUTF8 (RFC 6531 §3.5, RFC 6533's 5.6.7).
func errNeedsUTF8(what, addr string) error {
	return refuse(metrics.ReasonContent, &gosmtp.SMTPError{Code: 553, EnhancedCode: gosmtp.EnhancedCode{5, 6, 7},
		Message: fmt.Sprintf("%s <%s> is not ASCII: MAIL needs SMTPUTF8 for it", what, sanitizeUTF8(addr))})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func (s *session) Rcpt(to string, opts *gosmtp.RcptOptions) (err error) {
	defer func() {
		if err != nil {
			s.logRefusal("recipient refused", err, "rcpt", to)
		}
	}()
	if s.submitting() && !sameAddress(s.from, s.authUser) {
		// Defence in depth: the sender was checked at MAIL, and AUTH is
		// refused within a transaction.
		return refuse(metrics.ReasonSender, &gosmtp.SMTPError{Code: 553, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
			Message: fmt.Sprintf("sender <%s> is not an address of %s", sanitize(s.from), s.authUser)})
	}
	if max := s.b.cfg.SubmitRecipients; s.submitting() && max > 0 && len(s.rcpts)+len(s.remote) >= max {
		return refuse(metrics.ReasonRecipients, &gosmtp.SMTPError{Code: 452, EnhancedCode: gosmtp.EnhancedCode{4, 5, 3},
			Message: fmt.Sprintf("too many recipients: at most %d per submitted message", max)})
	}
	if !s.utf8 && !isASCII(to) {
		return errNeedsUTF8("recipient", to)
	}
	ctx, done := s.command(s.b.cfg.RcptTimeout)
	defer done()
	users, limited, err := s.b.p.Recipients(ctx, to, s.size)
	switch {
	case err == nil:
		// An alias, a sub-address or a catch-all stands for users: they
		// are the message's recipients, each once.
		if s.asked == nil {
			s.asked = map[string]string{}
		}
		for _, u := range users {
			if !slices.Contains(s.rcpts, u) {
				s.rcpts = append(s.rcpts, u)
				s.asked[u] = to
			}
		}
		for _, u := range limited {
			if !slices.Contains(s.limited, u) {
				s.limited = append(s.limited, u)
			}
		}
		return nil
	case errors.Is(err, userdb.ErrQuotaFinal):
		// RFC 3463 5.2.2: mailbox full, and the domain says for good.
		return refuse(metrics.ReasonQuota, &gosmtp.SMTPError{Code: 552, EnhancedCode: gosmtp.EnhancedCode{5, 2, 2},
			Message: fmt.Sprintf("<%s>: mailbox full", to)})
	case errors.Is(err, userdb.ErrOverQuota):
		// RFC 3463 4.2.2: mailbox full, for now (the user may make room).
		return refuse(metrics.ReasonQuota, &gosmtp.SMTPError{Code: 452, EnhancedCode: gosmtp.EnhancedCode{4, 2, 2},
			Message: fmt.Sprintf("<%s>: mailbox full", to)})
	case errors.Is(err, userdb.ErrNotFound):
		return refuse(metrics.ReasonUnknownUser, &gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.EnhancedCode{5, 1, 1},
			Message: fmt.Sprintf("<%s>: no such user here", to)})
	case errors.Is(err, proxy.ErrForeignDomain) && s.submitting() && s.b.cfg.Queue != nil:
		s.remote = append(s.remote, to)
		return nil
	case errors.Is(err, proxy.ErrForeignDomain) && s.submitting():
		return errNoRemote(to)
	case errors.Is(err, proxy.ErrForeignDomain):
		// RFC 5321 §3.6.2: no relaying for unauthenticated senders.
		return refuse(metrics.ReasonRelay, &gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
			Message: fmt.Sprintf("<%s>: relay access denied, domain not served here", to)})
	case s.submitting() && s.b.cfg.Queue != nil && !s.b.p.ServesDomain(userdb.Domain(to)):
		// The lookup failed for now (a node is away), but no node serves
		// the domain: it is another domain's mail all the same.
		s.remote = append(s.remote, to)
		return nil
	default:
		ref := reference()
		s.b.cfg.Logger.Warn("recipient lookup failed", "rcpt", to, "err", err, "ref", ref)
		return refuse(metrics.ReasonUnavailable, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 3, 0},
			Message: fmt.Sprintf("<%s>: temporary failure, try again later (reference %s)", to, ref)})
	}
}

// resultsRoom is the room DATA's buffer keeps before the message, where
// the Authentication-Results field goes without copying the message
// (checkOrigin); a longer field is added by a copy.
const resultsRoom = 2 << 10

var noResults [resultsRoom]byte

// sizeSlack is what Data's buffer holds beyond the declared size: the
// trace fields, a size declared a little short, and the free space
// bytes.Buffer.ReadFrom asks for before it sees the end.
const sizeSlack = 8 << 10

func (s *session) Data(r io.Reader) (err error) {
	// One line per message, accepted or not (logMessage), with an id that
	// the 451 replies give as their reference.
	id, start, size := reference(), time.Now(), 0
	defer func() { s.logMessage(id, size, time.Since(start), err) }()
	if len(s.rcpts) == 0 && len(s.remote) == 0 {
		return refuse(metrics.ReasonNoRecipients, &gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.EnhancedCode{5, 5, 1}, Message: "no valid recipients"})
	}
	var buf bytes.Buffer
	limit := s.b.cfg.MaxMessageBytes
	// One allocation instead of a series of doublings (each a copy of a
	// large message): room for the size MAIL declared, or dataBufStart
	// when it declared none. A declared size is trusted up to the
	// message size limit, which bounds what a session may hold anyway.
	hint := int64(dataBufStart)
	if s.size > 0 && s.size <= limit {
		hint = s.size
	}
	buf.Grow(resultsRoom + int(hint) + sizeSlack)
	buf.Write(noResults[:])
	s.writeTrace(&buf)
	trace := buf.Len() - resultsRoom
	if _, err := buf.ReadFrom(io.LimitReader(r, limit+1)); err != nil {
		return err
	}
	if int64(buf.Len()-resultsRoom-trace) > limit {
		// go-smtp reads and discards the rest of the DATA after we return.
		return errTooLarge(limit)
	}
	// RFC 5321 §2.3.8: lines end in CRLF. A bare LF from a sloppy client is
	// stored as CRLF so the size POP3 and IMAP announce is the size they
	// send.
	whole := buf.Bytes()
	raw := normalizeLF(whole[resultsRoom:])
	if len(raw) == 0 || &raw[0] != &whole[resultsRoom] {
		whole = nil // copied: no room before it
	}
	size = len(raw) - trace
	quarantine := false
	if hops := receivedCount(raw[trace:]); hops >= maxHops {
		// RFC 5321 §6.3: a message that went through this many relays is
		// in a loop (a forward pointing back, an MX naming itself).
		return refuse(metrics.ReasonLoop, &gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.EnhancedCode{5, 4, 6},
			Message: fmt.Sprintf("mail loop: the message has %d Received headers", hops)})
	}
	if s.submitting() {
		body, err := SubmissionHeaders(raw[trace:], s.authUser, s.b.cfg.Hostname, time.Now())
		if err != nil {
			return err
		}
		raw = append(raw[:trace:trace], body...)
	} else if s.b.cfg.Checker != nil && s.authUser == "" {
		var err error
		if raw, quarantine, err = s.checkOrigin(raw, trace, whole); err != nil {
			return err
		}
	}
	// Not cancelled when the client goes away: a client may pipeline and
	// half-close after the final dot while it still waits for the reply,
	// which the kernel cannot tell from a hang-up, and a delivery cut
	// short would turn its 250 into a 451.
	ctx, cancel := context.WithTimeout(context.Background(), s.b.cfg.DeliverTimeout)
	defer cancel()
	if l := s.b.cfg.Sends; s.submitting() && l != nil {
		// Counted now, before the message is stored, so that parallel
		// sessions of one user cannot all pass the check made at MAIL.
		at := time.Now()
		if ok, n := l.Take(s.authUser, at); !ok {
			return refuse(metrics.ReasonRateLimit, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 7, 1},
				Message: fmt.Sprintf("%s sent %d messages in the last hour, the limit is %d: try again later", s.authUser, n, l.Limit())})
		}
		defer func() {
			if err != nil {
				l.Undo(s.authUser, at)
			} else {
				l.Sent(s.authUser, at)
			}
		}()
	}
	// With remote recipients the whole message goes to the queue below,
	// whose local delivery checks each quota with the real size.
	if full, final := s.fullAtData(ctx, raw, trace); len(full) > 0 {
		switch {
		case len(full) == len(s.rcpts) && final:
			// RFC 3463 5.2.2: every recipient's domain refuses for good.
			return refuse(metrics.ReasonQuota, &gosmtp.SMTPError{Code: 552, EnhancedCode: gosmtp.EnhancedCode{5, 2, 2},
				Message: fmt.Sprintf("mailbox full: %s", strings.Join(s.askedFor(full), ", "))})
		case len(full) == len(s.rcpts) || quarantine:
			// A quarantined message would reach the queue's local
			// delivery as ordinary mail (INBOX, not Junk): it waits for
			// room with the sender instead.
			// RFC 3463 4.2.2: mailbox full, for now.
			return refuse(metrics.ReasonQuota, &gosmtp.SMTPError{Code: 452, EnhancedCode: gosmtp.EnhancedCode{4, 2, 2},
				Message: fmt.Sprintf("mailbox full: %s", strings.Join(s.askedFor(full), ", "))})
		case s.b.cfg.Defer != nil:
			// One durable write decides the 250, as for remote
			// recipients: the queue delivers to the others now.
			if err := s.b.cfg.Defer.Enqueue(ctx, "", s.from, s.rcpts, raw[len(returnPath(s.from)):]); err != nil {
				metrics.DeliveryFailures.Inc()
				ref := id
				s.b.cfg.Logger.Error("queueing for a full mailbox failed", "from", s.from, "rcpts", s.rcpts, "err", err, "ref", ref)
				return refuse(metrics.ReasonStorage, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 3, 0},
					Message: fmt.Sprintf("message not stored, try again later (reference %s)", ref)})
			}
			s.b.cfg.Logger.Info("message queued: a recipient's mailbox is full", "full", full, "rcpts", s.rcpts)
			return nil
		default:
			s.b.cfg.Logger.Warn("delivered past quota: no queue to wait in", "full", full, "size", len(raw))
		}
	}
	if len(s.remote) > 0 {
		// One durable write decides the 250: the local recipients ride
		// in the same queue entry (its runner delivers them here), so a
		// failure cannot leave some recipients served and the client
		// sending again to all. What is queued carries no Return-Path
		// (RFC 5321 §4.4: final delivery adds it).
		relay := raw[len(returnPath(s.from)):]
		all := append(slices.Clone(s.rcpts), s.remote...)
		if err := s.b.cfg.Queue.Enqueue(ctx, s.authUser, s.from, all, relay); err != nil {
			metrics.DeliveryFailures.Inc()
			ref := id
			s.b.cfg.Logger.Error("queueing failed", "from", s.from, "rcpts", all, "err", err, "ref", ref)
			return refuse(metrics.ReasonStorage, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 3, 0},
				Message: fmt.Sprintf("message not queued, try again later (reference %s)", ref)})
		}
		return nil
	}
	deliver := s.b.p.Deliver
	if quarantine {
		deliver = s.b.p.DeliverJunk
	}
	if err := deliver(ctx, s.rcpts, raw); err != nil {
		metrics.DeliveryFailures.Inc()
		ref := id
		s.b.cfg.Logger.Error("delivery failed", "from", s.from, "rcpts", s.rcpts, "err", err, "ref", ref)
		if proxy.NoStorage(err) {
			return refuse(metrics.ReasonStorage, &gosmtp.SMTPError{Code: 452, EnhancedCode: gosmtp.EnhancedCode{4, 3, 1},
				Message: fmt.Sprintf("insufficient system storage, try again later (reference %s)", ref)})
		}
		return refuse(metrics.ReasonStorage, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 3, 0},
			Message: fmt.Sprintf("message not stored, try again later (reference %s)", ref)})
	}
	return nil
}

// fullAtData returns the local recipients whose quota cannot take the
// message as it came (raw, trace headers first). RCPT checked the size MAIL
// declared; only a body larger than that (or none declared) is checked
// again, so a client that declares its size costs nothing more, and only
// for the recipients that have a quota (RCPT learnt which), so mail for
// users without one costs no second lookup. A check that cannot be made
// counts as room: RCPT accepted the recipient. final says every full
// recipient's domain makes quota refusals permanent.
func (s *session) fullAtData(ctx context.Context, raw []byte, trace int) (full []string, final bool) {
	if int64(len(raw)-trace) <= s.size || len(s.remote) > 0 {
		return nil, false
	}
	final = true
	for _, r := range s.limited {
		if _, err := s.b.p.CheckRecipient(ctx, r, int64(len(raw))); errors.Is(err, userdb.ErrOverQuota) {
			full = append(full, r)
			final = final && errors.Is(err, userdb.ErrQuotaFinal)
		}
	}
	return full, final
}

// dataBufStart is the room for a message whose size MAIL did not declare
// (most mail is smaller; a larger one grows the buffer as it comes).
const dataBufStart = 8 << 10

// maxHops is the number of Received headers past which a message is taken
// to be looping; RFC 5321 §6.3 suggests at least 100, as Postfix's
// hopcount_limit has it.
const maxHops = 100

// receivedCount counts the Received fields of a message's header.
func receivedCount(msg []byte) int {
	n := 0
	for len(msg) > 0 {
		i := bytes.Index(msg, []byte("\r\n"))
		if i <= 0 { // the blank line ends the header
			break
		}
		if len(msg) >= 9 && bytes.EqualFold(msg[:9], []byte("received:")) {
			n++
		}
		msg = msg[i+2:]
	}
	return n
}

// OriginChecker checks an inbound message's origin (mailauth.Checker).
type OriginChecker interface {
	Check(ctx context.Context, ip net.IP, helo, mailFrom string, rcpts []string, msg []byte) mailauth.Verdict
}

// ARCSealer seals checked inbound mail (RFC 8617): msg with an ARC set
// recording v's findings, or msg as it is.
type ARCSealer interface {
	SealARC(msg []byte, rcpts []string, v mailauth.Verdict) []byte
}

// InboundPolicy gives the recipient domains' policy for a message
// (mailauth.Policy): how they treat a failure of the sender's DMARC.
type InboundPolicy interface {
	InboundPolicy(rcpts []string) mailauth.Policy
}

// checkOrigin checks where a message from another server comes from
// (SPF, DKIM, DMARC) and records the results after the trace headers,
// without any Authentication-Results that claims to be this server's; a
// failure the From: domain's DMARC policy says to reject is refused, one
// it says to quarantine goes to the junk mailbox (quarantine).
func (s *session) checkOrigin(raw []byte, trace int, whole []byte) (out []byte, quarantine bool, err error) {
	body := mailauth.StripOwnResults(raw[trace:], s.b.cfg.Hostname)
	var ip net.IP
	if a, ok := s.conn.Conn().RemoteAddr().(*net.TCPAddr); ok {
		ip = a.IP
	}
	v := s.b.cfg.Checker.Check(context.Background(), ip, s.conn.Hostname(), s.from, s.rcpts, body)
	if v.Spam {
		s.b.cfg.Logger.Info("refused as spam", "from", s.from, "ip", ip, "score", v.Score)
		return nil, false, refuse(metrics.ReasonSpam, &gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
			Message: "message refused: it is spam by this server's filter"})
	}
	if v.Defer {
		s.b.cfg.Logger.Info("deferred by the spam filter", "from", s.from, "ip", ip, "score", v.Score)
		return nil, false, refuse(metrics.ReasonSpam, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 7, 1},
			Message: "message deferred by this server's filter: try again later"})
	}
	if p := s.b.cfg.Policy; p != nil {
		var why string
		if v, why = p.InboundPolicy(s.rcpts).Apply(v); why != "" {
			s.b.cfg.Logger.Info("DMARC failure let in by local policy", "from", s.from, "domain", v.Domain, "ip", ip,
				"why", why, "junk", v.Quarantine)
		}
	}
	if v.Reject {
		s.b.cfg.Logger.Info("refused by the sender's DMARC policy", "from", s.from, "domain", v.Domain, "ip", ip, "results", strings.TrimSpace(v.Header))
		return nil, false, refuse(metrics.ReasonDMARC, &gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
			Message: fmt.Sprintf("message refused: it fails the DMARC policy of %s (RFC 7489)", sanitize(v.Domain))})
	}
	if whole != nil && len(v.Header) <= resultsRoom && len(body) == len(raw)-trace {
		// In place: the trace fields move left into the room Data left
		// before them, the results go between them and the message, and a
		// large message is not copied at all.
		start := resultsRoom - len(v.Header)
		copy(whole[start:], whole[resultsRoom:resultsRoom+trace])
		copy(whole[start+trace:], v.Header)
		out = whole[start:]
	} else {
		// One copy of the message: trace fields, results, the rest.
		out = make([]byte, 0, trace+len(v.Header)+len(body))
		out = append(append(append(out, raw[:trace]...), v.Header...), body...)
	}
	if s.b.cfg.Sealer == nil {
		return out, v.Quarantine, nil
	}
	// The set goes below the trace fields: Return-Path stays first (RFC
	// 5321 §4.4). A message the sealer leaves as it is (no key for the
	// domain) is not copied again.
	checked := out[trace:]
	sealed := s.b.cfg.Sealer.SealARC(checked, s.rcpts, v)
	if len(sealed) == len(checked) && (len(sealed) == 0 || &sealed[0] == &checked[0]) {
		return out, v.Quarantine, nil
	}
	out = append(out[:trace:trace], sealed...)
	return out, v.Quarantine, nil
}

// reference names a failure in the reply and in the log line that holds
// its cause: the cause (node addresses, RPC errors) is not for the client.
func reference() string { return fmt.Sprintf("%08x", rand.Uint32()) }

// client is the remote address of the session, for the log.
func (s *session) client() string {
	if a := s.conn.Conn().RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// logMessage writes the line an operator looks for about one message:
// accepted (size, sender, recipients, client, login), or refused with the
// reply's code and text.
func (s *session) logMessage(id string, size int, took time.Duration, err error) {
	if err != nil {
		s.logRefusal("message refused", err, "id", id, "size", size, "rcpts", strings.Join(append(s.askedFor(s.rcpts), s.remote...), ","))
		return
	}
	s.b.cfg.Logger.Info("message accepted", "id", id, "size", size, "from", s.from,
		"rcpts", strings.Join(s.rcpts, ","), "remote_rcpts", strings.Join(s.remote, ","),
		"client", s.client(), "auth", s.authUser, "ms", took.Milliseconds())
}

// logRefusal logs a refused command with its reply code, enhanced status
// and text (what the client was told), or the error when there was no
// reply (the client went away).
func (s *session) logRefusal(msg string, err error, attrs ...any) {
	attrs = append(attrs, "from", s.from, "client", s.client())
	var se *gosmtp.SMTPError
	if errors.As(err, &se) {
		attrs = append(attrs, "code", se.Code, "status", fmt.Sprintf("%d.%d.%d", se.EnhancedCode[0], se.EnhancedCode[1], se.EnhancedCode[2]), "reason", se.Message)
	} else {
		attrs = append(attrs, "err", err)
	}
	s.b.cfg.Logger.Info(msg, attrs...)
}

func errTooLarge(limit int64) error {
	return refuse(metrics.ReasonSize, &gosmtp.SMTPError{Code: 552, EnhancedCode: gosmtp.EnhancedCode{5, 3, 4},
		Message: fmt.Sprintf("message exceeds the size limit of %d octets", limit)})
}

// normalizeLF turns every LF not preceded by CR into CRLF, copying only when
// there is one.
func normalizeLF(b []byte) []byte {
	bare := 0
	for i, c := range b {
		if c == '\n' && (i == 0 || b[i-1] != '\r') {
			bare++
		}
	}
	if bare == 0 {
		return b
	}
	out := make([]byte, 0, len(b)+bare)
	for i, c := range b {
		if c == '\n' && (i == 0 || b[i-1] != '\r') {
			out = append(out, '\r')
		}
		out = append(out, c)
	}
	return out
}

// writeTrace prepends the trace headers of RFC 5321 §4.4: Return-Path with
// the reverse path, and a Received line naming the client and this node.
func (s *session) writeTrace(w *bytes.Buffer) {
	w.WriteString(returnPath(s.from))
	ip := ""
	if a, ok := s.conn.Conn().RemoteAddr().(*net.TCPAddr); ok {
		ip = a.IP.String()
	}
	helo := sanitize(s.conn.Hostname())
	for_ := ""
	if all := append(s.askedFor(s.rcpts), s.remote...); len(all) == 1 {
		clean := sanitize
		if s.utf8 {
			clean = sanitizeUTF8 // the header is UTF-8 already (RFC 6532)
		}
		for_ = fmt.Sprintf("\r\n\tfor <%s>", clean(all[0]))
	}
	// RFC 3848: ESMTPS when the message came under TLS; RFC 6531 §3.7.3:
	// UTF8SMTP(S)(A) for a transaction with SMTPUTF8.
	with := "ESMTP"
	if s.utf8 {
		with = "UTF8SMTP"
	}
	if _, ok := s.conn.TLSConnectionState(); ok {
		with += "S"
	}
	if s.authUser != "" {
		with += "A"
	}
	fmt.Fprintf(w, "Received: from %s ([%s])\r\n\tby %s (Quill) with %s%s;\r\n\t%s\r\n",
		helo, ip, s.b.cfg.Hostname, with, for_, time.Now().Format(time.RFC1123Z))
}

func returnPath(from string) string { return fmt.Sprintf("Return-Path: <%s>\r\n", from) }

// sanitize keeps client-chosen text from breaking the header it lands in.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x21 || r > 0x7e || r == '(' || r == ')' {
			return -1
		}
		return r
	}, s)
}

// sanitizeUTF8 is sanitize letting UTF-8 letters through, for a header of
// a message that came with SMTPUTF8.
func sanitizeUTF8(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x21 || r == 0x7f || r == '(' || r == ')' || r == utf8.RuneError || (r >= 0x80 && r < 0xa0) {
			return -1
		}
		return r
	}, s)
}

type slogLogger struct{ l *slog.Logger }

func (l slogLogger) Printf(format string, v ...interface{}) {
	l.l.Warn("smtp: " + fmt.Sprintf(format, v...))
}
func (l slogLogger) Println(v ...interface{}) { l.l.Warn("smtp: " + fmt.Sprint(v...)) }
