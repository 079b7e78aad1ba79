package writer

// Leaving the mail map (Porcupine §3.3). The mail map of a user names the
// nodes holding fragments of the user's mail; it may name more nodes than
// hold mail (a superset), never fewer. Deliveries and the writer's own
// changes add nodes (confirm, rehome); this file takes out a node whose
// fragment of the user has emptied, so the map stays what a rebuild from
// the nodes' scans would give (usermgr.Scan lists a user for a node only if
// the node holds a message of it) and the balancer's spread counts only
// nodes that hold mail (balance.Choose takes every node of the map).
//
// An operation that removes messages (expunge, a mailbox deleted, a
// message moved to other replicas) names the nodes it may have emptied;
// if some node of the removed messages' replica sets is named by no
// message left in the mailbox's view, the user's vacate runs soon after.
// It decides under the user's writer lock, the lock every allocation and
// every change of the writer's takes:
//
//   - it loads every mailbox view of the user, and waits (vacateRetry) while
//     any of them has an allocation in flight (a delivery between its
//     allocation and its confirmation may be storing on any node, and its
//     confirmation notes the nodes it stored on only afterwards) or was
//     loaded without some fragment;
//   - it considers only the nodes of the mail map that no message of any
//     view names as a replica (a node named may still receive the message
//     from an update log);
//   - it asks each such node whether it holds any message of the user (the
//     same test as the scan's), and takes out those that hold none.
//
// A delivery that allocates after the lock is released gets the map
// without the node; if it stores there all the same its confirmation notes
// the node again before the message is visible. Nothing else stores a
// message of the user without the writer: what would (a late store from a
// proxy whose allocation expired) is found by the writers' audit and the
// minute's refresh, as before.

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/userdb"
)

var (
	// vacateRetry spaces the vacate's tries of a user whose views were
	// busy (an allocation in flight, a fragment unread): a busy mailbox
	// has gaps between deliveries, and a user whose mailbox never pauses
	// in the 15 s of these tries keeps the node in its map until the next
	// trigger, which is harmless (a superset).
	vacateRetry = retry.Policy{Attempts: 5, Base: time.Second, Max: 8 * time.Second, Factor: 2}
)

// vacateAskTimeout bounds asking one node whether it still holds mail of
// the user, under the user's writer lock: as long as reading a fragment
// there may take.
const vacateAskTimeout = fragmentReadTimeout

// vacateState coalesces the vacate triggers of each user: one goroutine per
// user at a time, running again if triggered while it ran.
type vacateState struct {
	// want counts each user's triggers; a user is present while its
	// goroutine runs.
	want map[string]uint64
}

// emptied returns the nodes of the removed messages' replica sets that no
// message left in the view names: the nodes whose fragment of the user the
// removal may have emptied. It stops looking through the view as soon as
// every such node is named, so a mailbox whose other messages share the
// removed ones' nodes (the usual case) costs a few map lookups.
func emptied(removed []*ViewMsg, left map[uint32]*ViewMsg) []cluster.NodeID {
	maybe := map[cluster.NodeID]bool{}
	for _, vm := range removed {
		for _, n := range expectedOn(vm) {
			maybe[n] = true
		}
	}
	for _, vm := range left {
		if len(maybe) == 0 {
			return nil
		}
		for _, n := range expectedOn(vm) {
			delete(maybe, n)
		}
	}
	return cluster.NodeSet(slices.Collect(maps.Keys(maybe)))
}

// vacateCandidates decides, from a user's views and mail map, which nodes
// of the map may be asked whether their fragment is empty: none while a
// view is busy (an allocation in flight or a fragment unread), else the
// nodes no message names as a replica.
func vacateCandidates(boxes map[uint32]*boxView, mailMap []cluster.NodeID) (ask []cluster.NodeID, busy bool) {
	named := map[cluster.NodeID]bool{}
	for _, b := range boxes {
		if len(b.inflight) > 0 || b.partial {
			return nil, true
		}
		for _, vm := range b.msgs {
			for _, n := range expectedOn(vm) {
				named[n] = true
			}
		}
	}
	for _, n := range mailMap {
		if !named[n] {
			ask = append(ask, n)
		}
	}
	return ask, false
}

// vacateSoon runs the user's vacate on its own goroutine (after the
// caller's operation releases the writer lock), unless one is running, in
// which case that one runs again.
func (m *Manager) vacateSoon(user string) {
	if _, native := m.store.(*Native); !native {
		return // only the native store has mail maps
	}
	m.mu.Lock()
	if m.vacates.want == nil {
		m.vacates.want = map[string]uint64{}
	}
	n, running := m.vacates.want[user]
	m.vacates.want[user] = n + 1
	m.mu.Unlock()
	if running {
		return
	}
	if !m.spawn(func() { m.vacateLoop(user) }) {
		m.mu.Lock()
		delete(m.vacates.want, user)
		m.mu.Unlock()
	}
}

// vacateLoop runs the user's vacate until it ran once after the last
// trigger, trying again after vacateRetry while the views are busy.
func (m *Manager) vacateLoop(user string) {
	for {
		m.mu.Lock()
		seen := m.vacates.want[user]
		m.mu.Unlock()
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(m.ctx, vacateRunTimeout)
			_, busy, err := m.Vacate(ctx, user)
			cancel()
			if err != nil {
				m.log.Debug("mail map: vacate not done", "user", user, "err", err)
			}
			if err != nil || !busy || attempt+1 == vacateRetry.Attempts || !retry.Sleep(m.ctx, vacateRetry.Wait(attempt)) {
				break
			}
		}
		m.mu.Lock()
		if m.vacates.want[user] == seen || m.ctx.Err() != nil {
			delete(m.vacates.want, user)
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
	}
}

// vacateRunTimeout bounds one vacate: loading the user's views and asking
// the nodes, under the writer lock.
const vacateRunTimeout = 30 * time.Second

// Vacate takes out of the user's mail map the nodes that hold no message
// of the user and that no message of the user's views names, and returns
// them; busy says it could not decide (an allocation in flight, a fragment
// unread) and should be tried again. See the file's comment for why this
// loses no delivery.
func (m *Manager) Vacate(ctx context.Context, user string) (gone []cluster.NodeID, busy bool, err error) {
	if _, native := m.store.(*Native); !native {
		return nil, false, nil
	}
	err = m.withWriter(ctx, user, func(w *userWriter, p *userdb.Profile) error {
		for i := range p.Mailboxes {
			if _, _, err := m.openBox(ctx, w, p, &MailboxRequest{ID: uint64(p.Mailboxes[i].UIDValidity)}); err != nil {
				return err
			}
		}
		mailMap, err := m.mailMap(p.Address)
		if err != nil {
			return err
		}
		var ask []cluster.NodeID
		if ask, busy = vacateCandidates(w.boxes, mailMap); busy {
			return nil
		}
		for _, n := range ask {
			rep, err := m.auditCall(ctx, n, &mailbox.AuditRequest{Users: []string{p.Address}}, vacateAskTimeout)
			if err != nil || !rep.UsersAnswered || len(rep.Users) > 0 {
				continue // holds mail, or cannot tell (an older node does not answer Users): stays
			}
			m.users.Forget(p.Address, n)
			gone = append(gone, n)
			metrics.MailMapLeaves.Inc()
			m.log.Debug("mail map: a node holding no more mail of the user left it", "user", p.Address, "node", n)
		}
		return nil
	})
	return gone, busy, err
}
