package imap

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/xdg-go/scram"
)

// Store is what the IMAP proxy needs of a user's mail. proxy.IMAPStore is
// the one in use: it reaches the user's mailbox writer and the fragments on
// every node, on one node or many.
type Store interface {
	EnsureUser(ctx context.Context, user string) error
	Mailboxes(ctx context.Context, user string) ([]mailbox.Mailbox, error)
	// MailboxList is Mailboxes with the subscribed names that have no
	// mailbox (RFC 9051 §6.3.7).
	MailboxList(ctx context.Context, user string) ([]mailbox.Mailbox, []string, error)
	Mailbox(ctx context.Context, user, name string) (*mailbox.Mailbox, error)
	MailboxByID(ctx context.Context, user string, id uint64) (*mailbox.Mailbox, error)
	Messages(ctx context.Context, user string, mbox uint64) ([]mailbox.Message, error)
	Body(ctx context.Context, user, id string) ([]byte, error)
	Append(ctx context.Context, user, name string, raw []byte, flags []string, date time.Time) (*mailbox.Mailbox, mailbox.Message, error)
	// AppendMulti stores several messages in a mailbox, all or none
	// (MULTIAPPEND, RFC 3502), and returns them in their order.
	AppendMulti(ctx context.Context, user, name string, msgs []mailbox.NewMessage) (*mailbox.Mailbox, []mailbox.Message, error)
	CreateMailbox(ctx context.Context, user, name, specialUse string) (*mailbox.Mailbox, error)
	DeleteMailbox(ctx context.Context, user, name string) error
	RenameMailbox(ctx context.Context, user, from, to string) error
	SetSubscribed(ctx context.Context, user, name string, on bool) error
	StoreFlags(ctx context.Context, user string, mbox uint64, uids []uint32, op mailbox.FlagOp, flags []string, unchangedSince uint64) ([]mailbox.Message, []uint32, error)
	ExpungeDeleted(ctx context.Context, user string, mbox uint64, uids []uint32) ([]uint32, error)
	Copy(ctx context.Context, user string, src uint64, uids []uint32, dst string, move bool) (*mailbox.CopyResult, error)
	// MailboxUsage is Mailbox (nil for name "") with what the user's mail
	// takes over all mailboxes and the user's quota limits (RFC 9208),
	// from one call to the user's writer: APPEND and COPY need both.
	MailboxUsage(ctx context.Context, user, name string) (*mailbox.Mailbox, mailbox.Usage, error)
	// DomainRoom refuses (an error wrapping userdb.ErrOverQuota) n
	// messages of size bytes in all that would take the user's domain past
	// the domain's quota, which delivery enforces too.
	DomainRoom(ctx context.Context, user string, n, size int64) error
	// Subscribe tells of changes to the user's mail until its cancel is
	// called or ctx ends.
	Subscribe(ctx context.Context, user string) (<-chan mailbox.Change, func())
}

// Authenticator checks a user's password; proxy.IMAPAuth is the one in use.
type Authenticator interface {
	saslsrv.Verifier
	// SCRAMKeys returns a user's SCRAM-SHA-256 keys, or an error wrapping
	// saslsrv.NotFound.
	SCRAMKeys(ctx context.Context, user string) (scram.StoredCredentials, error)
}
