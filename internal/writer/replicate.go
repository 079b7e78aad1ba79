package writer

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// The writer changes messages through the replication manager (Porcupine
// §4.4: the retrieval agent's update is the deletion or modification of a
// message): every flag change, expunge, copy, move and new replica set is a
// new whole version of the message object, stamped by the writer's clock so
// its changes to one object are ordered, and sent to one live replica that
// coordinates it.

// Replicator is the node's replication manager, as the writer uses it.
type Replicator interface {
	Write(ctx context.Context, req *replica.WriteRequest) (*replica.WriteReply, error)
	// On returns node n's replication manager (this one, or a client).
	On(n cluster.NodeID) replica.Service
	Now() replica.Stamp
	Observe(replica.Stamp)
}

// change is a new version of one message object decided by the writer.
type change struct {
	obj *mailbox.Object
	// holders are the nodes known to hold the message's bytes: one of the
	// live ones coordinates the update.
	holders []cluster.NodeID
	// leaving are replicas the object leaves: they get the update too, so
	// they drop their copy when they come back.
	leaving []cluster.NodeID
	// stamp is the new version's, once written: the view records it, so
	// the audit can tell a view that is behind its fragments.
	stamp replica.Stamp
	err   error
}

// replicate writes each change through a coordinator, grouping changes that
// share coordinator and targets into one call, and sets each change's err.
func (m *Manager) replicate(ctx context.Context, changes []*change) {
	alive := map[cluster.NodeID]bool{}
	for _, mi := range m.peers.Alive() {
		alive[mi.ID] = true
	}
	type group struct {
		coord   cluster.NodeID
		targets []cluster.NodeID
		members []*change
	}
	groups := map[string]*group{}
	var order []string
	for _, c := range changes {
		if len(c.obj.Replicas) == 0 { // stored before replication
			c.obj.Replicas = slices.Clone(c.holders)
		}
		targets := uniq(append(slices.Clone(c.obj.Replicas), c.leaving...))
		coord := cluster.NodeID("")
		for _, n := range c.holders {
			if !alive[n] || !slices.Contains(targets, n) {
				continue
			}
			if n == m.self {
				coord = n
				break
			}
			if coord == "" {
				coord = n
			}
		}
		if coord == "" {
			c.err = fmt.Errorf("user %s message %s: no live replica (holders %v)", c.obj.User, c.obj.ID, c.holders)
			continue
		}
		key := string(coord) + "|" + joinIDs(targets)
		g := groups[key]
		if g == nil {
			g = &group{coord: coord, targets: targets}
			groups[key] = g
			order = append(order, key)
		}
		g.members = append(g.members, c)
	}
	for _, key := range order {
		g := groups[key]
		stamp := m.repl.Now()
		req := &replica.WriteRequest{Policy: replica.One}
		for _, c := range g.members {
			c.stamp = stamp
			u, err := c.obj.Update(stamp, g.targets, nil)
			if err != nil {
				c.err = err
				continue
			}
			req.Updates = append(req.Updates, u)
		}
		_, err := m.repl.On(g.coord).Write(ctx, req)
		for _, c := range g.members {
			if c.err == nil && err != nil {
				c.err = fmt.Errorf("user %s message %s: update through %s: %w", c.obj.User, c.obj.ID, g.coord, err)
			}
		}
	}
}

func uniq(ns []cluster.NodeID) []cluster.NodeID {
	out := make([]cluster.NodeID, 0, len(ns))
	for _, n := range ns {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func joinIDs(ns []cluster.NodeID) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = string(n)
	}
	return strings.Join(s, ",")
}

// RehomeRequest asks the writer to give messages new replica sets (repair).
type RehomeRequest struct {
	User  string         `json:"user"`
	Moves []replica.Move `json:"moves"`
}

// rehome writes each moved message's current version with its new
// replica set, so the new replicas get it and the ones left drop theirs
// when they return. The writer's view is the newest version it knows, and
// any flag change is ordered with this one by the writer's lock.
func (m *Manager) rehome(ctx context.Context, req *RehomeRequest) error {
	want := map[string]replica.Move{}
	for _, mv := range req.Moves {
		if _, id, ok := mailbox.ParseObjectName(mv.Object); ok {
			want[id] = mv
		}
	}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		var changes []*change
		var views []*ViewMsg
		find := func() error {
			for i := range p.Mailboxes {
				def := &p.Mailboxes[i]
				_, b, err := m.openBox(ctx, w, p, &MailboxRequest{ID: uint64(def.UIDValidity)})
				if err != nil {
					return err
				}
				for _, vm := range b.msgs {
					mv, ok := want[vm.ID]
					if !ok {
						continue
					}
					delete(want, vm.ID)
					o := mailbox.ObjectFrom(p.Address, def.Name, def.UIDValidity, &vm.Message)
					o.Replicas = mv.Replicas
					changes = append(changes, &change{obj: o, holders: vm.Holders, leaving: mv.Gone})
					views = append(views, vm)
				}
			}
			return nil
		}
		if err := find(); err != nil {
			return err
		}
		if len(want) > 0 {
			// Messages the repairing node holds that the views lack (a
			// confirmation that never arrived): load the views again.
			for _, b := range w.boxes {
				b.loaded = false
			}
			if err := find(); err != nil {
				return err
			}
		}
		m.replicate(ctx, changes)
		var firstErr error
		for i, c := range changes {
			if c.err != nil {
				if firstErr == nil {
					firstErr = c.err
				}
				continue
			}
			views[i].Replicas, views[i].Version = c.obj.Replicas, c.stamp
			views[i].Holders = uniq(append(views[i].Holders, c.obj.Replicas...))
			for _, n := range c.obj.Replicas {
				m.noteUser(p.Address, n)
			}
		}
		return firstErr
	})
	return err
}

// ReloadRequest asks a user's writer to load the user's mailbox views again.
type ReloadRequest struct {
	User string `json:"user"`
}

// reload loads every mailbox view of the user again from the
// fragments; a load renumbers messages that share a UID, which is what
// resolves a conflict a replica refused an update for.
func (m *Manager) reload(ctx context.Context, req *ReloadRequest) error {
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		for i := range p.Mailboxes {
			def := &p.Mailboxes[i]
			w.counters(def).loaded = false
			if _, _, err := m.openBox(ctx, w, p, &MailboxRequest{ID: uint64(def.UIDValidity)}); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// ResolveConflict asks the writer of a message object that a replica
// refused for a conflict (its UID names another message there) to load the
// user's views again, which renumbers both. The replication manager calls
// it; objects of other kinds have no such conflicts.
func (m *Manager) ResolveConflict(ctx context.Context, object string) error {
	user, _, ok := mailbox.ParseObjectName(object)
	if !ok {
		return nil
	}
	return m.For(user).Reload(ctx, &ReloadRequest{User: user})
}

// noteUser records a node in the mail map of a user this node manages.
func (m *Manager) noteUser(user string, n cluster.NodeID) {
	m.users.Note(context.Background(), user, n)
}

// Rehome asks a user's writer to move messages to new replica sets; the
// replication manager's repair calls it.
func (m *Manager) Rehome(ctx context.Context, user string, moves []replica.Move) error {
	return m.For(user).Rehome(ctx, &RehomeRequest{User: user, Moves: moves})
}
