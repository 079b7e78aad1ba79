package writer

// The writers' anti-entropy audit: defence in depth for the mail map and the
// mailbox views (Porcupine §3.3 rebuilds soft state only when the membership
// changes; a trigger missed between two changes would hide a stored message
// until the next one). Every auditInterval the manager asks each live node
// for the users it holds mail of in the buckets it manages, and for a digest
// of each mailbox whose view is loaded here; a digest that differs from what
// the view expects on that node is checked message by message under the
// user's writer lock, and a view that lacks a stored message, holds an
// older version than a fragment, or shows a message no answering replica
// has, is loaded again. A fragment the mail map does not name in two
// rounds running is added to it.
//
// Every repair is counted (quill_audit_repairs_total) and logged: each one
// is a bug elsewhere, a trigger that should have fired.

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/rpc"
)

const (
	// DefaultAuditInterval is how often the audit runs. With two rounds
	// for a mail map repair and the view loaded at its next use, a stored
	// message is visible again within three intervals (60 s).
	DefaultAuditInterval = 20 * time.Second
	// auditSettle leaves the last seconds of changes out of the digests:
	// replication still in progress is not a difference.
	auditSettle = 5 * time.Second
	// auditCheckLimit bounds the mailboxes checked message by message in
	// one round (each under its user's writer lock).
	auditCheckLimit = 50
	// auditAllocAge is how old an allocation in flight must be for the
	// audit to take its stored message as confirmed: longer than a
	// delivering proxy goes on retrying its confirmation (about 8 s of
	// backoff plus the calls' own deadlines), shorter than allocTimeout,
	// so a lost confirmation hides the UIDs above it for less than a
	// minute.
	auditAllocAge = 30 * time.Second
)

type auditState struct {
	mu sync.Mutex
	// suspects are (user, node) pairs whose fragment the mail map lacked
	// in the last round: the confirmation noting it may be on its way.
	suspects map[auditSuspect]bool
	stop     chan struct{}
	stopOnce sync.Once
}

type auditSuspect struct {
	user string
	node cluster.NodeID
}

// AuditRepairs is what one audit round repaired.
type AuditRepairs struct {
	MailMap int // fragments added to a mail map
	Hidden  int // stored messages a view lacked
	Stale   int // messages a view held an older version of
	Phantom int // messages a view showed that no answering replica has
	// Allocs are allocations still counted in flight although their
	// message is confirmed, or stored long ago with no confirmation
	// coming: each hid every higher UID.
	Allocs int
}

// Total is the number of repairs.
func (r AuditRepairs) Total() int { return r.MailMap + r.Hidden + r.Stale + r.Phantom + r.Allocs }

// StartAudit runs the audit every interval until Close (0: never).
func (m *Manager) StartAudit(interval time.Duration) {
	if _, native := m.store.(*Native); interval <= 0 || !native {
		return // only the native store has fragments and mail maps
	}
	m.audit.mu.Lock()
	m.audit.stop = make(chan struct{})
	stop := m.audit.stop
	m.audit.mu.Unlock()
	m.spawn(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(m.ctx, interval)
			m.AuditOnce(ctx)
			cancel()
		}
	})
}

func (m *Manager) stopAudit() {
	m.audit.mu.Lock()
	defer m.audit.mu.Unlock()
	if m.audit.stop != nil {
		m.audit.stopOnce.Do(func() { close(m.audit.stop) })
	}
}

// auditView is what a loaded view expects each node's fragment to hold.
type auditView struct {
	user string
	v    uint32
	want map[cluster.NodeID]digest
}

type digest struct {
	count int
	hash  uint64
}

