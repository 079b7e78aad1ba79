package imap

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/userdb"
)

// Store is what the IMAP proxy needs of a user's mail. proxy.IMAPStore is
// the one in use: it reaches the user's mailbox writer and the fragments on
// every node, on one node or many.
type Store interface {
	EnsureUser(user string) error
	Mailboxes(user string) ([]mailbox.Mailbox, error)
	Mailbox(user, name string) (*mailbox.Mailbox, error)
	MailboxByID(user string, id uint64) (*mailbox.Mailbox, error)
	Messages(user string, mbox uint64) ([]mailbox.Message, error)
	Body(user, id string) ([]byte, error)
	Append(user, name string, raw []byte, flags []string, date time.Time) (*mailbox.Mailbox, mailbox.Message, error)
	CreateMailbox(user, name, specialUse string) (*mailbox.Mailbox, error)
	DeleteMailbox(user, name string) error
	RenameMailbox(user, from, to string) error
	SetSubscribed(user, name string, on bool) error
	StoreFlags(user string, mbox uint64, uids []uint32, op mailbox.FlagOp, flags []string, unchangedSince uint64) ([]mailbox.Message, []uint32, error)
	ExpungeDeleted(user string, mbox uint64, uids []uint32) ([]uint32, error)
	Copy(user string, src uint64, uids []uint32, dst string, move bool) (*mailbox.CopyResult, error)
	Subscribe(user string) (<-chan mailbox.Change, func())
}

// Authenticator checks a user's password; proxy.IMAPAuth is the one in use.
type Authenticator interface {
	Login(ctx context.Context, user, password string) (*userdb.Profile, error)
}
