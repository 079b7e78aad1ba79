package storemigrate

// The native store: stopped nodes' data directories read through the
// managers' own read functions, and a new node's data directory written
// through the managers' replication handlers.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
)

// node is one stopped node's store, opened read-only.
type node struct {
	dir   string
	db    *store.DB
	users *userdb.DB
	boxes *mailbox.Manager
	queue *queue.Store
	wide  *clusterwide.Store
}

// Native is the hard state of one or more stopped native nodes (a whole
// cluster: each message is on R of them).
type Native struct {
	nodes []*node
}

// OpenNative opens the data directories of stopped nodes read-only. A
// directory a running node holds is refused by name.
func OpenNative(dirs []string) (*Native, error) {
	n := &Native{}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "node.id")); err != nil {
			n.Close()
			return nil, fmt.Errorf("data directory %s: not a quill data directory (no node.id): %w", dir, err)
		}
		db, err := store.OpenReadOnly(dir)
		if errors.Is(err, store.ErrInUse) {
			n.Close()
			return nil, fmt.Errorf("data directory %s is in use by a running quill (stop it first)", dir)
		}
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("data directory %s: %w", dir, err)
		}
		nd := &node{dir: dir, db: db, users: userdb.New(db), boxes: mailbox.New(db)}
		n.nodes = append(n.nodes, nd)
		if nd.queue, err = queue.Open("", db, nil); err != nil {
			n.Close()
			return nil, fmt.Errorf("data directory %s: %w", dir, err)
		}
		if nd.wide, err = clusterwide.Open(db, nil); err != nil {
			n.Close()
			return nil, fmt.Errorf("data directory %s: %w", dir, err)
		}
	}
	return n, nil
}

// Name lists the directories.
func (n *Native) Name() string {
	dirs := make([]string, len(n.nodes))
	for i, nd := range n.nodes {
		dirs[i] = nd.dir
	}
	return strings.Join(dirs, ",")
}

