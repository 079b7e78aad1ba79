package saslsrv

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/userdb"
)

// Verifier checks credentials against the user manager: proxy.Proxy is
// the one in use.
type Verifier interface {
	Login(ctx context.Context, user, password string) (*userdb.Profile, error)
	// Proven returns the profile of a user whose SCRAM proof was checked.
	Proven(ctx context.Context, user string) (*userdb.Profile, error)
}

// Outcome is what Check found.
type Outcome struct {
	Profile *userdb.Profile // set on success
	// Wrong says the credentials were wrong (unknown user, wrong password
	// or proof, another identity); Delay is then how long to wait before
	// answering. Err without Wrong is a temporary failure.
	Wrong bool
	Delay time.Duration
	Err   error
}

// Check ends a login the same way for every protocol: it checks the
// credentials an exchange (or a LOGIN/PASS command) ended in, and records
// the failure or success with the guard, which gives the delay of a
// failure (fallback when there is no guard). The caller logs, waits and
// answers in its protocol's words.
func Check(ctx context.Context, v Verifier, logins guard.Logins, remote net.Addr, fallback time.Duration, creds Credentials, exErr error) Outcome {
	var o Outcome
	o.Err = exErr
	switch {
	case o.Err != nil:
	case creds.Proven:
		o.Profile, o.Err = v.Proven(ctx, creds.User)
	default:
		o.Profile, o.Err = v.Login(ctx, creds.User, creds.Password)
	}
	o.Wrong = errors.Is(o.Err, userdb.ErrNotFound) || errors.Is(o.Err, userdb.ErrPasswordMismatch) || errors.Is(o.Err, ErrAuthFailed)
	switch {
	case o.Wrong:
		o.Delay = fallback
		if logins != nil {
			o.Delay = logins.LoginFailed(remote, creds.User)
		}
	case o.Err == nil && logins != nil:
		logins.LoginSucceeded(remote)
	}
	return o
}