// AuditOnce runs one round of the audit and returns what it repaired.
func (m *Manager) AuditOnce(ctx context.Context) AuditRepairs {
	var rep AuditRepairs
	if _, native := m.store.(*Native); !native {
		return rep // only the native store has fragments and mail maps
	}
	before := hlc.Timestamp(time.Now().Add(-auditSettle).UnixMilli()) << 16
	buckets, views, allocs := m.auditSnapshot(before)
	rep.Allocs = allocs
	if len(buckets) == 0 {
		return rep
	}
	suspects := map[auditSuspect]bool{}
	type candidate struct {
		user string
		v    uint32
	}
	var check []candidate
	seen := map[candidate]bool{}
	for _, mi := range m.peers.Alive() {
		if mi.State != "alive" {
			continue
		}
		n := mi.ID
		req := &mailbox.AuditRequest{Buckets: buckets, Before: before}
		for _, av := range views {
			if _, ok := av.want[n]; ok || m.inMailMap(av.user, n) {
				req.Boxes = append(req.Boxes, mailbox.AuditBox{User: av.user, UIDValidity: av.v})
			}
		}
		ans, err := m.auditCall(ctx, n, req, rpc.DefaultTimeout)
		if err != nil {
			m.log.Debug("audit: node did not answer", "node", n, "err", err)
			continue
		}
		for _, u := range ans.Users {
			if m.auditMailMap(u, n, suspects) {
				rep.MailMap++
			}
		}
		for _, d := range ans.Boxes {
			c := candidate{d.User, d.UIDValidity}
			for _, av := range views {
				if av.user == d.User && av.v == d.UIDValidity && (digest{d.Count, d.Hash}) != av.want[n] && !seen[c] {
					seen[c] = true
					check = append(check, c)
				}
			}
		}
	}
	m.audit.mu.Lock()
	m.audit.suspects = suspects
	m.audit.mu.Unlock()
	for i, c := range check {
		if i == auditCheckLimit {
			break
		}
		r := m.auditCheck(ctx, c.user, c.v)
		rep.Hidden += r.Hidden
		rep.Stale += r.Stale
		rep.Phantom += r.Phantom
		rep.Allocs += r.Allocs
	}
	return rep
}

// auditSnapshot returns the buckets this node manages with their soft state
// complete, and what each loaded, current view expects of each node's
// fragment (leaving out changes not older than before). On the way it drops
// allocations in flight whose message is confirmed, and returns how many.
func (m *Manager) auditSnapshot(before hlc.Timestamp) ([]uint8, []auditView, int) {
	type wref struct {
		user string
		w    *userWriter
		gen  uint64
	}
	buckets := m.users.CompleteBuckets()
	var ws []wref
	m.mu.Lock()
	for _, b := range buckets {
		for u, w := range m.writers[b] {
			ws = append(ws, wref{u, w, 0})
		}
	}
	m.mu.Unlock()
	for i := range ws {
		ws[i].gen = m.users.ViewGen(ws[i].user)
	}
	var views []auditView
	allocs := 0
	for _, r := range ws {
		r.w.mu.Lock()
		if !r.w.dead {
			for v, b := range r.w.boxes {
				for uid := range b.inflight {
					_, stored := b.msgs[uid]
					_, settled := b.settled[uid]
					if stored || settled {
						b.settle(uid)
						allocs++
						metrics.AuditRepairs.WithLabelValues("alloc").Inc()
						m.log.Warn("audit: an allocation counted in flight was already settled; dropped", "user", r.user, "uid", uid)
					}
				}
				if !b.loaded || b.partial || b.gen != r.gen {
					continue // loads again at its next use anyway
				}
				av := auditView{user: r.user, v: v, want: map[cluster.NodeID]digest{}}
				for _, vm := range b.msgs {
					if vm.Version.Clock >= before {
						continue
					}
					for _, n := range expectedOn(vm) {
						d := av.want[n]
						d.count++
						d.hash ^= mailbox.DigestHash(vm.ID, vm.Version)
						av.want[n] = d
					}
				}
				views = append(views, av)
			}
		}
		r.w.mu.Unlock()
	}
	return buckets, views, allocs
}

// expectedOn returns the nodes that should hold a message of a view: its
// replica set, or the nodes found holding it for one stored before
// replica sets were recorded.
func expectedOn(vm *ViewMsg) []cluster.NodeID {
	if len(vm.Replicas) > 0 {
		return vm.Replicas
	}
	return vm.Holders
}

func (m *Manager) inMailMap(user string, n cluster.NodeID) bool {
	missing, _ := m.users.MissingFromMailMap(user, n)
	return !missing
}

