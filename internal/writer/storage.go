package writer

// The writer's storage seam (issue 15 item 1): everything the writer does to
// hard state goes through Storage, so the same writer (the orderer of UIDs
// and MODSEQs, its views, its handoffs) runs over the native Porcupine store
// (native.go: fragments on the nodes of the mail map, changes through the
// replication manager) or over Apache Cassandra (cassandra.WriterStorage).
// The decisions stay here and in view.go; a Storage reads and writes.

import (
	"context"
	"errors"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
)

// Storage is where a writer's mailboxes live: their messages, the reserved
// ends of their UID and MODSEQ blocks, and what a delete removes. The
// writer calls it under the user's writer lock, so a Storage sees one
// user's operations in the writer's order.
type Storage interface {
	// Reserved brings def's reserved ends (UIDReserved, ModSeqReserved)
	// to where the storage keeps them, before the writer's counters look
	// at them. claim says the writer is about to hand out UIDs in the
	// mailbox: a storage that fences its writers takes the mailbox over
	// then, or if it holds it, checks that no other writer took it since
	// (ErrFenced); the native store keeps the ends in the profile.
	Reserved(ctx context.Context, user string, def *userdb.MailboxDef, claim bool) error
	// Load reads a mailbox's messages. removed says which messages the
	// writer took out (at or after a version) that a store may still list.
	Load(ctx context.Context, user string, def *userdb.MailboxDef, removed func(id string, v replica.Stamp) bool) (Contents, error)
	// Write writes new versions of messages, setting each change's Stamp,
	// or its Err if it could not be written.
	Write(ctx context.Context, changes []*Change)
	// Reserve makes uidEnd and modEnd the reserved ends of mailbox def of
	// profile p, durably, before the writer hands out what they cover.
	// An error wrapping ErrFenced says another writer took the mailbox
	// over: nothing this writer holds of the user may be used again.
	Reserve(ctx context.Context, p *userdb.Profile, def *userdb.MailboxDef, uidEnd uint32, modEnd uint64) error
	// Release gives back, at a clean shutdown, the unused rest of the
	// reservations of mailboxes of p (each Ends the writer's next UID and
	// highest MODSEQ).
	Release(ctx context.Context, p *userdb.Profile, ends []Ends) error
	// KeepCounters records a mailbox's UIDNEXT and HIGHESTMODSEQ where no
	// message carries them any more (after an expunge, or a move out), for
	// a storage whose messages do not keep them (native fragments do).
	KeepCounters(ctx context.Context, user string, def *userdb.MailboxDef, uidNext uint32, modseq uint64) error
	// SaveMailboxes records p's mailbox definitions (made, renamed,
	// subscribed) where the storage keeps mailboxes besides the profile.
	SaveMailboxes(ctx context.Context, p *userdb.Profile) error
	// DropMailbox removes a deleted mailbox's messages.
	DropMailbox(ctx context.Context, user string, v uint32) error
	// DropUser returns the removal of a deleted user's mail, to run once
	// the profile's tombstone is written; what it needs is read now, while
	// the profile lives.
	DropUser(ctx context.Context, user string, p *userdb.Profile) func(context.Context)
	// NewMessageID returns an id for a new message (a COPY's).
	NewMessageID() string
	// Observe moves the node's clock past a stamp seen in a message.
	Observe(replica.Stamp)
	// Opened says the writers of bucket b start afresh (a new tenure): a
	// storage that fences writers lets go of what it held of the bucket's
	// users, so their first load claims them again.
	Opened(b uint8)
}

// ErrFenced says a storage refused a writer's reservation because another
// writer took the mailbox over since: the writer forgets the user's state,
// and starts again past the other writer's reservations at its next use.
var ErrFenced = errors.New("mailbox taken over by another writer")

// ErrFenced keeps its identity across the wire: a session on another node
// than the writer's is told to try again (IMAP's UNAVAILABLE), as one on
// the writer's node is, not SERVERBUG.
func init() { rpc.Known(ErrFenced) }

// Ends are where a writer's counters of a mailbox stand at a clean
// shutdown: its next UID and highest MODSEQ.
type Ends struct {
	Def     *userdb.MailboxDef
	UIDNext uint32
	ModSeq  uint64
}

// Change is a new version of one message object decided by the writer.
type Change struct {
	Obj *mailbox.Object
	// Holders are the nodes known to hold the message's bytes: one of the
	// live ones coordinates the update (native store).
	Holders []cluster.NodeID
	// Leaving are replicas the object leaves: they get the update too, so
	// they drop their copy when they come back (native store).
	Leaving []cluster.NodeID
	// Was is where the message was before the change when it moved (a
	// MOVE, a renumbering): a store that keeps messages by place removes it
	// there.
	Was *Place
	// FlagsOnly says only the flags and MODSEQ changed (a STORE).
	FlagsOnly bool
	// Policy is how many targets must hold the version before Write
	// returns ("": one, native store): a rebalancing move waits for
	// every new replica before a leaving one drops its copy.
	Policy replica.Policy
	// Stamp is the new version's, once written: the view records it, so
	// the audit can tell a view that is behind its fragments.
	Stamp replica.Stamp
	Err   error
}

// Place is a message's mailbox and UID.
type Place struct {
	UIDValidity uint32
	UID         uint32
}
