package smtp

import (
	"errors"
	"io"
	"strconv"

	"github.com/emersion/go-sasl"
	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/metrics"
)

// Counting: every MAIL, RCPT, DATA (BDAT too) and AUTH a session answers
// is counted by its reply class (metrics.Commands), and a refused MAIL,
// RCPT or DATA by its reason (metrics.Refusals). The other commands are
// answered by go-smtp itself, which offers no hook, and are not counted.
//
// A refusal carries its reason to the count beside the reply: the session
// returns refuse(reason, reply), and counted takes the reason off before
// go-smtp, which wants the *SMTPError itself, sees the reply.

// refusal is a reply refusing a command, with the reason it is counted
// under (one of metrics.Reason*).
type refusal struct {
	reason string
	*gosmtp.SMTPError
}

func (r *refusal) Unwrap() error { return r.SMTPError }

// refuse tags a refusing reply with its reason.
func refuse(reason string, reply *gosmtp.SMTPError) error {
	return &refusal{reason: reason, SMTPError: reply}
}

// protocol names the listener's sessions in the metrics: smtp for the
// port of other servers, submission for the ports that offer AUTH
// (submission and submissions).
func (b *backend) protocol() string {
	if b.cfg.AuthConfig.Auth != nil {
		return "submission"
	}
	return "smtp"
}

// counted counts the commands of a session.
type counted struct {
	gosmtp.Session
	proto string
}

func (c counted) Mail(from string, opts *gosmtp.MailOptions) error {
	return c.done("MAIL", c.Session.Mail(from, opts))
}

func (c counted) Rcpt(to string, opts *gosmtp.RcptOptions) error {
	return c.done("RCPT", c.Session.Rcpt(to, opts))
}

func (c counted) Data(r io.Reader) error { return c.done("DATA", c.Session.Data(r)) }

// done counts a command's answer and returns the error go-smtp answers
// with (a refusal's reply without its reason).
func (c counted) done(cmd string, err error) error {
	reason := metrics.ReasonOther
	var r *refusal
	if errors.As(err, &r) {
		reason, err = r.reason, r.SMTPError
	}
	class := replyClass(err)
	metrics.Commands.WithLabelValues(c.proto, cmd, class).Inc()
	if cmd != "AUTH" && (class == "4xx" || class == "5xx") {
		metrics.Refusals.WithLabelValues(c.proto, stage[cmd], reason).Inc()
	}
	return err
}

// stage is the refusals' label of each counted command.
var stage = map[string]string{"MAIL": "mail", "RCPT": "rcpt", "DATA": "data"}

// replyClass is the class of the reply err stands for: 2xx for none,
// the code's class for an *SMTPError, and error for another error (the
// client went away while DATA was read: nobody is answered).
func replyClass(err error) string {
	if err == nil {
		return "2xx"
	}
	var se *gosmtp.SMTPError
	if errors.As(err, &se) && se.Code >= 200 && se.Code < 600 {
		return strconv.Itoa(se.Code/100) + "xx"
	}
	return "error"
}

// countedAuth counts a session that offers AUTH: the AUTH command is
// counted when it ends, refused at once or after its SASL exchange.
type countedAuth struct {
	counted
	auth gosmtp.AuthSession
}

func (c countedAuth) AuthMechanisms() []string { return c.auth.AuthMechanisms() }

func (c countedAuth) Auth(mech string) (sasl.Server, error) {
	srv, err := c.auth.Auth(mech)
	if err != nil {
		return nil, c.done("AUTH", err)
	}
	return countedSASL{srv, c.counted}, nil
}

// countedSASL counts the AUTH whose exchange it carries when it ends.
type countedSASL struct {
	sasl.Server
	c counted
}

func (s countedSASL) Next(resp []byte) ([]byte, bool, error) {
	ch, done, err := s.Server.Next(resp)
	if done || err != nil {
		err = s.c.done("AUTH", err)
	}
	return ch, done, err
}