// auditMailMap checks that the mail map names node n for a user n holds
// mail of; the second round in a row it does not, n is added. It reports
// whether it repaired the mail map.
func (m *Manager) auditMailMap(user string, n cluster.NodeID, suspects map[auditSuspect]bool) bool {
	s := auditSuspect{user, n}
	m.audit.mu.Lock()
	again := m.audit.suspects[s]
	m.audit.mu.Unlock()
	if missing, complete := m.users.MissingFromMailMap(user, n); !missing || !complete {
		return false
	}
	if !again {
		suspects[s] = true
		return false
	}
	m.users.NoteAndReload(user, n)
	metrics.AuditRepairs.WithLabelValues("mailmap").Inc()
	m.log.Warn("audit: the mail map lacked a node holding the user's mail; added, views load again", "user", user, "node", n)
	return true
}

// auditCheck compares a user's view of a mailbox with every live fragment,
// message by message, under the writer's lock, and loads the view again if
// they differ.
func (m *Manager) auditCheck(ctx context.Context, user string, v uint32) AuditRepairs {
	var rep AuditRepairs
	w, err := m.lockWriter(ctx, user)
	if err != nil {
		return rep
	}
	defer w.mu.Unlock()
	p, err := m.profileOf(user)
	if err != nil {
		return rep
	}
	def := p.MailboxByValidity(v)
	b := w.boxes[v]
	if def == nil || b == nil || !b.loaded || b.partial || b.gen != m.viewGen(user) {
		return rep
	}
	mailMap, err := m.mailMap(user)
	if err != nil {
		return rep
	}
	live := map[cluster.NodeID]bool{}
	for _, mi := range m.peers.Alive() {
		if mi.State == "alive" {
			live[mi.ID] = true
		}
	}
	byID := make(map[string]*ViewMsg, len(b.msgs))
	for _, vm := range b.msgs {
		byID[vm.ID] = vm
	}
	answered := map[cluster.NodeID]bool{}
	listed := map[string]bool{}
	var hiddenOn []cluster.NodeID
	for _, n := range mailMap {
		if !live[n] {
			continue
		}
		ans, err := m.auditCall(ctx, n, &mailbox.AuditRequest{Boxes: []mailbox.AuditBox{{User: user, UIDValidity: v}}, List: true}, fragmentReadTimeout)
		if err != nil || len(ans.Boxes) != 1 {
			continue
		}
		answered[n] = true
		for _, fm := range ans.Boxes[0].Messages {
			listed[fm.ID] = true
			vm := byID[fm.ID]
			switch {
			case vm == nil:
				if a, ok := b.inflight[fm.UID]; ok {
					if time.Since(a.at) > auditAllocAge {
						// Stored, and its confirmation is not coming: it
						// hides every UID above it until allocTimeout.
						b.settle(fm.UID)
						rep.Allocs++
					}
					continue
				}
				if b.removed(fm.ID, fm.Version) {
					continue // removed, and not yet applied there
				}
				rep.Hidden++
				hiddenOn = append(hiddenOn, n)
			case vm.Version.Less(fm.Version):
				rep.Stale++
			}
		}
	}
	for _, vm := range b.msgs {
		heard := false
		for _, n := range append(slices.Clone(vm.Replicas), vm.Holders...) {
			heard = heard || answered[n]
		}
		if heard && !listed[vm.ID] {
			rep.Phantom++
		}
	}
	if rep.Total() == 0 {
		return rep
	}
	metrics.AuditRepairs.WithLabelValues("hidden").Add(float64(rep.Hidden))
	metrics.AuditRepairs.WithLabelValues("stale").Add(float64(rep.Stale))
	metrics.AuditRepairs.WithLabelValues("phantom").Add(float64(rep.Phantom))
	metrics.AuditRepairs.WithLabelValues("alloc").Add(float64(rep.Allocs))
	m.log.Warn("audit: a mailbox view differed from its fragments; loaded again", "user", user, "mailbox", def.Name,
		"hidden", rep.Hidden, "stale", rep.Stale, "phantom", rep.Phantom, "unconfirmed", rep.Allocs, "hidden_on", cluster.NodeSet(hiddenOn))
	b.loaded = false
	if err := m.load(ctx, w, user, p, def, b); err != nil {
		m.log.Warn("audit: could not load the view again", "user", user, "mailbox", def.Name, "err", err)
		b.reloadSoon()
	}
	w.changed(m, user, v)
	return rep
}

// auditCall asks node n about its fragments.
func (m *Manager) auditCall(ctx context.Context, n cluster.NodeID, req *mailbox.AuditRequest, timeout time.Duration) (*mailbox.AuditReply, error) {
	return m.store.(*Native).audit(ctx, n, req, timeout)
}
