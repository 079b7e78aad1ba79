// Package saslsrv holds the server side of the SASL mechanisms (RFC 4422)
// that IMAP AUTHENTICATE, POP3 AUTH and SMTP AUTH share: PLAIN (RFC 4616),
// LOGIN (draft-murchison-sasl-login, still what many clients send) and
// SCRAM-SHA-256 (RFC 7677). It is the edge of Porcupine's proxy (§2.3.2):
// the exchange ends in credentials that the protocol server checks through
// the user manager, with the same failure delays and lockouts for every
// mechanism.
//
// go-sasl gives PLAIN and the Server interface the protocol libraries take;
// it has no LOGIN server, and SCRAM comes from github.com/xdg-go/scram. What
// is written here is the glue: one exchange type whose outcome is either a
// password to check (PLAIN, LOGIN) or a proof already checked (SCRAM), so
// each protocol has one login path.
package saslsrv

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/emersion/go-sasl"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/xdg-go/scram"
)

// Mechanism names, as the protocols advertise them.
const (
	Plain       = "PLAIN"
	Login       = "LOGIN"
	SCRAMSHA256 = "SCRAM-SHA-256"
)

// Mechanisms are the mechanisms every protocol offers, strongest first
// (clients that pick the first they know then pick SCRAM).
var Mechanisms = []string{SCRAMSHA256, Plain, Login}

// ErrAuthFailed means the client's credentials were wrong: a wrong SCRAM
// proof, or a request to act as another user. The protocol answers it like
// a wrong password.
var ErrAuthFailed = errors.New("authentication failed")

// ErrUnsupported is returned by New for a mechanism not offered.
var ErrUnsupported = errors.New("SASL mechanism not supported")

// ErrMalformed wraps a client message that breaks the mechanism's syntax;
// the protocol answers it as a client error, not as a failed login.
var ErrMalformed = errors.New("malformed SASL message")

// Credentials are what an exchange established.
type Credentials struct {
	Mechanism string
	User      string
	// Password is set by PLAIN and LOGIN, for the protocol to check.
	Password string
	// Proven is set by SCRAM: the client proved it knows the password
	// whose keys Lookup gave.
	Proven bool
}

// Lookup returns the SCRAM-SHA-256 keys of a user. It returns an error
// wrapping NotFound for a user that does not exist or has no keys; any
// other error ends the exchange as a temporary failure.
type Lookup func(user string) (scram.StoredCredentials, error)

// NotFound is what a Lookup wraps for a user without SCRAM keys.
var NotFound = errors.New("no SCRAM keys for user")

// Finish completes a login when the exchange is over. err is nil when the
// client finished the exchange (creds are then complete), ErrAuthFailed
// when its proof was wrong, or the Lookup's error. Finish checks the
// credentials, opens the session and applies failure delays; what it
// returns is the exchange's outcome for the protocol.
type Finish func(creds Credentials, err error) error

// New starts the server side of one exchange of mech. The result is a
// go-sasl Server, as the IMAP and SMTP libraries take.
func New(mech string, lookup Lookup, finish Finish) (sasl.Server, error) {
	switch strings.ToUpper(mech) {
	case Plain:
		return &plainServer{finish: finish}, nil
	case Login:
		return &loginServer{finish: finish}, nil
	case SCRAMSHA256:
		return newSCRAM(lookup, finish)
	}
	return nil, fmt.Errorf("%w: %s", ErrUnsupported, mech)
}

// plainServer is PLAIN (RFC 4616 §2): [authzid] NUL authcid NUL passwd.
// go-sasl's PLAIN server would serve, but it calls back inside the parse
// and gives unnamed errors; this one names what was wrong.
type plainServer struct {
	finish Finish
	done   bool
}

func (s *plainServer) Next(resp []byte) ([]byte, bool, error) {
	if s.done {
		return nil, false, fmt.Errorf("%w: response after the end", ErrMalformed)
	}
	if resp == nil { // no initial response: an empty challenge asks for it
		return nil, false, nil
	}
	s.done = true
	authz, user, pass, err := parsePlain(resp)
	if err != nil {
		return nil, false, err
	}
	creds := Credentials{Mechanism: Plain, User: user, Password: pass}
	if authz != "" && authz != user {
		// Acting as another user is an admin feature Quill does not have.
		return nil, false, s.finish(Credentials{Mechanism: Plain, User: user}, fmt.Errorf("%w: may not act as %.40q", ErrAuthFailed, authz))
	}
	return nil, true, s.finish(creds, nil)
}

// parsePlain splits a PLAIN message (RFC 4616 §2).
func parsePlain(msg []byte) (authz, user, pass string, err error) {
	parts := strings.Split(string(msg), "\x00")
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("%w: want 3 NUL-separated fields, got %d", ErrMalformed, len(parts))
	}
	if parts[1] == "" || parts[2] == "" {
		return "", "", "", fmt.Errorf("%w: empty user name or password", ErrMalformed)
	}
	return parts[0], parts[1], parts[2], nil
}

