package cassandra

// The writer's storage on Cassandra (writer.Storage, issue 15 item 3):
// Quill's writer stays the orderer of a mailbox's UIDs and MODSEQs, as on
// the native store, and keeps its views as soft state; what it reads and
// writes is the store's. A view loads from the messages table, up to the
// fence's reserved UID end (one source, nothing to merge); every change is
// written USING TIMESTAMP the writer's HLC stamp; the reserved ends are
// the mailbox's fenced row (fence.go): claimed when the writer first loads
// the mailbox, moved per block, given back at a clean shutdown, and a
// writer whose fence another writer took is told so (writer.ErrFenced) and
// drops what it knows of the user, so it never hands out a UID the other
// may also use.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
)

// WriterStorage is a node's writer.Storage over a Store.
type WriterStorage struct {
	st    *Store
	node  cluster.NodeID
	owner string
	clock *hlc.Clock
	log   *slog.Logger

	mu sync.Mutex
	// fences are the mailboxes this writer claimed, by user and
	// UIDVALIDITY; tookOver when it claimed those it took from another
	// writer.
	fences   map[fenceKey]Fence
	tookOver map[fenceKey]time.Time
}

// takeoverSettle is how long after taking a mailbox over from another
// writer the view is read again at every use after the writer's
// partialRetry: the other writer's deliveries in flight (allocated before
// it learnt it was fenced) are stored and confirmed to it within the
// writer's allocTimeout, under UIDs below this writer's, and would
// otherwise stay hidden from this writer's view.
const takeoverSettle = time.Minute

type fenceKey struct {
	user string
	v    uint32
}

// NewWriterStorage returns the writer storage of node: its fences are
// claimed as an owner unique to this instance (the node and a random
// suffix), so a restarted node's writer is a new owner that takes its
// mailboxes over as any other would.
func NewWriterStorage(st *Store, node cluster.NodeID, clock *hlc.Clock, log *slog.Logger) *WriterStorage {
	var r [6]byte
	rand.Read(r[:])
	return &WriterStorage{st: st, node: node, owner: string(node) + "/" + hex.EncodeToString(r[:]), clock: clock, log: log,
		fences: map[fenceKey]Fence{}, tookOver: map[fenceKey]time.Time{}}
}

// Owner is the name this writer claims fences as.
func (s *WriterStorage) Owner() string { return s.owner }

func (s *WriterStorage) fence(user string, v uint32) (Fence, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.fences[fenceKey{user, v}]
	return f, ok
}

func (s *WriterStorage) hold(f Fence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fences[fenceKey{f.User, f.UIDValidity}] = f
}

// forgetUser drops every fence held of a user: another writer took one of
// its mailboxes, and the writer drops all it knows of the user.
func (s *WriterStorage) forgetUser(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.fences {
		if k.user == user {
			delete(s.fences, k)
			delete(s.tookOver, k)
		}
	}
}

// Opened lets go of the fences held of the bucket's users: its writers
// start afresh and claim again (a fence held from an earlier tenure may
// have been taken by another node meanwhile).
func (s *WriterStorage) Opened(b uint8) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.fences {
		if cluster.Bucket(k.user) == b {
			delete(s.fences, k)
			delete(s.tookOver, k)
		}
	}
}

// fenced wraps a refusal by the fence as the writer's ErrFenced, after
// forgetting the user's fences.
func (s *WriterStorage) fenced(user string, err error) error {
	if errors.Is(err, ErrFenced) {
		s.forgetUser(user)
		return fmt.Errorf("%w: %w", err, writer.ErrFenced)
	}
	return err
}

// Reserved, when the writer is about to use the mailbox (claim), claims it
// if this writer holds no fence of it yet (the new writer starts at the
// previous writer's reserved ends), or checks that its fence still holds:
// a writer taken over stops at its next operation instead of handing out
// the rest of its block. Then it puts the fence's ends into def.
func (s *WriterStorage) Reserved(ctx context.Context, user string, def *userdb.MailboxDef, claim bool) error {
	user = userdb.Normalize(user)
	f, ok := s.fence(user, def.UIDValidity)
	switch {
	case !ok && !claim:
		return nil
	case !ok:
		var err error
		if f, err = s.st.Claim(ctx, user, def.UIDValidity, s.owner); err != nil {
			return err
		}
		s.hold(f)
		if f.Epoch > 1 {
			s.mu.Lock()
			s.tookOver[fenceKey{user, def.UIDValidity}] = time.Now()
			s.mu.Unlock()
		}
	case claim:
		owner, epoch, err := s.st.Holder(ctx, user, def.UIDValidity)
		if err != nil {
			return err
		}
		if owner != f.Owner || epoch != f.Epoch {
			return s.fenced(user, fmt.Errorf("%s: %w (%s, epoch %d; this writer's is %d)", f.what(), ErrFenced, owner, epoch, f.Epoch))
		}
	}
	f.Into(def)
	return nil
}

