package usermgr

// What the mailbox writers (internal/writer) read and change of the soft
// state: the Users interface they are built on.

import (
	"context"
	"fmt"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
)

var _ writer.Users = (*Manager)(nil)

// Managed waits for the user's bucket's soft state and returns the bucket's
// tenure here (writer.Users).
func (m *Manager) Managed(ctx context.Context, user string) (uint64, error) {
	bk, err := m.managed(ctx, user)
	if err != nil {
		return 0, err
	}
	return bk.tenure, nil
}

// Profile returns a copy of the user's newest profile, tombstone or not;
// nil if none is known (writer.Users).
func (m *Manager) Profile(user string) (*userdb.Profile, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	bk := m.buckets[cluster.Bucket(user)]
	if bk == nil {
		return nil, fmt.Errorf("user %s: %w", user, rpc.ErrNotManager)
	}
	if p := bk.profiles[user]; p != nil {
		return p.Clone(), nil
	}
	return nil, nil
}

// SaveProfile stamps a changed profile with this node's clock and writes it
// to at least minAcks of its replicas (writer.Users).
func (m *Manager) SaveProfile(ctx context.Context, p *userdb.Profile, minAcks int) error {
	p.Version = m.clock.Now()
	p.Updated = time.Now().UTC()
	return m.writeProfileAcks(ctx, p, minAcks)
}

// MailMap returns the nodes holding the user's mail (writer.Users).
func (m *Manager) MailMap(ctx context.Context, user string) ([]cluster.NodeID, error) {
	if m.shared != nil {
		return nil, nil // the shared store holds every user's mail
	}
	rep, err := m.lookup(ctx, &LookupRequest{User: user})
	if err != nil {
		return nil, err
	}
	return rep.MailMap, nil
}

// Note records that node n holds the user's mail (writer.Users).
func (m *Manager) Note(ctx context.Context, user string, n cluster.NodeID) error {
	if m.shared != nil {
		return nil
	}
	return m.note(ctx, &NoteRequest{User: user, Node: n})
}

// ViewGen returns the generation of the views of the user's bucket
// (writer.Users).
func (m *Manager) ViewGen(user string) uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if bk := m.buckets[cluster.Bucket(user)]; bk != nil {
		return bk.viewGen
	}
	return 0
}

// CompleteBuckets lists the buckets managed here with every live node's
// scan merged (writer.Users).
func (m *Manager) CompleteBuckets() []uint8 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []uint8
	for b, bk := range m.buckets {
		if bk != nil && bk.complete {
			out = append(out, uint8(b))
		}
	}
	return out
}

// MissingFromMailMap reports whether node n is missing from the user's mail
// map, and whether the user's bucket is complete (writer.Users).
func (m *Manager) MissingFromMailMap(user string, n cluster.NodeID) (missing, complete bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	bk := m.buckets[cluster.Bucket(user)]
	if bk == nil {
		return false, false
	}
	return !bk.mailMap[user][n], bk.complete
}

// NoteAndReload adds n to the user's mail map and makes the views of the
// user's bucket load again (writer.Users).
func (m *Manager) NoteAndReload(user string, n cluster.NodeID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if bk := m.buckets[cluster.Bucket(user)]; bk != nil {
		noteLocked(bk, user, n)
		bk.viewGen++
	}
}

// Forget takes n out of the user's mail map (writer.Users): the user's
// writer found that n holds none of the user's mail, under the writer lock
// that every allocation takes, so no delivery to n is between its
// allocation and its note (writer/vacate.go).
func (m *Manager) Forget(user string, n cluster.NodeID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if bk := m.buckets[cluster.Bucket(user)]; bk != nil {
		forgetLocked(bk, user, n)
	}
}