// Close closes every store.
func (n *Native) Close() error {
	var first error
	for _, nd := range n.nodes {
		if err := nd.db.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Snapshot merges the nodes' replicas (merge.go).
func (n *Native) Snapshot(ctx context.Context) (*Snapshot, error) {
	profiles := map[string][]*userdb.Profile{}
	var queues [][]*queue.Entry
	var wides [][]clusterwide.Object
	for _, nd := range n.nodes {
		err := nd.users.Scan(-1, func(p *userdb.Profile) error {
			profiles[p.Address] = append(profiles[p.Address], p)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("data directory %s: profiles: %w", nd.dir, err)
		}
		queues = append(queues, nd.queue.All())
		wides = append(wides, nd.wide.All())
	}
	addrs := make([]string, 0, len(profiles))
	for a := range profiles {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	snap := &Snapshot{Queue: NewestEntries(queues), Objects: NewestObjects(wides)}
	for _, a := range addrs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p := NewestProfile(profiles[a])
		u := &User{Profile: p}
		if !p.Deleted {
			var err error
			if u.Boxes, err = n.boxesOf(p); err != nil {
				return nil, err
			}
		}
		snap.Users = append(snap.Users, u)
	}
	return snap, nil
}

// boxesOf reads every node's fragments of a user's mailboxes (those the
// profile defines: a fragment of a deleted mailbox is not mail) and merges
// them message by message, across mailboxes (a message moved is listed by
// a replica that missed the move under its old mailbox, older).
func (n *Native) boxesOf(p *userdb.Profile) ([]*Box, error) {
	user := p.Address
	records := map[string][]Replica{}
	var ids []string
	frags := map[uint32][]mailbox.Mailbox{}
	for i, nd := range n.nodes {
		for _, def := range p.Mailboxes {
			d, err := nd.boxes.Fragment(user, def.UIDValidity)
			if err != nil {
				return nil, fmt.Errorf("data directory %s: user %s mailbox %q: %w", nd.dir, user, def.Name, err)
			}
			rec := mailbox.Mailbox{UIDNext: d.UIDNext, HighestModSeq: d.HighestModSeq}
			if mb, err := nd.boxes.Mailbox(user, def.Name); err == nil && mb.UIDValidity == def.UIDValidity {
				rec.Created = mb.Created
			}
			frags[def.UIDValidity] = append(frags[def.UIDValidity], rec)
			for _, m := range d.Messages {
				if _, ok := records[m.ID]; !ok {
					ids = append(ids, m.ID)
				}
				records[m.ID] = append(records[m.ID], Replica{Node: i, UIDValidity: def.UIDValidity, Message: m})
			}
		}
	}
	kept := map[uint32][]mailbox.Message{}
	gone := map[uint32][]mailbox.Message{}
	for _, id := range ids {
		var tombs []replica.Stamp
		for _, nd := range n.nodes {
			st, deleted, err := nd.boxes.Tombstone(user, id)
			if err != nil {
				return nil, fmt.Errorf("data directory %s: user %s message %s: %w", nd.dir, user, id, err)
			}
			if deleted {
				tombs = append(tombs, st)
			}
		}
		f := MergeMessage(records[id], tombs)
		if f.Keep {
			kept[f.UIDValidity] = append(kept[f.UIDValidity], f.Message)
		} else {
			m := f.Message
			m.Version = f.Stamp
			gone[f.UIDValidity] = append(gone[f.UIDValidity], m)
		}
	}
	var out []*Box
	for i := range p.Mailboxes {
		def := &p.Mailboxes[i]
		v := def.UIDValidity
		msgs := kept[v]
		sort.Slice(msgs, func(i, j int) bool { return msgs[i].UID < msgs[j].UID })
		if a, b, ok := Clash(msgs); ok {
			return nil, fmt.Errorf("user %s mailbox %q: UID %d names two messages (%s and %s; writers cut off from each other gave it twice): start the cluster so the mailbox's writer renumbers one, stop it, and copy again",
				user, def.Name, a.UID, a.ID, b.ID)
		}
		out = append(out, &Box{Mailbox: MergeBox(p, def, frags[v], msgs), Messages: msgs, Expunged: gone[v],
			Reserved: Ends{UID: def.UIDReserved, ModSeq: def.ModSeqReserved}})
	}
	return out, nil
}

// Body returns a message's bytes from the first node that holds them.
func (n *Native) Body(ctx context.Context, user, id string) ([]byte, error) {
	var err error
	for _, nd := range n.nodes {
		var b []byte
		if b, err = nd.boxes.Body(user, id); err == nil {
			return b, nil
		}
	}
	return nil, err
}

// QueueMessage returns a queue entry's message from the first node that
// holds it.
func (n *Native) QueueMessage(ctx context.Context, id string) ([]byte, error) {
	var err error
	for _, nd := range n.nodes {
		var b []byte
		if b, err = nd.queue.Body(id); err == nil {
			return b, nil
		}
	}
	return nil, err
}

// applyBatch is how many updates one handler call applies: one batch, one
// fsync.
const applyBatch = 64

// CopyToNative writes src into dir, which must be missing or empty, as a
// new node of its own (its id made as core.LoadNodeID makes it): every
// object goes through its manager's replication handler, as the
// replication manager applies an update, with this node its only target.
// `quill serve --data dir` then serves it.
func CopyToNative(ctx context.Context, src Source, snap *Snapshot, dir string, p Progress) (Summary, error) {
	var sum Summary
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return sum, fmt.Errorf("data directory %s is not empty: migrate into a new or empty directory", dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return sum, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return sum, fmt.Errorf("data directory %s: %w", dir, err)
	}
	self, err := core.LoadNodeID(dir)
	if err != nil {
		return sum, err
	}
	db, err := store.Open(dir)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	w := &nativeWriter{self: self, clock: hlc.New(), targets: []cluster.NodeID{self}, users: userdb.New(db), boxes: mailbox.New(db)}
	w.boxes.Self = self
	if w.wide, err = clusterwide.Open(db, nil); err != nil {
		return sum, err
	}
	if w.queue, err = queue.Open(self, db, nil); err != nil {
		return sum, err
	}
	lp := &lockedProgress{p: p}
	for _, u := range snap.Users {
		if err := w.user(ctx, src, u, lp, &sum); err != nil {
			return sum, err
		}
	}
	for _, e := range snap.Queue {
		if err := w.queueEntry(ctx, src, e); err != nil {
			return sum, err
		}
		sum.Queue++
	}
	for _, o := range snap.Objects {
		up, err := clusterwide.UpdateOf(o, w.targets)
		if err != nil {
			return sum, err
		}
		if err := apply(w.wide, "clusterwide object "+o.Name, up); err != nil {
			return sum, err
		}
		sum.Objects++
	}
	return sum, db.Close()
}

type nativeWriter struct {
	self    cluster.NodeID
	clock   *hlc.Clock
	targets []cluster.NodeID
	users   *userdb.DB
	boxes   *mailbox.Manager
	wide    *clusterwide.Store
	queue   *queue.Store
}

// apply hands updates to a handler and checks that each was applied (or
// was there already).
func apply(h replica.Handler, what string, ups ...*replica.Update) error {
	outs, err := h.Apply(ups, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for i, o := range outs {
		if o != replica.Applied && o != replica.Stale {
			return fmt.Errorf("%s: %s refused (outcome %d)", what, ups[i].Object, o)
		}
	}
	return nil
}

func (w *nativeWriter) user(ctx context.Context, src Source, u *User, p Progress, sum *Summary) error {
	prof := u.Profile.Clone()
	if prof.Deleted {
		sum.Deleted++
	} else {
		sum.Users++
		boxes := make([]mailbox.Mailbox, len(u.Boxes))
		fences := map[uint32]Ends{}
		for i, b := range u.Boxes {
			boxes[i] = b.Mailbox
			fences[b.Mailbox.UIDValidity] = FenceEnds(b.Mailbox, b.Messages, []Ends{b.Reserved})
		}
		prof.Mailboxes = NativeDefs(prof, boxes, fences)
	}
	data, err := prof.Encode()
	if err != nil {
		return fmt.Errorf("user %s: %w", prof.Address, err)
	}
	up := &replica.Update{Object: userdb.ObjectName(prof.Address), Stamp: replica.Stamp{Clock: prof.Version, Node: w.self},
		Targets: w.targets, Data: data}
	if err := apply(w.users, "user "+prof.Address, up); err != nil {
		return err
	}
	want := prof.Replicas
	if want <= 0 {
		want = core.DefaultReplicas
	}
	for _, b := range u.Boxes {
		sum.Mailboxes++
		p.Folder(prof.Address+" "+b.Mailbox.Name, len(b.Messages))
		var ups []*replica.Update
		var size int64
		flush := func() error {
			if len(ups) == 0 {
				return nil
			}
			err := apply(w.boxes, fmt.Sprintf("user %s mailbox %q", prof.Address, b.Mailbox.Name), ups...)
			ups, size = nil, 0
			return err
		}
		err := eachBody(ctx, src, prof.Address, b.Messages, func(m *mailbox.Message, body []byte, err error) error {
			if err != nil {
				return fmt.Errorf("user %s mailbox %q uid %d: %w", prof.Address, b.Mailbox.Name, m.UID, err)
			}
			o := mailbox.ObjectFrom(prof.Address, b.Mailbox.Name, b.Mailbox.UIDValidity, m)
			o.Replicas, o.Want = w.targets, want
			up, err := o.Update(m.Version, w.targets, body)
			if err != nil {
				return err
			}
			ups = append(ups, up)
			size += int64(len(body))
			sum.Messages++
			sum.Bytes += int64(len(body))
			p.Message(int64(len(body)))
			if len(ups) >= applyBatch || size >= applyBatchBytes {
				return flush()
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := flush(); err != nil {
			return err
		}
		if err := w.endMark(prof.Address, b); err != nil {
			return err
		}
	}
	return nil
}

// endMark applies a stand-in message and its expunge where the mailbox's
// UIDNEXT or HIGHESTMODSEQ lie past its messages (EndMark): the node then
// holds what it would after the real expunges, a tombstone and a body
// swept after mailbox.ExpungedBodyGrace.
func (w *nativeWriter) endMark(user string, b *Box) error {
	uid, modseq, ok := EndMark(b.Mailbox, b.Messages)
	if !ok {
		return nil
	}
	id := w.boxes.NewMessageID()
	at := replica.Stamp{Clock: w.clock.Now(), Node: w.self}
	o := &mailbox.Object{User: user, ID: id, Mailbox: b.Mailbox.Name, UIDValidity: b.Mailbox.UIDValidity, UID: uid,
		ModSeq: modseq, Replicas: w.targets, Want: 1}
	up, err := o.Update(at, w.targets, []byte{})
	if err != nil {
		return err
	}
	what := fmt.Sprintf("user %s mailbox %q: UIDNEXT %d, HIGHESTMODSEQ %d", user, b.Mailbox.Name, b.Mailbox.UIDNext, b.Mailbox.HighestModSeq)
	if err := apply(w.boxes, what, up); err != nil {
		return err
	}
	gone := &mailbox.Object{User: user, ID: id, ModSeq: modseq, Deleted: true, Replicas: w.targets}
	at.Clock = w.clock.Now()
	if up, err = gone.Update(at, w.targets, nil); err != nil {
		return err
	}
	return apply(w.boxes, what, up)
}

// applyBatchBytes bounds the bodies of one batch (large messages).
const applyBatchBytes = 16 << 20

func (w *nativeWriter) queueEntry(ctx context.Context, src Source, e *queue.Entry) error {
	c := e.Clone()
	var body []byte
	if !c.Deleted {
		// This node is the entry's only replica now (Cassandra, or the
		// old nodes, placed it elsewhere).
		c.Replicas = w.targets
		var err error
		if body, err = src.QueueMessage(ctx, c.ID); err != nil {
			return fmt.Errorf("queue entry %s: %w", c.ID, err)
		}
	}
	up, err := queue.UpdateOf(c, body, w.targets)
	if err != nil {
		return err
	}
	return apply(w.queue, "queue entry "+c.ID, up)
}