// Load reads the mailbox's record (UIDNEXT and HIGHESTMODSEQ as last kept)
// and its messages up to the reserved UID end.
func (s *WriterStorage) Load(ctx context.Context, user string, def *userdb.MailboxDef, removed func(id string, v replica.Stamp) bool) (writer.Contents, error) {
	c := writer.Contents{Msgs: map[uint32]*writer.ViewMsg{}}
	rec, err := s.st.Mailbox(ctx, user, def.UIDValidity)
	switch {
	case err == nil:
		c.Used, c.UsedMod = rec.UIDNext, rec.HighestModSeq
	case !errors.Is(err, mailbox.ErrNoMailbox):
		return c, err
	}
	err = s.st.Messages(ctx, user, def.UIDValidity, 1, math.MaxUint32, func(m *mailbox.Message) error {
		s.clock.Observe(m.Version.Clock)
		c.Used, c.UsedMod = max(c.Used, m.UID+1), max(c.UsedMod, m.ModSeq)
		if removed != nil && removed(m.ID, m.Version) {
			return nil
		}
		vm := &writer.ViewMsg{Message: *m}
		vm.Flags = cloneStrings(m.Flags)
		c.Msgs[m.UID] = vm
		return nil
	})
	if err != nil {
		return writer.Contents{}, err
	}
	c.UIDNext, c.ModSeq = c.Used, c.UsedMod
	s.mu.Lock()
	if at, ok := s.tookOver[fenceKey{userdb.Normalize(user), def.UIDValidity}]; ok {
		c.Partial = time.Since(at) < takeoverSettle
	}
	s.mu.Unlock()
	return c, nil
}

// Write writes each change at a new stamp of the node's clock: an expunge
// deletes the index record and the body (a message id names one message;
// a COPY's bytes are copied under its new id, below), a STORE updates
// flags and MODSEQ only (so it never brings back a record deleted after
// it), a COPY writes the bytes under the new id and then the record, and a
// MOVE or renumbering writes the record at its new place, then deletes it
// at the old.
func (s *WriterStorage) Write(ctx context.Context, changes []*writer.Change) {
	for _, c := range changes {
		c.Stamp = replica.Stamp{Clock: s.clock.Now(), Node: s.node}
		c.Err = s.write(ctx, c)
	}
}

func (s *WriterStorage) write(ctx context.Context, c *writer.Change) error {
	o := c.Obj
	switch {
	case o.Deleted:
		if err := s.st.DeleteMessage(ctx, o.User, o.UIDValidity, o.UID, c.Stamp); err != nil {
			return err
		}
		if err := s.st.DeleteBody(ctx, o.User, o.ID); err != nil {
			// The record is gone, so nothing reads these bytes again.
			s.log.Warn("could not delete an expunged message's body", "user", o.User, "id", o.ID, "err", err)
		}
		return nil
	case c.FlagsOnly:
		return s.st.UpdateFlags(ctx, o.User, o.UIDValidity, o.UID, o.Flags, o.ModSeq, c.Stamp)
	}
	if o.BodyFrom != "" {
		// A copy's bytes under its own id, as the native store keeps
		// them: every message owns its body, and an expunge deletes it.
		r, _, err := s.st.OpenBody(ctx, o.User, o.BodyFrom)
		if err != nil {
			return fmt.Errorf("user %s message %s: copy from %s: %w", o.User, o.ID, o.BodyFrom, err)
		}
		if _, err := s.st.PutBody(ctx, o.User, o.ID, r); err != nil {
			return err
		}
	}
	msg := mailbox.Message{UID: o.UID, ID: o.ID, Size: o.Size, Date: o.Date, Flags: o.Flags, ModSeq: o.ModSeq, Version: c.Stamp}
	if err := s.st.PutMessage(ctx, o.User, o.UIDValidity, &msg); err != nil {
		return err
	}
	if w := c.Was; w != nil && (w.UIDValidity != o.UIDValidity || w.UID != o.UID) {
		// After the new place is written: cut short here, the message is
		// listed twice for a while (a reload shows both), never lost.
		return s.st.DeleteMessage(ctx, o.User, w.UIDValidity, w.UID, c.Stamp)
	}
	return nil
}

