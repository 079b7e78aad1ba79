package smtp

// SMTP AUTH (RFC 4954) with the mechanisms of internal/saslsrv. It is
// offered where Config.Auth is set: on the implicit-TLS listener
// (submissions, RFC 8314) today; the submission service of issue 12 builds
// on it. An authenticated session is logged under its user; what it may
// send beyond local delivery comes with submission.

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/emersion/go-sasl"
	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/xdg-go/scram"
)

// Authenticator checks credentials: proxy.Proxy is the one in use.
type Authenticator interface {
	saslsrv.Verifier
	SCRAMKeys(ctx context.Context, user string) (scram.StoredCredentials, error)
}

// AuthConfig turns SMTP AUTH on.
type AuthConfig struct {
	Auth Authenticator
	// Logins applies failure delays and lockouts (internal/guard).
	Logins guard.Logins
	// PlaintextAuth says whether a connection not under TLS may
	// authenticate (loopback, test rigs); nil: never.
	PlaintextAuth func(net.Conn) bool
}

// authTimeout bounds the credential check of one AUTH.
const authTimeout = 30 * time.Second

// maxFailedAuth is how many failed AUTH a session may make before it is
// closed (as IMAP and POP3 do).
const maxFailedAuth = 5

// errLockedOut answers AUTH from an address locked out (internal/guard).
var errLockedOut = &gosmtp.SMTPError{Code: 454, EnhancedCode: gosmtp.EnhancedCode{4, 7, 0},
	Message: "too many failed logins from your address; try again later"}

// closeAfterRefusal is how long after its 421 a session that failed AUTH
// too often is closed: time for the reply to be written.
const closeAfterRefusal = time.Second

// authSession is a session that offers AUTH.
type authSession struct {
	*session
	user     string
	failures int
}

func (s *authSession) tlsOn() bool {
	_, ok := s.conn.TLSConnectionState()
	return ok
}

// mayAuth says whether this connection may carry credentials.
func (s *authSession) mayAuth() bool {
	f := s.b.cfg.AuthConfig.PlaintextAuth
	return s.tlsOn() || (f != nil && f(s.conn.Conn()))
}

// AuthMechanisms implements gosmtp.AuthSession: none before TLS, so EHLO
// does not offer AUTH where a password would cross in clear.
func (s *authSession) AuthMechanisms() []string {
	if !s.mayAuth() {
		return nil
	}
	return saslsrv.Mechanisms
}

// Auth implements gosmtp.AuthSession.
func (s *authSession) Auth(mech string) (sasl.Server, error) {
	switch {
	case s.failures >= maxFailedAuth:
		// go-smtp cannot answer and hang up in one step: the 421 goes out
		// now, the connection is closed just after.
		time.AfterFunc(closeAfterRefusal, func() { s.conn.Close() })
		return nil, &gosmtp.SMTPError{Code: 421, EnhancedCode: gosmtp.EnhancedCode{4, 7, 0}, Message: "too many failed AUTH attempts; closing connection"}
	case s.user != "":
		// RFC 4954 §4: AUTH is not permitted once authenticated.
		return nil, &gosmtp.SMTPError{Code: 503, EnhancedCode: gosmtp.EnhancedCode{5, 5, 1}, Message: "already authenticated"}
	case s.session.inTx:
		// RFC 4954 §4: nor during a mail transaction (a sender given
		// before AUTH would escape the submission's sender check).
		return nil, &gosmtp.SMTPError{Code: 503, EnhancedCode: gosmtp.EnhancedCode{5, 5, 1}, Message: "AUTH is not permitted during a mail transaction: RSET first"}
	case !s.mayAuth():
		return nil, &gosmtp.SMTPError{Code: 538, EnhancedCode: gosmtp.EnhancedCode{5, 7, 11}, Message: "encryption required: use STARTTLS first"}
	}
	ac := s.b.cfg.AuthConfig
	// A locked-out address is refused before the exchange starts, so a
	// SCRAM exchange never reaches the proof (which would tell a right
	// guess from a wrong one).
	if ac.Logins != nil && ac.Logins.LoginAllowed(s.conn.Conn().RemoteAddr()) != nil {
		s.failures++
		metrics.Login(s.b.protocol(), metrics.LoginLockedOut)
		return nil, errLockedOut
	}
	srv, err := saslsrv.New(mech, func(user string) (scram.StoredCredentials, error) {
		ctx, done := s.command(authTimeout)
		defer done()
		return ac.Auth.SCRAMKeys(ctx, user)
	}, s.finish)
	if errors.Is(err, saslsrv.ErrUnsupported) {
		return nil, &gosmtp.SMTPError{Code: 504, EnhancedCode: gosmtp.EnhancedCode{5, 5, 4}, Message: "mechanism not supported; offered: SCRAM-SHA-256 PLAIN LOGIN"}
	}
	if err != nil {
		return nil, err
	}
	return smtpSASL{srv}, nil
}

// smtpSASL answers a malformed SASL message with 501 (RFC 4954 §4).
type smtpSASL struct{ sasl.Server }

func (e smtpSASL) Next(resp []byte) ([]byte, bool, error) {
	ch, done, err := e.Server.Next(resp)
	if errors.Is(err, saslsrv.ErrMalformed) {
		return nil, false, &gosmtp.SMTPError{Code: 501, EnhancedCode: gosmtp.EnhancedCode{5, 5, 2}, Message: err.Error()}
	}
	return ch, done, err
}

// finish checks the credentials an exchange ended in, with the same
// lockout and growing delay as IMAP and POP3.
func (s *authSession) finish(creds saslsrv.Credentials, exErr error) error {
	ac, log := s.b.cfg.AuthConfig, s.b.cfg.Logger
	remote := s.conn.Conn().RemoteAddr()
	if ac.Logins != nil {
		if err := ac.Logins.LoginAllowed(remote); err != nil {
			s.failures++
			metrics.Login(s.b.protocol(), metrics.LoginLockedOut)
			log.Warn("smtp: AUTH refused: address locked out", "user", creds.User, "remote", remote.String())
			return errLockedOut
		}
	}
	ctx, done := s.command(authTimeout)
	defer done()
	o := saslsrv.Check(ctx, ac.Auth, ac.Logins, remote, s.b.cfg.AuthFailDelay, creds, exErr)
	if o.Err != nil && !o.Wrong {
		ref := reference()
		metrics.Login(s.b.protocol(), metrics.LoginUnavailable)
		log.Warn("smtp: AUTH unavailable", "user", creds.User, "mech", creds.Mechanism, "err", o.Err, "ref", ref)
		return &gosmtp.SMTPError{Code: 454, EnhancedCode: gosmtp.EnhancedCode{4, 7, 0},
			Message: "temporary authentication failure, try again later (reference " + ref + ")"}
	}
	if o.Err != nil {
		s.failures++
		metrics.Login(s.b.protocol(), metrics.LoginFailed)
		log.Info("smtp: AUTH failed", "user", creds.User, "mech", creds.Mechanism, "remote", remote.String(), "err", o.Err, "delay", o.Delay)
		if o.Delay > 0 {
			retry.Sleep(ctx, o.Delay)
		}
		return &gosmtp.SMTPError{Code: 535, EnhancedCode: gosmtp.EnhancedCode{5, 7, 8}, Message: "authentication credentials invalid"}
	}
	prof := o.Profile
	s.user, s.session.authUser = prof.Address, prof.Address
	metrics.Login(s.b.protocol(), metrics.LoginOK)
	log.Info("smtp: AUTH succeeded", "user", s.user, "mech", creds.Mechanism, "remote", remote.String())
	return nil
}
