package usermgr

// Handing a bucket over. Porcupine §3.3 rebuilds a bucket's soft state at
// its new manager from every node's hard state; between one manager and the
// next there is no other exchange. That leaves a window: the nodes' views of
// the membership change at slightly different moments, so the old manager's
// writers may still confirm a delivery, or finish an operation that was in
// progress, after the new manager has loaded its views from the fragments.
// Such a message is stored, but the new manager's view never learns of it
// (issue 9: two acknowledged messages hidden for minutes after a clean
// restart). And a node whose process stood still while others managed its
// buckets (SIGSTOP) may take them back with the soft state it had before.
//
// What closes the window:
//
//   - When a node drops a bucket, it fences every writer of the bucket (an
//     operation that had not yet taken the writer's lock finds it dead and
//     is sent to the new manager) and waits for the operations in progress
//     (the drain). Until the drain is over it answers a scan of the bucket
//     Held, so the new manager's bucket is not complete before the old
//     writers are quiet (after reconstructWait it serves anyway).
//   - After the drain it hands the new manager what those operations
//     changed: the newest profiles and mail maps of the users it served
//     recently, and per mailbox the UID and MODSEQ counters, the
//     allocations still in flight and its own reservation of UIDs, which
//     the new writer continues (so a clean handover leaves no gap in the
//     UIDs). The receiver merges them and loads its views again.
//   - Every tenure of a bucket has a number. Scan replies carry the number
//     of the sender's last ended tenure, and a handoff carries the number
//     of the tenure it ends: a receiver whose soft state was read from the
//     sender before that tenure ended (the paused node) rebuilds the bucket
//     from scratch instead of merging into old state, and forgets the
//     allocations it made before the sender took over (their deliveries
//     confirmed to the sender, or gave up).

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
)

var (
	// handoffRetry bounds the tries to reach a new manager that does not
	// yet see itself as one (about 3 s, the time the membership takes to
	// agree). Giving up loses only the speed-up: the writers' audit
	// (internal/writer/audit.go) finds what the handoff would have told.
	handoffRetry = retry.Policy{Attempts: 10, Base: 300 * time.Millisecond, Factor: 1}
)

// droppedBucket is a bucket this node stopped managing, with its last soft
// state and its writers, to be drained.
type droppedBucket struct {
	b       uint8
	bk      *bucket
	writers writer.Dropped
}

// HandoffUser is what the old manager knew of one user: its soft state and
// its writer's state.
type HandoffUser struct {
	Profile *userdb.Profile  `json:"profile,omitempty"`
	MailMap []cluster.NodeID `json:"mail_map,omitempty"`
	writer.UserState
}

// HandoffBucket is one dropped bucket.
type HandoffBucket struct {
	Bucket uint8  `json:"bucket"`
	Tenure uint64 `json:"tenure"`
	// Held is how long the sender managed the bucket in this tenure.
	Held  time.Duration `json:"held"`
	Users []HandoffUser `json:"users,omitempty"`
	since time.Time     // when the tenure began, for Held at sending time
}

// HandoffRequest is sent by a node that stopped managing buckets to their
// new manager.
type HandoffRequest struct {
	From    cluster.NodeID  `json:"from"`
	Boot    uint64          `json:"boot"`
	Buckets []HandoffBucket `json:"buckets"`
}

// HandoffReply lists the buckets the receiver does not manage (yet).
type HandoffReply struct {
	Refused []uint8 `json:"refused,omitempty"`
}

// handOff drains each dropped bucket on its own goroutine and sends its
// handoff as soon as it is drained, so one slow operation holds back only
// its own bucket.
func (m *Manager) handOff(dropped []droppedBucket) {
	for _, d := range dropped {
		if !m.spawn(func() { m.sendHandoffs([]HandoffBucket{m.drain(d)}) }) {
			m.drained(d)
		}
	}
}