// Reserve moves the fence's ends, never below where they are.
func (s *WriterStorage) Reserve(ctx context.Context, p *userdb.Profile, def *userdb.MailboxDef, uidEnd uint32, modEnd uint64) error {
	f, ok := s.fence(p.Address, def.UIDValidity)
	if !ok {
		if err := s.Reserved(ctx, p.Address, def, true); err != nil {
			return err
		}
		f, _ = s.fence(p.Address, def.UIDValidity)
	}
	nf, err := s.st.Reserve(ctx, f, max(uidEnd, f.UIDReserved), max(modEnd, f.ModSeqReserved))
	if err != nil {
		return s.fenced(p.Address, err)
	}
	s.hold(nf)
	nf.Into(def)
	return nil
}

// Release gives the unused rest of each held fence back.
func (s *WriterStorage) Release(ctx context.Context, p *userdb.Profile, ends []writer.Ends) error {
	var first error
	for _, e := range ends {
		f, ok := s.fence(p.Address, e.Def.UIDValidity)
		if !ok {
			continue
		}
		nf, err := s.st.Release(ctx, f, e.UIDNext, e.ModSeq)
		if err != nil {
			if first == nil {
				first = s.fenced(p.Address, err)
			}
			continue
		}
		s.hold(nf)
		nf.Into(e.Def)
	}
	return first
}

// KeepCounters writes UIDNEXT and HIGHESTMODSEQ into the mailbox's record.
func (s *WriterStorage) KeepCounters(ctx context.Context, user string, def *userdb.MailboxDef, uidNext uint32, modseq uint64) error {
	return s.st.SetMailboxCounters(ctx, user, def.UIDValidity, uidNext, modseq)
}

// SaveMailboxes writes the record of each mailbox of p that is new or
// whose name, subscription or special use changed; the counters of an
// existing record stay as they are.
func (s *WriterStorage) SaveMailboxes(ctx context.Context, p *userdb.Profile) error {
	have, err := s.st.Mailboxes(ctx, p.Address)
	if err != nil {
		return err
	}
	byV := map[uint32]mailbox.Mailbox{}
	for _, mb := range have {
		byV[mb.UIDValidity] = mb
	}
	for _, def := range p.Mailboxes {
		mb := mailbox.Mailbox{ID: uint64(def.UIDValidity), Name: def.Name, UIDValidity: def.UIDValidity,
			Subscribed: def.Subscribed, SpecialUse: def.SpecialUse}
		old, ok := byV[def.UIDValidity]
		if !ok {
			mb.UIDNext, mb.HighestModSeq, mb.Created = 1, 1, time.Now().UTC()
			if err := s.st.PutMailbox(ctx, p.Address, &mb); err != nil {
				return err
			}
			continue
		}
		if old.Name == mailbox.NormName(def.Name) && old.Subscribed == def.Subscribed && old.SpecialUse == def.SpecialUse {
			continue
		}
		if err := s.st.NameMailbox(ctx, p.Address, &mb); err != nil {
			return err
		}
	}
	return nil
}

// DropMailbox deletes the mailbox's record, index, fence and bodies.
func (s *WriterStorage) DropMailbox(ctx context.Context, user string, v uint32) error {
	msgs, err := s.st.AllMessages(ctx, user, v)
	if err != nil {
		return err
	}
	if err := s.st.DeleteMailbox(ctx, user, v, replica.Stamp{Clock: s.clock.Now(), Node: s.node}); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.fences, fenceKey{userdb.Normalize(user), v})
	s.mu.Unlock()
	for _, m := range msgs {
		if err := s.st.DeleteBody(ctx, user, m.ID); err != nil {
			return err
		}
	}
	return nil
}

// DropUser deletes every mailbox of the user's profile as it was.
func (s *WriterStorage) DropUser(_ context.Context, user string, p *userdb.Profile) func(context.Context) {
	defs := append([]userdb.MailboxDef(nil), p.Mailboxes...)
	return func(ctx context.Context) {
		for _, def := range defs {
			if err := s.DropMailbox(ctx, user, def.UIDValidity); err != nil {
				s.log.Warn("could not delete a deleted user's mailbox", "user", user, "mailbox", def.Name, "err", err)
			}
		}
	}
}

// NewMessageID returns a new message id, made as the native store makes
// them (time first, so ids sort roughly by arrival).
func (s *WriterStorage) NewMessageID() string {
	var r [8]byte
	rand.Read(r[:])
	return fmt.Sprintf("%013x%s", time.Now().UnixMicro(), hex.EncodeToString(r[:]))
}

// Observe moves the node's clock past a stamp.
func (s *WriterStorage) Observe(st replica.Stamp) { s.clock.Observe(st.Clock) }

var _ writer.Storage = (*WriterStorage)(nil)
