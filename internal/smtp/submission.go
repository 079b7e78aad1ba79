package smtp

// Message submission (RFC 6409) on its own listener (--submission, port
// 587 in production): AUTH is required before MAIL, the envelope sender
// and every From: address must be the authenticated user's, and Date and
// Message-ID are added when missing (§8.2, §8.3). Local recipients are
// delivered as any mail is; remote ones go to the outbound queue
// (internal/queue), and the 250 means the queue holds the message under
// the user's write policy.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/mail"
	"strings"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/userdb"
)

var errAuthRequired = &gosmtp.SMTPError{Code: 530, EnhancedCode: gosmtp.EnhancedCode{5, 7, 0},
	Message: "authentication required: AUTH first (RFC 6409 §4.3)"}

// submitting reports a session that submits mail (RFC 6409): every
// session of a submission listener, and an authenticated one on the
// implicit-TLS port (RFC 8314 §3.3 makes 465 a submission port; it also
// takes unauthenticated mail for local users, as port 25 does).
func (s *session) submitting() bool { return s.b.cfg.Submission || s.authUser != "" }

// Mail implements gosmtp.Session: on a submission listener only the
// authenticated user's own address may be the envelope sender.
func (s *authSession) Mail(from string, opts *gosmtp.MailOptions) error {
	if s.b.cfg.Submission && s.user == "" {
		return refuse(metrics.ReasonAuthRequired, errAuthRequired)
	}
	if s.submitting() {
		if !sameAddress(from, s.user) {
			return refuse(metrics.ReasonSender, &gosmtp.SMTPError{Code: 553, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
				Message: fmt.Sprintf("sender <%s> is not an address of %s", sanitize(from), s.user)})
		}
		if l := s.b.cfg.Sends; l != nil {
			if ok, n := l.Allow(s.user, time.Now()); !ok {
				return refuse(metrics.ReasonRateLimit, &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 7, 1},
					Message: fmt.Sprintf("%s sent %d messages in the last hour, the limit is %d: try again later", s.user, n, l.Limit())})
			}
		}
	}
	return s.session.Mail(from, opts)
}

// Rcpt implements gosmtp.Session.
func (s *authSession) Rcpt(to string, opts *gosmtp.RcptOptions) error {
	if s.b.cfg.Submission && s.user == "" {
		return refuse(metrics.ReasonAuthRequired, errAuthRequired)
	}
	return s.session.Rcpt(to, opts)
}

func sameAddress(a, b string) bool { return userdb.Normalize(a) == userdb.Normalize(b) }

// SubmissionHeaders checks and completes the header of a submitted message
// (without trace headers): every From: address must be user's, and Date
// and Message-ID are added when missing, host naming the Message-ID's
// right-hand side. It returns the message to store, or an SMTP error.
func SubmissionHeaders(msg []byte, user, host string, now time.Time) ([]byte, error) {
	m, err := mail.ReadMessage(bytes.NewReader(msg))
	if err != nil {
		return nil, refuse(metrics.ReasonContent, &gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.EnhancedCode{5, 6, 0},
			Message: "message header cannot be parsed: " + sanitizeText(err.Error())})
	}
	fromField := m.Header.Get("From")
	if fromField == "" {
		return nil, refuse(metrics.ReasonContent, &gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.EnhancedCode{5, 6, 0},
			Message: "message has no From: header (RFC 5322 §3.6)"})
	}
	from, err := mail.ParseAddressList(fromField)
	if err != nil {
		return nil, refuse(metrics.ReasonContent, &gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.EnhancedCode{5, 6, 0},
			Message: "From: header cannot be parsed: " + sanitizeText(err.Error())})
	}
	for _, a := range from {
		if !sameAddress(a.Address, user) {
			return nil, refuse(metrics.ReasonSender, &gosmtp.SMTPError{Code: 553, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
				Message: fmt.Sprintf("From: <%s> is not an address of %s", sanitize(a.Address), user)})
		}
	}
	var add bytes.Buffer
	if m.Header.Get("Date") == "" {
		fmt.Fprintf(&add, "Date: %s\r\n", now.Format(time.RFC1123Z))
	}
	if m.Header.Get("Message-Id") == "" {
		id := make([]byte, 12)
		rand.Read(id)
		fmt.Fprintf(&add, "Message-ID: <%s@%s>\r\n", hex.EncodeToString(id), host)
	}
	if add.Len() == 0 {
		return msg, nil
	}
	return append(add.Bytes(), msg...), nil
}

// sanitizeText keeps a library's error text to one printable line.
func sanitizeText(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return -1
		}
		return r
	}, s)
}

// SendLimit bounds the messages a user submits per hour, across the
// cluster (node.Node shares the counts).
type SendLimit interface {
	// Allow says whether user may submit another message now, and how
	// many they submitted in the last hour (a check at MAIL).
	Allow(user string, now time.Time) (bool, int)
	// Take counts a message about to be accepted if the limit allows it
	// (check and count in one step, at DATA); Undo takes the count back
	// when the message is not accepted after all.
	Take(user string, at time.Time) (bool, int)
	Undo(user string, at time.Time)
	// Sent tells the cluster of a message user submitted (counted here
	// by Take).
	Sent(user string, at time.Time)
	Limit() int
}

// Queuer is what submission needs of the outbound queue: take raw from
// from to rcpts for user, durably, before the 250.
type Queuer interface {
	Enqueue(ctx context.Context, user, from string, rcpts []string, raw []byte) error
}

// errNoRemote refuses a remote recipient on a listener without a queue.
func errNoRemote(to string) error {
	return refuse(metrics.ReasonRelay, &gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.EnhancedCode{5, 7, 1},
		Message: fmt.Sprintf("<%s>: this server does not relay to other domains", sanitize(to))})
}