// loginServer is LOGIN: the server asks "Username:" then "Password:", and
// the client answers each (an initial response is the user name).
type loginServer struct {
	finish Finish
	step   int
	user   string
}

func (s *loginServer) Next(resp []byte) ([]byte, bool, error) {
	switch s.step {
	case 0:
		s.step = 1
		if resp == nil {
			return []byte("Username:"), false, nil
		}
		fallthrough
	case 1:
		if len(resp) == 0 {
			return nil, false, fmt.Errorf("%w: empty user name", ErrMalformed)
		}
		s.user, s.step = string(resp), 2
		return []byte("Password:"), false, nil
	case 2:
		s.step = 3
		if len(resp) == 0 {
			return nil, false, fmt.Errorf("%w: empty password", ErrMalformed)
		}
		return nil, true, s.finish(Credentials{Mechanism: Login, User: s.user, Password: string(resp)}, nil)
	}
	return nil, false, fmt.Errorf("%w: response after the end", ErrMalformed)
}

// localKey makes the SCRAM salt of a user that does not exist when no
// cluster key is set: the same for the same name within a process, so
// asking twice does not tell (a salt that changed between asks would).
var localKey = func() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}()

// fakeKey returns the key of fake salts (SetFakeKey).
var fakeKey atomic.Pointer[func(local []byte) []byte]

// SetFakeKey sets where the key of fake salts comes from: the node gives
// one shared by the cluster, so that the salts of unknown users are the
// same on every node (as a real user's are). f gets the process's own key
// to return until the cluster's exists.
func SetFakeKey(f func(local []byte) []byte) { fakeKey.Store(&f) }

// fakeCredentials are keys no password matches, with a salt that looks
// like a real user's, so SCRAM does not tell which users exist.
func fakeCredentials(user string) scram.StoredCredentials {
	key := localKey
	if f := fakeKey.Load(); f != nil {
		key = (*f)(localKey)
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(user))
	sum := h.Sum(nil)
	junk := make([]byte, 32)
	rand.Read(junk)
	return scram.StoredCredentials{KeyFactors: scram.KeyFactors{Salt: string(sum[:16]), Iters: userdb.SCRAMIterations},
		StoredKey: junk, ServerKey: junk}
}

// scramServer is SCRAM-SHA-256 (RFC 5802, RFC 7677) over xdg-go/scram.
// The server-final message travels as a last challenge, answered by an
// empty response, which is how IMAP, POP3 and SMTP carry it (none of them
// is used here with RFC 4422's additional data on success).
type scramServer struct {
	conv    *scram.ServerConversation
	finish  Finish
	lookErr error // a Lookup failure other than NotFound
	step    int
	user    string
}

func newSCRAM(lookup Lookup, finish Finish) (sasl.Server, error) {
	s := &scramServer{finish: finish}
	srv, err := scram.SHA256.NewServer(func(user string) (scram.StoredCredentials, error) {
		s.user = user
		c, err := lookup(user)
		if errors.Is(err, NotFound) {
			return fakeCredentials(user), nil
		}
		if err != nil {
			s.lookErr = err
			return c, err
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	s.conv = srv.NewConversation()
	return s, nil
}

func (s *scramServer) Next(resp []byte) ([]byte, bool, error) {
	switch s.step {
	case 0:
		if resp == nil {
			s.step = 1
			return nil, false, nil // empty challenge: send client-first
		}
		fallthrough
	case 1:
		s.step = 2
		out, err := s.conv.Step(string(resp))
		if s.lookErr != nil {
			return nil, false, s.finish(Credentials{Mechanism: SCRAMSHA256, User: s.user}, s.lookErr)
		}
		if err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if z := s.conv.AuthzID(); z != "" && z != s.conv.Username() {
			return nil, false, s.finish(Credentials{Mechanism: SCRAMSHA256, User: s.user}, fmt.Errorf("%w: may not act as %.40q", ErrAuthFailed, z))
		}
		return []byte(out), false, nil
	case 2:
		s.step = 3
		out, err := s.conv.Step(string(resp))
		if err != nil || !s.conv.Valid() {
			// A wrong proof and a malformed final message are not told
			// apart: both are a failed login, and count as one.
			return nil, false, s.finish(Credentials{Mechanism: SCRAMSHA256, User: s.user}, ErrAuthFailed)
		}
		return []byte(out), false, nil // server-final (v=...), for the client to check
	case 3:
		s.step = 4
		if len(resp) != 0 {
			return nil, false, fmt.Errorf("%w: want an empty response after the server's final message", ErrMalformed)
		}
		return nil, true, s.finish(Credentials{Mechanism: SCRAMSHA256, User: s.user, Proven: true}, nil)
	}
	return nil, false, fmt.Errorf("%w: response after the end", ErrMalformed)
}
