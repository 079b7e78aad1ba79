package pop3

import (
	"context"
	"errors"
	"io"

	"github.com/xdg-go/scram"
)

// ErrAuthFailed is returned by Backend.Login when the address or password is
// wrong. The server answers it with -ERR [AUTH] (RFC 3206) after
// Config.AuthFailDelay, the same reply for an unknown user as for a wrong
// password, so the reply does not tell the two apart.
var ErrAuthFailed = errors.New("authentication failed")

// Backend is the seam between the POP3 retrieval proxy and the managers
// (Porcupine §2.3.2): the proxy authenticates through the user manager and
// reads the user's mailbox fragments through the mailbox managers. A one-node
// install and a cluster both satisfy it, so there is one code path.
type Backend interface {
	// Login checks the credentials and opens the user's maildrop (INBOX).
	// Wrong credentials return an error wrapping ErrAuthFailed.
	Login(ctx context.Context, username, password string) (Maildrop, error)
	// SCRAMKeys returns a user's SCRAM-SHA-256 keys, or an error wrapping
	// saslsrv.NotFound.
	SCRAMKeys(ctx context.Context, username string) (scram.StoredCredentials, error)
	// Open opens the maildrop of a user whose SCRAM proof was checked.
	Open(ctx context.Context, username string) (Maildrop, error)
}

// Message is one entry of the maildrop snapshot taken at login.
type Message struct {
	// UID is the message's unique id, stable across sessions and restarts
	// (RFC 1939 UIDL: 1 to 70 characters in 0x21..0x7E).
	UID string
	// Size is the exact size in octets of the message as RETR sends it
	// before dot-stuffing (lines end in CRLF).
	Size int64
}

// Maildrop is one user's INBOX as a POP3 session sees it.
type Maildrop interface {
	// List returns the messages present at the start of the session, oldest
	// first. The server calls it once, after login, and numbers messages
	// from it (RFC 1939 §5: numbers stay fixed for the session).
	List(ctx context.Context) ([]Message, error)
	// Open returns the whole message, CRLF line endings, not dot-stuffed.
	Open(ctx context.Context, uid string) (io.ReadCloser, error)
	// Delete removes the messages; the server calls it once, at QUIT in the
	// TRANSACTION state (RFC 1939 §6, UPDATE state). Messages already gone
	// are not an error.
	Delete(ctx context.Context, uids []string) error
	// Close releases the maildrop; called once when the session ends.
	Close() error
}
