package writer

import (
	"context"
	"strings"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// Repair's side of the writer (rehome), and the conflicts a replica
// refuses (reload): both are the native store's; a message's writes go
// through the writer's Storage (native.go).

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
// any flag change is ordered with this one by the writer's lock. A move
// planned on a set (Move.From, the rebalancer's) is skipped if the set
// changed since, and goes in two writes (rebalance.go): the new replicas
// first, held by every target durably, then the set without the leaving
// node, so the message never has fewer than its R durable copies.
func (m *Manager) rehome(ctx context.Context, req *RehomeRequest) error {
	want := map[string]replica.Move{}
	for _, mv := range req.Moves {
		if _, id, ok := mailbox.ParseObjectName(mv.Object); ok {
			want[id] = mv
		}
	}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		var changes []*Change
		var views []*ViewMsg
		var moves []replica.Move
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
					if len(mv.From) > 0 && !cluster.SameNodes(vm.Replicas, mv.From) {
						continue // moved since it was planned: planned again on a fresh scan
					}
					o := mailbox.ObjectFrom(p.Address, def.Name, def.UIDValidity, &vm.Message)
					changes = append(changes, moveChange(o, vm, mv))
					views = append(views, vm)
					moves = append(moves, mv)
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
		firstErr := m.writeMoves(ctx, p.Address, changes, views)
		if second, sviews := leaveChanges(changes, views, moves); len(second) > 0 {
			if err := m.writeMoves(ctx, p.Address, second, sviews); firstErr == nil {
				firstErr = err
			}
		}
		return firstErr
	})
	return err
}

// writeMoves writes the changes of a rehome and brings their views up to
// date; it returns the first change's error.
func (m *Manager) writeMoves(ctx context.Context, user string, changes []*Change, views []*ViewMsg) error {
	m.store.Write(ctx, changes)
	var firstErr error
	leaving := false
	for i, c := range changes {
		if c.Err != nil {
			if firstErr == nil {
				firstErr = c.Err
			}
			if c.Policy == replica.All {
				// The first write of a move may have reached some of
				// the new replicas (it is in its coordinator's log and
				// reaches the rest): the view names them all, a
				// superset, so the message's next version goes to them
				// too and none keeps an old one.
				// The mail map names them too: a node holding a user's
				// mail must be in it.
				views[i].Replicas = c.Obj.Replicas
				views[i].Holders = cluster.NodeSet(append(views[i].Holders, c.Obj.Replicas...))
				for _, n := range c.Obj.Replicas {
					m.noteUser(user, n)
				}
			}
			continue
		}
		views[i].Replicas, views[i].Version = c.Obj.Replicas, c.Stamp
		views[i].Holders = cluster.NodeSet(append(views[i].Holders, c.Obj.Replicas...))
		for _, n := range c.Obj.Replicas {
			m.noteUser(user, n)
		}
		leaving = leaving || len(c.Leaving) > 0
	}
	if leaving {
		m.vacateSoon(user) // a node left may hold nothing else
	}
	return firstErr
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
