// Package storemigrate copies Quill's hard state between its two stores:
// the native Porcupine store (a Pebble database per node, each message on
// R nodes, behind the replication manager) and Apache Cassandra
// (internal/cassandra, issue 15 after CassMail). It backs `quill migrate`
// (docs/cassandra.md, "quill migrate").
//
// A copy reads the source into a Snapshot (every profile, mailbox, message
// record, queue entry and clusterwide object, merged; bodies are read one
// at a time as they are written), writes it into the destination through
// that store's own typed operations (cassandra.Store's; on the native side
// the managers' replication handlers, as the replication manager applies
// an update), and a verify pass reads both sides again and compares them
// user by user, mailbox by mailbox and message by message, bodies by
// SHA-256.
//
// Several stopped nodes of one cluster merge as their replicas would
// (merge.go, pure): the newest stamp wins for profiles, message records,
// queue entries and clusterwide objects; a tombstone newer than every
// record keeps an expunged message or a deleted user from coming back.
// Stamps are kept, so Cassandra's writes, made USING TIMESTAMP the stamp,
// make a second copy change nothing.
//
// Written here because no library knows Quill's two layouts; the stores'
// own code does the encoding.
package storemigrate

import (
	"context"
	"sync"

	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/userdb"
)

// Snapshot is a store's hard state, merged, without the bytes of messages.
type Snapshot struct {
	// Users are every profile, deleted users' tombstones included, by
	// address.
	Users []*User
	// Queue and Objects include tombstones.
	Queue   []*queue.Entry
	Objects []clusterwide.Object
}

// User is a profile and its mailboxes (none for a deleted user).
type User struct {
	Profile *userdb.Profile
	Boxes   []*Box
}

// Box is one mailbox: its record, its messages in UID order, and the
// messages expunged since a node listed them (to delete at the
// destination: their Version is the tombstone's stamp).
type Box struct {
	Mailbox  mailbox.Mailbox
	Messages []mailbox.Message
	Expunged []mailbox.Message
	// Reserved are the ends of the UIDs and MODSEQs the source's writers
	// reserved (the profile's definition; Cassandra's fence).
	Reserved Ends
}

// Source is a store read by a migration.
type Source interface {
	// Snapshot reads the whole store's records.
	Snapshot(ctx context.Context) (*Snapshot, error)
	// Body returns the bytes of one message.
	Body(ctx context.Context, user, id string) ([]byte, error)
	// QueueMessage returns the message of a queue entry.
	QueueMessage(ctx context.Context, id string) ([]byte, error)
	// Name says which store, for messages.
	Name() string
	Close() error
}

// Progress hears of a long copy's or verify's steps.
type Progress interface {
	// Folder says the copy moved on to a mailbox of msgs messages.
	Folder(name string, msgs int)
	// Message counts one message of n bytes done.
	Message(n int64)
}

// lockedProgress lets the copy's workers report to one Progress.
type lockedProgress struct {
	mu sync.Mutex
	p  Progress
}

func (l *lockedProgress) Folder(name string, msgs int) {
	if l.p != nil {
		l.mu.Lock()
		l.p.Folder(name, msgs)
		l.mu.Unlock()
	}
}

func (l *lockedProgress) Message(n int64) {
	if l.p != nil {
		l.mu.Lock()
		l.p.Message(n)
		l.mu.Unlock()
	}
}

// Summary is what a copy did.
type Summary struct {
	Users, Deleted, Mailboxes, Messages, Expunged, Queue, Objects int
	Bytes                                                         int64
}

// Count returns how many mailboxes and messages, and how many bytes of
// them (as recorded), a snapshot holds: the progress bar's totals.
func (s *Snapshot) Count() (boxes, msgs int, bytes int64) {
	for _, u := range s.Users {
		for _, b := range u.Boxes {
			boxes++
			msgs += len(b.Messages)
			for _, m := range b.Messages {
				bytes += m.Size
			}
		}
	}
	return boxes, msgs, bytes
}

// fetchWindow is how many bodies are read ahead at once (Workers at a
// time): a read from Cassandra is a round trip, so one at a time leaves
// the copy and the verify waiting on the network; the window bounds the
// memory the bodies read ahead take.
const fetchWindow = 4 * Workers

// eachBody reads the bodies of a mailbox's messages from src, Workers at
// a time, and calls fn with each in the messages' order (a body that
// cannot be read with its error).
func eachBody(ctx context.Context, src Source, user string, msgs []mailbox.Message, fn func(m *mailbox.Message, body []byte, err error) error) error {
	bodies := make([][]byte, fetchWindow)
	errs := make([]error, fetchWindow)
	sem := make(chan struct{}, Workers)
	for lo := 0; lo < len(msgs); lo += fetchWindow {
		hi := min(lo+fetchWindow, len(msgs))
		var wg sync.WaitGroup
		for i := lo; i < hi; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				bodies[i-lo], errs[i-lo] = src.Body(ctx, user, msgs[i].ID)
			}()
		}
		wg.Wait()
		for i := lo; i < hi; i++ {
			if err := fn(&msgs[i], bodies[i-lo], errs[i-lo]); err != nil {
				return err
			}
			bodies[i-lo] = nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}
