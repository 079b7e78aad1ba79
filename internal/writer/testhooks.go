package writer

// Hooks for the tests of packages that assemble the writer with a user
// manager (internal/usermgr's tests drive both over real RPC), which cannot
// reach the writer's internals. Production code does not call them.

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/userdb"
)

// AuditSettle is how recent a change must be for the audit to leave it out
// of its digests (auditSettle).
const AuditSettle = auditSettle

// HideForTest takes a message out of a loaded view without telling anyone:
// what a missed trigger does.
func (m *Manager) HideForTest(user string, uid uint32) bool {
	w := m.writerIfAny(user)
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.boxes {
		if _, ok := b.msgs[uid]; ok {
			delete(b.msgs, uid)
			return true
		}
	}
	return false
}

// AgeAllocationForTest makes an allocation in flight look older by d.
func (m *Manager) AgeAllocationForTest(user string, uid uint32, d time.Duration) bool {
	w := m.writerIfAny(user)
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.boxes {
		if a, ok := b.inflight[uid]; ok {
			a.at = a.at.Add(-d)
			b.inflight[uid] = a
			return true
		}
	}
	return false
}

// HoldForTest takes the user's writer lock as an operation in progress
// does; release lets it go, and fenced reports whether the writer has been
// fenced (its bucket dropped and drained) since.
func (m *Manager) HoldForTest(ctx context.Context, user string) (release func(), fenced func() bool, err error) {
	w, err := m.lockWriter(ctx, user)
	if err != nil {
		return nil, nil, err
	}
	return w.mu.Unlock, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.dead
	}, nil
}

func (m *Manager) writerIfAny(user string) *userWriter {
	user = userdb.Normalize(user)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writers[cluster.Bucket(user)][user]
}

// AuditAllocAge is how old an allocation in flight must be for the audit to
// take its stored message as confirmed (auditAllocAge).
const AuditAllocAge = auditAllocAge
