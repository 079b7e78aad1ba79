package mailbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
)

// Fragment operations. In a cluster a ⟨user, mailbox⟩ is one IMAP mailbox
// whose messages lie in fragments on several nodes (Porcupine §2.1). The
// mailbox's ordered writer (the user's manager, Neptune level 2) names the
// mailbox by its UIDVALIDITY, which never changes while the mailbox lives
// (renames keep it), and hands out its UIDs and MODSEQs; a fragment stores
// messages under exactly the UID and MODSEQ it is given. The local mailbox
// record of a fragment carries the same UIDVALIDITY, and its UIDNEXT and
// HIGHESTMODSEQ only follow the highest values stored here.

// ErrUIDTaken is returned when a message is to be stored under a UID that
// already names another message on this node.
var ErrUIDTaken = errors.New("UID already names another message")

// Placed names where a message goes in the cluster mailbox.
type Placed struct {
	User        string   `json:"user"`
	Mailbox     string   `json:"mailbox"` // current name, for the local record
	UIDValidity uint32   `json:"uidvalidity"`
	UID         uint32   `json:"uid"`
	ModSeq      uint64   `json:"modseq"`
	Flags       []string `json:"flags,omitempty"`
}

// fragmentByValidity returns the local record of the mailbox with the given
// UIDVALIDITY, or nil. The name it was last seen under is cached: a point
// read by name is cheap, while a scan of the user's mailbox records walks
// every version of them the memtable still holds (each store rewrites its
// record), which made a store cost twice as much.
func (m *Manager) fragmentByValidity(t *tx, user string, v uint32) (*Mailbox, error) {
	key := validityKey{user, v}
	if name, ok := m.names.Load(key); ok {
		mb, err := m.getMailbox(t.b, user, name.(string))
		if err == nil && mb.UIDValidity == v {
			return mb, nil
		}
		if err != nil && !errors.Is(err, ErrNoMailbox) {
			return nil, err
		}
	}
	all, err := m.mailboxesIn(t.b, user)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].UIDValidity == v {
			m.names.Store(key, all[i].Name)
			return &all[i], nil
		}
	}
	return nil, nil
}

// validityKey names a user's mailbox in the name cache.
type validityKey struct {
	user string
	v    uint32
}

// fragmentFor returns the local record for a placed message, making it if
// needed. A local record under the same name with another UIDVALIDITY is a
// mailbox deleted cluster-wide and made again: its messages go with it.
func (m *Manager) fragmentFor(t *tx, p *Placed) (*Mailbox, error) {
	mb, err := m.fragmentByValidity(t, p.User, p.UIDValidity)
	if err != nil {
		return nil, err
	}
	name := normName(p.Mailbox)
	if mb != nil {
		if mb.Name != name { // renamed cluster-wide since
			if err := t.b.Delete(mailboxKey(p.User, mb.Name)); err != nil {
				return nil, err
			}
			mb.Name = name
			// A hint only: checked against the record on every use.
			m.names.Store(validityKey{p.User, p.UIDValidity}, name)
		}
		return mb, nil
	}
	if old, err := m.getMailbox(t.b, p.User, name); err == nil {
		if err := t.dropMessages(p.User, old.ID); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, ErrNoMailbox) {
		return nil, err
	}
	um, err := t.meta(p.User)
	if err != nil {
		return nil, err
	}
	um.NextMailboxID++
	if err := t.putJSON(userMetaKey(p.User), um); err != nil {
		return nil, err
	}
	t.touch(p.User, 0)
	m.names.Store(validityKey{p.User, p.UIDValidity}, name)
	return &Mailbox{ID: um.NextMailboxID, Name: name, UIDValidity: p.UIDValidity, UIDNext: 1,
		HighestModSeq: 1, Subscribed: true, Created: time.Now().UTC()}, nil
}

func (t *tx) follow(mb *Mailbox, uid uint32, modseq uint64) {
	if uid >= mb.UIDNext {
		mb.UIDNext = uid + 1
	}
	if modseq > mb.HighestModSeq {
		mb.HighestModSeq = modseq
	}
}

// StoreAt stores one message for several placements (recipients) as
// objects held only here, in one durable batch: the path of tests and
// benchmarks of this package; a node stores mail through the replication
// manager, which calls Apply.
func (m *Manager) StoreAt(places []Placed, id string, raw []byte, date time.Time) error {
	stamp := replica.Stamp{Clock: hlc.Timestamp(time.Now().UnixMilli()) << 16, Node: m.Self}
	ups := make([]*replica.Update, len(places))
	for i, p := range places {
		o := &Object{User: p.User, ID: id, Mailbox: p.Mailbox, UIDValidity: p.UIDValidity, UID: p.UID, ModSeq: p.ModSeq,
			Flags: p.Flags, Size: int64(len(raw)), Date: date, Replicas: []cluster.NodeID{m.Self}, Want: 1}
		u, err := o.Update(stamp, o.Replicas, raw)
		if err != nil {
			return err
		}
		ups[i] = u
	}
	outs, err := m.Apply(ups, nil)
	if err != nil {
		return fmt.Errorf("store message %s: %w", id, err)
	}
	for i, o := range outs {
		p := places[i]
		switch o {
		case replica.Conflict:
			return fmt.Errorf("user %s mailbox %q uid %d: %w", p.User, p.Mailbox, p.UID, ErrUIDTaken)
		case replica.Failed:
			return fmt.Errorf("user %s mailbox %q uid %d: message object refused", p.User, p.Mailbox, p.UID)
		}
	}
	return nil
}

// FragmentDigest is what a fragment holds of one cluster mailbox.
type FragmentDigest struct {
	UIDNext       uint32    `json:"uidnext"`
	HighestModSeq uint64    `json:"highestmodseq"`
	Messages      []Message `json:"messages"`
}

// Fragment returns this node's part of the mailbox with UIDVALIDITY v
// (empty if it has none).
func (m *Manager) Fragment(user string, v uint32) (*FragmentDigest, error) {
	t := &tx{m: m, b: m.db.NewIndexedBatch()}
	defer t.abort()
	mb, err := m.fragmentByValidity(t, user, v)
	if err != nil || mb == nil {
		return &FragmentDigest{}, err
	}
	msgs, err := m.Messages(user, mb.ID)
	if err != nil {
		return nil, err
	}
	return &FragmentDigest{UIDNext: mb.UIDNext, HighestModSeq: mb.HighestModSeq, Messages: msgs}, nil
}

// DropMailbox removes this node's fragment of a mailbox deleted cluster-wide.
func (m *Manager) DropMailbox(user string, v uint32) error {
	defer m.lockUser(user)()
	t := m.newTx()
	mb, err := m.fragmentByValidity(t, user, v)
	if err != nil || mb == nil {
		t.abort()
		return err
	}
	if err := t.dropMessages(user, mb.ID); err != nil {
		t.abort()
		return err
	}
	if err := t.b.Delete(mailboxKey(user, mb.Name)); err != nil {
		t.abort()
		return err
	}
	t.touch(user, 0)
	return t.commit()
}

// uidMayBeTaken reports whether a message of this fragment may hold uid.
// Every message stored here raised the record's UIDNEXT past its UID in
// the same batch (follow), so a UID at or above UIDNEXT (every new
// delivery's) names nothing here and needs no read to check.
func uidMayBeTaken(mb *Mailbox, uid uint32) bool { return uid < mb.UIDNext }