// drainAll drains every dropped bucket (concurrently) and returns their
// handoffs.
func (m *Manager) drainAll(dropped []droppedBucket) []HandoffBucket {
	out := make([]HandoffBucket, len(dropped))
	var wg sync.WaitGroup
	for i, d := range dropped {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = m.drain(d)
		}()
	}
	wg.Wait()
	return out
}

// drain waits for the operations in progress on a dropped bucket's
// writers and fences them (writer.Dropped.Drain), and returns what the new
// manager needs. Scans of the bucket are answered Held until it is over.
func (m *Manager) drain(d droppedBucket) HandoffBucket {
	defer m.drained(d)
	hb := HandoffBucket{Bucket: d.b, Tenure: d.bk.tenure, since: d.bk.since}
	for _, us := range d.writers.Drain() {
		hu := HandoffUser{UserState: us}
		m.mu.RLock()
		if p := d.bk.profiles[us.User]; p != nil {
			hu.Profile = p.Clone()
		}
		for n := range d.bk.mailMap[us.User] {
			hu.MailMap = append(hu.MailMap, n)
		}
		m.mu.RUnlock()
		hb.Users = append(hb.Users, hu)
	}
	return hb
}

// drained ends a dropped bucket's drain: from now on scans of it are final
// and say which tenure of it ended here.
func (m *Manager) drained(d droppedBucket) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.draining[d.b]--
	m.ended[d.b] = max(m.ended[d.b], d.bk.tenure)
}

// sendHandoffs delivers handoffs to the new managers of their buckets by
// the user manager's own latest map (not the membership's, which still
// names this node while it leaves), and the buckets a receiver refuses
// (it does not see itself as their manager yet) again, to whoever the map
// then names.
func (m *Manager) sendHandoffs(hbs []HandoffBucket) {
	for attempt := 0; len(hbs) > 0 && attempt < handoffRetry.Attempts; attempt++ {
		if attempt > 0 && !retry.Sleep(m.ctx, handoffRetry.Wait(attempt-1)) {
			return
		}
		byNode := map[cluster.NodeID][]HandoffBucket{}
		m.mu.RLock()
		for _, hb := range hbs {
			n := m.um.Node[hb.Bucket]
			if n == "" {
				// No manager: the bucket's island has no live member.
				// Whoever takes it later rebuilds it from the scans.
				continue
			}
			byNode[n] = append(byNode[n], hb)
		}
		m.mu.RUnlock()
		var again []HandoffBucket
		for n, group := range byNode {
			req := &HandoffRequest{From: m.self, Boot: m.selfBoot(), Buckets: sendable(group)}
			ctx, cancel := context.WithTimeout(m.ctx, rpc.DefaultTimeout)
			rep, err := m.on(n).Handoff(ctx, req)
			cancel()
			if err != nil {
				m.log.Debug("bucket handoff failed, retrying", "to", n, "buckets", len(group), "err", err)
				again = append(again, group...)
				continue
			}
			for _, hb := range group {
				if slices.Contains(rep.Refused, hb.Bucket) {
					again = append(again, hb)
				}
			}
		}
		hbs = again
	}
	if len(hbs) > 0 {
		metrics.Handoffs.WithLabelValues("given_up").Add(float64(len(hbs)))
		m.log.Info("bucket handoff not taken; the audit will catch up", "buckets", len(hbs))
	}
}

// sendable fills in the durations measured at sending time.
func sendable(hbs []HandoffBucket) []HandoffBucket {
	out := make([]HandoffBucket, len(hbs))
	for i, hb := range hbs {
		hb.Held = time.Since(hb.since)
		users := make([]HandoffUser, len(hb.Users))
		for j, hu := range hb.Users {
			hu.UserState = hu.UserState.Aged()
			users[j] = hu
		}
		hb.Users = users
		out[i] = hb
	}
	return out
}

// selfBoot returns this node's boot as the membership shows it.
func (m *Manager) selfBoot() uint64 {
	for _, a := range m.peers.Alive() {
		if a.ID == m.self {
			return a.Member.Boot
		}
	}
	return 0
}

// handoff takes over what the previous manager of buckets knew. A
// bucket whose soft state was read from the sender before the handed-off
// tenure ended is stale (this node did not see the sender manage it, as
// after a pause): it is rebuilt from scratch first, and the allocations
// this node made before the sender took over are forgotten.
func (m *Manager) handoff(ctx context.Context, req *HandoffRequest) (*HandoffReply, error) {
	out := &HandoffReply{}
	var take []*HandoffBucket
	stale := map[int]time.Time{}
	m.mu.RLock()
	for i := range req.Buckets {
		hb := &req.Buckets[i]
		bk := m.buckets[hb.Bucket]
		if bk == nil {
			out.Refused = append(out.Refused, hb.Bucket)
			continue
		}
		if boot, ok := bk.contrib[req.From]; ok && boot == req.Boot && bk.ended[req.From] < hb.Tenure {
			stale[int(hb.Bucket)] = time.Now().Add(-hb.Held)
		}
		take = append(take, hb)
	}
	m.mu.RUnlock()
	if len(stale) > 0 {
		m.log.Warn("took back buckets whose soft state was older than their last manager's: rebuilding them",
			"from", req.From, "buckets", len(stale))
		m.rebuildBuckets(stale)
	}
	metrics.Handoffs.WithLabelValues("merged").Add(float64(len(take) - len(stale)))
	metrics.Handoffs.WithLabelValues("rebuilt").Add(float64(len(stale)))
	for _, hb := range take {
		m.mu.Lock()
		bk := m.buckets[hb.Bucket]
		if bk == nil {
			m.mu.Unlock()
			continue // moved on meanwhile: its new manager scans after the drain
		}
		for _, hu := range hb.Users {
			if p := hu.Profile; p != nil {
				m.clock.Observe(p.Version)
				if cur, ok := bk.profiles[hu.User]; !ok || cur.Version < p.Version {
					bk.profiles[hu.User] = p
					bk.holders[hu.User] = map[cluster.NodeID]bool{}
				}
			}
			for _, n := range hu.MailMap {
				noteLocked(bk, hu.User, n)
			}
		}
		bk.viewGen++
		m.mu.Unlock()
		for _, hu := range hb.Users {
			if len(hu.Boxes) > 0 {
				if err := m.writers.Take(hb.Bucket, hu.UserState); err != nil {
					m.log.Debug("writer state of a handoff not taken", "user", hu.User, "err", err)
				}
			}
		}
	}
	return out, nil
}

// Leave is the clean shutdown's handoff: it drops every bucket this node
// manages, fences and drains their writers, then calls announce (which
// tells the cluster the node leaves, so callers turn to the new managers)
// and hands the buckets to the managers the cluster has without it. It
// reports false when there is nobody to hand over to (a cluster of one),
// and gives up waiting when ctx is done.
func (m *Manager) Leave(ctx context.Context, announce func()) (bool, error) {
	m.mu.RLock()
	alive, prev := m.alive, m.um
	m.mu.RUnlock()
	var rest []cluster.Member
	var restInfo []cluster.MemberInfo
	for _, a := range alive {
		if a.ID != m.self {
			rest = append(rest, a.Member)
			restInfo = append(restInfo, a)
		}
	}
	if len(rest) == 0 {
		return false, nil
	}
	um := cluster.Compute(rest, prev.Epoch+1, &prev)
	dropped := m.applyMap(um, restInfo, nil, true)
	done := make(chan struct{})
	if !m.spawn(func() {
		defer close(done)
		hbs := m.drainAll(dropped)
		announce()
		m.sendHandoffs(hbs)
	}) {
		return true, fmt.Errorf("hand buckets over: the user manager is closed")
	}
	select {
	case <-done:
		return true, nil
	case <-ctx.Done():
		return true, fmt.Errorf("hand buckets over: %w", ctx.Err())
	}
}
