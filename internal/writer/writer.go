// Package writer is the ordered writer of users' mailboxes: Neptune's level
// 2 (one primary per partition, ordering its updates), where the partition
// is a user and its primary the manager of the user's bucket in the user map
// (Porcupine §2.2). Messages sit in fragments on many nodes, but IMAP needs,
// per ⟨user, mailbox⟩, one strictly ascending UID sequence and one MODSEQ
// (BLUEPRINT invariant 5). The writer hands out UIDs and MODSEQs, decides
// every flag change, expunge, copy and mailbox change, orders the changes to
// a user's profile with its own reservations, and keeps a view of each
// mailbox's messages as soft state, loaded from the fragments and kept
// current by the changes it makes.
//
// What must outlive the writer lives with the profile on its replicas:
// mailbox names, UIDVALIDITY, subscriptions, and the ends of the blocks of
// UIDs and MODSEQs reserved so far. A new writer after a failover starts at
// those ends, past anything the old one handed out; one that takes a bucket
// over in a handoff continues the old writer's block (handoff.go).
//
// Everything the writer reads and writes of hard state goes through a
// Storage (storage.go): the native store (native.go) or Apache Cassandra
// (cassandra.WriterStorage, where the reserved ends are fenced rows).
//
// The user manager (internal/usermgr, Porcupine §3.3) owns the buckets'
// soft state and tells this package when a bucket is taken (Open), given
// away (Drop, which fences and drains its writers), or rebuilt (Reset); the
// writer reads profiles and mail maps through the Users interface.

package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
)

const (
	// reserveBlock is how many UIDs (and MODSEQs) one profile write
	// reserves: a failover wastes at most this many, and a busy mailbox
	// writes its profile once per this many deliveries.
	reserveBlock = 256
	// allocTimeout is how long an allocated UID hides the UIDs above it
	// while its message is being stored. No session may see UID n+1 before
	// n, so sessions see only UIDs below the oldest allocation in flight;
	// one that never completes stops hiding the rest after this long.
	allocTimeout = time.Minute
	// partialRetry is how soon a view loaded without some fragment is
	// loaded again.
	partialRetry = time.Second
	// settledSweep is how often a view drops the settled allocations
	// older than allocTimeout: a sweep at every confirmation walked a
	// busy mailbox's minute of them per message (a CPU profile under
	// smtp-source showed 8% of the node there); an entry now stays at
	// most allocTimeout+settledSweep, which only makes the check that
	// reads it more careful for a moment longer.
	settledSweep = allocTimeout / 4
	// fragmentReadTimeout bounds reading one node's fragment while a view
	// loads, under the user's writer lock: a node paused but not yet
	// declared dead must not stall the user's every operation for long.
	fragmentReadTimeout = 3 * time.Second
)

// Users is what the writer needs of the user manager: the soft state of the
// buckets this node manages.
type Users interface {
	// Managed waits until the user's bucket is managed here with its soft
	// state rebuilt, and returns the bucket's tenure; or an error wrapping
	// rpc.ErrNotManager.
	Managed(ctx context.Context, user string) (uint64, error)
	// Profile returns a copy of the user's newest profile, tombstones
	// included (nil if none is known; an error if the bucket is not
	// managed here).
	Profile(user string) (*userdb.Profile, error)
	// SaveProfile writes a changed profile to at least minAcks of its
	// replicas and the soft state.
	SaveProfile(ctx context.Context, p *userdb.Profile, minAcks int) error
	// MailMap returns the nodes that hold the user's mail.
	MailMap(ctx context.Context, user string) ([]cluster.NodeID, error)
	// Note records that node n holds the user's mail.
	Note(ctx context.Context, user string, n cluster.NodeID) error
	// ViewGen returns the generation of the views of the user's bucket:
	// when it moves, views load again at their next use.
	ViewGen(user string) uint64
	// CompleteBuckets lists the buckets managed here whose soft state has
	// every live node's scan (the audit looks at those).
	CompleteBuckets() []uint8
	// MissingFromMailMap reports whether node n is missing from the
	// user's mail map, and whether the user's bucket is complete.
	MissingFromMailMap(user string, n cluster.NodeID) (missing, complete bool)
	// NoteAndReload adds n to the user's mail map and makes the views of
	// the user's bucket load again (audit.go).
	NoteAndReload(user string, n cluster.NodeID)
	// Forget takes n out of the user's mail map: n holds none of the
	// user's mail (vacate.go, which calls it under the writer lock).
	Forget(user string, n cluster.NodeID)
}

// Peers is what the writer needs of the cluster.
type Peers interface {
	UserMap() cluster.UserMap
	Alive() []cluster.MemberInfo
	// Eligible lists the live members that may hold a bucket's users'
	// state, in rank order (cluster.Eligible: with islands, its island's).
	Eligible(bucket uint8) ([]cluster.MemberInfo, error)
	cluster.Conns
}

// Manager is the node's writer: the writers of the users of the buckets it
// manages.
type Manager struct {
	self  cluster.NodeID
	users Users
	store Storage
	peers Peers
	clock *hlc.Clock
	log   *slog.Logger

	// Notifier tells local sessions about changes the writers make.
	mailbox.Notifier

	mu sync.Mutex
	// tenure is the user manager's tenure of each bucket managed here
	// (0: not managed), and writers the bucket's writers by user.
	tenure  [cluster.Buckets]uint64
	writers [cluster.Buckets]map[string]*userWriter
	closed  bool
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc

	// draining counts the dropped writers of each bucket not yet drained
	// (a recovery elsewhere waits for them).
	draining [cluster.Buckets]int
	// redo is the REDO log (redolog.go), nil if the storage needs none;
	// redoLen its length as of its last sweep.
	redo    *redoLog
	redoLen atomic.Int64

	audit auditState
	// vacates are the users whose mail map is being checked for nodes
	// that hold none of their mail (vacate.go); under mu.
	vacates vacateState
}

// New returns the node's writer, keeping its mailboxes in store.
func New(self cluster.NodeID, users Users, store Storage, peers Peers, clock *hlc.Clock, log *slog.Logger) *Manager {
	m := &Manager{self: self, users: users, store: store, peers: peers, clock: clock, log: log}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.spawn(m.sweepViews)
	return m
}

// Close stops the writer's background work (the audit) and waits for it.
func (m *Manager) Close() {
	m.stopAudit()
	m.cancel()
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.wg.Wait()
}

// spawn runs fn on a goroutine that Close waits for, unless closed.
func (m *Manager) spawn(fn func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
	return true
}

// ViewMsg is a message of a mailbox view and the nodes found holding it
// (its replicas that answered; Porcupine §4.3: retrieval reads any one).
type ViewMsg struct {
	mailbox.Message
	Holders []cluster.NodeID `json:"holders"`
}

// Sources returns the nodes a body read may ask for the message: those the
// view saw holding it and the rest of its replica set. A message confirmed
// under a write policy of ONE names only its coordinator as holder until
// the view is loaded again, while the others of its set hold it a moment
// later: without them, the loss of the coordinator would leave a session
// nowhere to read it from.
func (v *ViewMsg) Sources() []cluster.NodeID {
	return cluster.NodeSet(append(slices.Clone(v.Holders), v.Replicas...))
}

type boxView struct {
	// counters: the next UID to hand out, the highest MODSEQ handed out,
	// and the reserved ends this writer wrote (view.go).
	counters
	// used and usedMod are what sessions are told as UIDNEXT and
	// HIGHESTMODSEQ: one past the highest UID stored, and the highest
	// MODSEQ applied. They move only when messages are added or changed
	// (RFC 3501 §2.3.1.1), while uidNext may jump past a reserved block
	// after a failover.
	used     uint32
	usedMod  uint64
	loaded   bool
	gen      uint64 // the bucket's viewGen the view was loaded under
	msgs     map[uint32]*ViewMsg
	inflight map[uint32]allocation
	// settled are allocations confirmed or cancelled in the last
	// allocTimeout: a handoff that still lists one (its confirmation
	// overtook it) must not bring it back to hide the UIDs above it.
	// Swept of older ones every settledSweep (sweptAt).
	settled map[uint32]time.Time
	sweptAt time.Time
	// partial says a fragment could not be read when the view was
	// loaded; the view is loaded again at the next use after
	// partialRetry, so a node that was briefly unreachable does not stay
	// hidden until the next membership change.
	partial  bool
	loadedAt time.Time
	// gone are messages this writer took out of the mailbox (expunged,
	// moved away) and the stamp that did it, kept for goneKeep: a replica
	// that has not heard yet still lists them, and neither a reload nor
	// the audit should take that for a message to show.
	gone map[string]goneMsg
	// holders is the last confirmed message's holder set, which the next
	// ones with the same set share (reuse): a mailbox's deliveries mostly
	// land on the same nodes.
	holders []cluster.NodeID
}

// settle records that an allocation was confirmed or cancelled.
func (b *boxView) settle(uid uint32) {
	delete(b.inflight, uid)
	if b.settled == nil {
		b.settled = map[uint32]time.Time{}
	}
	now := time.Now()
	b.settled[uid] = now
	if now.Sub(b.sweptAt) < settledSweep {
		return
	}
	b.sweptAt = now
	for u, at := range b.settled {
		if now.Sub(at) > allocTimeout {
			delete(b.settled, u)
		}
	}
}

// goneMsg is a message a writer removed from a mailbox.
type goneMsg struct {
	stamp replica.Stamp
	at    time.Time
}

// goneKeep is how long a writer remembers what it removed: far longer than
// a replica takes to apply the removal while it is up (the update log
// pushes every second); one that was down longer may show it again until
// the log reaches it, as Porcupine allows (BLUEPRINT invariant 4).
const goneKeep = 10 * time.Minute

// remove takes a message out of the view and remembers that it did.
func (b *boxView) remove(vm *ViewMsg, stamp replica.Stamp) {
	delete(b.msgs, vm.UID)
	if b.gone == nil {
		b.gone = map[string]goneMsg{}
	}
	now := time.Now()
	b.gone[vm.ID] = goneMsg{stamp: stamp, at: now}
	for id, g := range b.gone {
		if now.Sub(g.at) > goneKeep {
			delete(b.gone, id)
		}
	}
}

// removed reports whether the writer took out the message with this id at
// or after version v.
func (b *boxView) removed(id string, v replica.Stamp) bool {
	g, ok := b.gone[id]
	return ok && !g.stamp.Less(v) && time.Since(g.at) <= goneKeep
}

// allocation is a UID handed out and not yet confirmed or cancelled.
type allocation struct {
	at     time.Time
	modseq uint64         // the MODSEQ it took (0: not known, a handoff's)
	from   cluster.Member // the node that will confirm it, and its boot
	// handed says a handoff brought it from the previous writer: its
	// delivery confirms here.
	handed bool
}

type userWriter struct {
	mu      sync.Mutex
	boxes   map[uint32]*boxView
	version uint64
	// dead is set when the writer's bucket moved to another node
	// (handoff.go): an operation that takes the lock after that is sent
	// to the new manager instead of changing a view nobody reads.
	dead bool
	// used is when an operation last ran under the lock.
	used time.Time
}

func newUserWriter() *userWriter { return &userWriter{boxes: map[uint32]*boxView{}} }

// writer returns the writer of a user of a bucket this node manages.
func (m *Manager) writer(ctx context.Context, user string) (*userWriter, error) {
	tenure, err := m.users.Managed(ctx, user)
	if err != nil {
		return nil, err
	}
	b := cluster.Bucket(user)
	m.mu.Lock()
	if m.tenure[b] != tenure || m.writers[b] == nil {
		m.mu.Unlock()
		// Dropped (or taken again) since Managed answered: a writer made
		// now would be one no drain fences.
		return nil, fmt.Errorf("user %s: bucket %d changed hands: %w", user, b, rpc.ErrNotManager)
	}
	w := m.writers[b][user]
	if w == nil {
		w = newUserWriter()
		m.writers[b][user] = w
	}
	redo := m.redo
	m.mu.Unlock()
	// A new primary serves once its log is replayed (redo.go).
	if err := redo.await(ctx, b); err != nil {
		return nil, fmt.Errorf("user %s: %w", user, err)
	}
	return w, nil
}

// lockWriter returns the user's writer, locked, or ErrNotManager if its
// bucket moved away (then or while the lock was awaited).
func (m *Manager) lockWriter(ctx context.Context, user string) (*userWriter, error) {
	w, err := m.writer(ctx, user)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if w.dead {
		w.mu.Unlock()
		return nil, fmt.Errorf("user %s: writer handed over: %w", user, rpc.ErrNotManager)
	}
	w.used = time.Now()
	return w, nil
}

// profileOf returns a copy of the newest live profile of a managed user.
func (m *Manager) profileOf(user string) (*userdb.Profile, error) {
	p, err := m.users.Profile(user)
	if err != nil {
		return nil, err
	}
	if p == nil || p.Deleted {
		return nil, fmt.Errorf("user %s: %w", user, userdb.ErrNotFound)
	}
	return p, nil
}

// saveProfile writes a changed profile: on every replica for changes a user
// makes, on at least one for reservations, so delivery goes on while one
// replica is away (BLUEPRINT invariant 2).
func (m *Manager) saveProfile(ctx context.Context, p *userdb.Profile, minAcks int) error {
	return m.users.SaveProfile(ctx, p, minAcks)
}

// mailMap returns the nodes holding the user's mail.
func (m *Manager) mailMap(user string) ([]cluster.NodeID, error) {
	return m.users.MailMap(context.Background(), user)
}

func (m *Manager) nextValidity(p *userdb.Profile) uint32 {
	v := uint32(time.Now().Unix())
	if v <= p.LastUIDValidity {
		v = p.LastUIDValidity + 1
	}
	p.LastUIDValidity = v
	return v
}

// counters makes sure the view of mailbox v has its UID and MODSEQ counters,
// which start at the reserved ends recorded in the profile.
func (w *userWriter) counters(def *userdb.MailboxDef) *boxView {
	b := w.boxes[def.UIDValidity]
	if b == nil {
		b = &boxView{counters: startCounters(def), inflight: map[uint32]allocation{}}
		w.boxes[def.UIDValidity] = b
	}
	return b
}

// reserve makes sure n more UIDs and MODSEQs are covered by the
// reservations, writing new ends to the storage if not. A storage that
// fenced this writer out makes it forget the user's state (w.boxes).
func (m *Manager) reserve(ctx context.Context, w *userWriter, p *userdb.Profile, def *userdb.MailboxDef, b *boxView, uids int, modseqs int) error {
	write, uidEnd, modEnd, exhausted := b.planReserve(def, uids, modseqs)
	if exhausted {
		return fmt.Errorf("user %s mailbox %q: UIDs exhausted", p.Address, def.Name)
	}
	if !write {
		return nil
	}
	b.mineUID, b.mineMod = uidEnd, modEnd
	// The REDO log's entry goes with the profile's write, at the same
	// time: one append per block of reserveBlock, never per delivery.
	logged := make(chan error, 1)
	go func() {
		logged <- m.logChanges(ctx, p.Address, &Entry{Reserve: &ReserveEnds{UIDValidity: def.UIDValidity, UID: uidEnd, ModSeq: modEnd}})
	}()
	err := m.store.Reserve(ctx, p, def, uidEnd, modEnd)
	if err == nil {
		// A storage may keep ends past those asked for (a fence never
		// moves back): they are this writer's, absorb must not jump them.
		b.mineUID, b.mineMod = def.UIDReserved, def.ModSeqReserved
	}
	if lerr := <-logged; err == nil && lerr != nil {
		// A reservation stands without the secondary's copy: the
		// profile's write (one replica, so delivery goes on while the
		// other is away) and the fragments' highest UIDs, which a new
		// writer reads before its first allocation, keep UIDs unique as
		// they did before the log. Refusing here refused every delivery
		// of a mailbox's new block while the secondary was paused but not
		// yet declared dead (TestWritePolicyAllPerUser).
		m.log.Warn("reservation not logged on the bucket's secondary; the profile and the fragments carry it", "user", p.Address, "mailbox", def.Name, "err", lerr)
	}
	return m.fencedOut(w, p.Address, def, err)
}

// fencedOut passes err on; if the storage says another writer took the
// mailbox over (ErrFenced), that writer starts past every block this one
// reserved, and nothing this writer knows of the user (counters, views,
// allocations) may be used again: it is dropped, and the next operation
// loads afresh.
func (m *Manager) fencedOut(w *userWriter, user string, def *userdb.MailboxDef, err error) error {
	if errors.Is(err, ErrFenced) {
		m.log.Warn("writer fenced out by another writer; its state of the user is dropped", "user", user, "mailbox", def.Name, "err", err)
		w.boxes = map[uint32]*boxView{}
	}
	return err
}

func (w *userWriter) changed(m *Manager, user string, v uint32) {
	w.version++
	m.Publish(mailbox.Change{User: user, Mailbox: uint64(v)})
}

// Release gives back, at a clean shutdown, the unused rest of every
// reserved block of UIDs and MODSEQs, so the next writer continues where
// this one stopped instead of past the block (a crash still skips it).
func (m *Manager) Release(ctx context.Context) {
	m.mu.Lock()
	type item struct {
		user string
		w    *userWriter
	}
	var all []item
	for _, ws := range m.writers {
		for u, w := range ws {
			all = append(all, item{u, w})
		}
	}
	m.mu.Unlock()
	for _, it := range all {
		it.w.mu.Lock()
		p, err := m.profileOf(it.user)
		if err == nil && !it.w.dead {
			var ends []Ends
			for i := range p.Mailboxes {
				def := &p.Mailboxes[i]
				b := it.w.boxes[def.UIDValidity]
				if b == nil || len(b.inflight) > 0 {
					continue
				}
				if err := m.store.Reserved(ctx, it.user, def, false); err != nil {
					continue
				}
				// Only this writer's own reservation is given back: one
				// it has not absorbed is another writer's.
				if def.UIDReserved != b.mineUID || def.ModSeqReserved != b.mineMod {
					continue
				}
				if def.UIDReserved > b.uidNext || def.ModSeqReserved > b.modseq {
					ends = append(ends, Ends{Def: def, UIDNext: b.uidNext, ModSeq: b.modseq})
					b.mineUID, b.mineMod = b.uidNext, b.modseq
				}
			}
			if err := m.store.Release(ctx, p, ends); err != nil {
				m.log.Warn("could not release reserved UIDs", "user", it.user, "err", err)
			} else {
				// The log's last word on these mailboxes: a replay does
				// not raise their ends back past what was given back.
				var es []*Entry
				for _, e := range ends {
					es = append(es, &Entry{Reserve: &ReserveEnds{UIDValidity: e.Def.UIDValidity, UID: e.UIDNext, ModSeq: e.ModSeq}})
				}
				if err := m.logChanges(ctx, it.user, es...); err != nil {
					m.log.Warn("could not log released UIDs; the next writer skips past them", "user", it.user, "err", err)
				}
			}
		}
		it.w.mu.Unlock()
	}
}

// --- allocation for new messages

// AllocRequest asks the writer for UIDs in a mailbox of a user.
type AllocRequest struct {
	User    string `json:"user"`
	Mailbox string `json:"mailbox"`
	// From is the node that will confirm or cancel the allocation (the
	// delivery's proxy): if it leaves the cluster first, the allocation
	// stops hiding the UIDs above it at once instead of after
	// allocTimeout.
	From cluster.Member `json:"from"`
}

// AllocReply is an allocated place, with what the delivering proxy needs to
// choose the storing node: the user's mail map and spread. Answering them
// here spares the delivery a separate lookup at the same manager.
type AllocReply struct {
	Place   mailbox.Placed   `json:"place"`
	MailMap []cluster.NodeID `json:"mail_map"`
	Spread  int              `json:"spread,omitempty"`
	// Replicas and Policy are the user's replication settings (zero: the
	// cluster's defaults).
	Replicas int            `json:"replicas,omitempty"`
	Policy   replica.Policy `json:"policy,omitempty"`
}

// alloc hands out the next UID and MODSEQ of a mailbox.
func (m *Manager) alloc(ctx context.Context, req *AllocRequest) (*AllocReply, error) {
	out := &AllocReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def := p.MailboxByName(req.Mailbox)
		if def == nil {
			if !strings.EqualFold(req.Mailbox, mailbox.Inbox) {
				return fmt.Errorf("user %s mailbox %q: %w", p.Address, req.Mailbox, mailbox.ErrNoMailbox)
			}
			// A profile from before mailboxes were kept with it: make INBOX.
			p.Mailboxes = append(p.Mailboxes, userdb.MailboxDef{Name: mailbox.Inbox, UIDValidity: m.nextValidity(p), Subscribed: true})
			def = &p.Mailboxes[len(p.Mailboxes)-1]
		}
		b := w.counters(def)
		// A new writer (first use, or a failover) takes the highest UID
		// any fragment holds, not only the reservation in the profile: a
		// reservation written to one replica that then died is not in
		// the profile it sees. A view made stale by a membership change
		// or a handoff is loaded again for the same reason.
		b.expire(m.peers.Alive())
		if err := m.load(ctx, w, p.Address, p, def, b); err != nil {
			return err
		}
		if err := m.reserve(ctx, w, p, def, b, 1, 1); err != nil {
			return err
		}
		uid, modseq := b.take()
		b.inflight[uid] = allocation{at: time.Now(), modseq: modseq, from: req.From}
		out.Place = mailbox.Placed{User: p.Address, Mailbox: def.Name, UIDValidity: def.UIDValidity, UID: uid, ModSeq: modseq}
		out.Spread, out.Replicas, out.Policy = p.Spread, p.Replicas, replica.Policy(p.WritePolicy)
		out.MailMap, _ = m.mailMap(p.Address)
		return nil
	})
	return out, err
}

// ConfirmRequest tells the writer a message is stored under its UID.
type ConfirmRequest struct {
	Place   mailbox.Placed  `json:"place"`
	Message mailbox.Message `json:"message"`
	// Nodes are the replicas that acknowledged it (the others get it from
	// the coordinator's update log).
	Nodes []cluster.NodeID `json:"nodes"`
	// Cancel says the message could not be stored: the UID is given up,
	// and stops hiding the UIDs above it.
	Cancel bool `json:"cancel,omitempty"`
	// Unused says a cancelled UID was never meant to store anything (a
	// MULTIAPPEND's guard, proxy.IMAPStore.AppendMulti): nothing can be
	// stored under it, so the view need not be loaded again.
	Unused bool `json:"unused,omitempty"`
}

// confirm records a stored message in the view and the mail map.
func (m *Manager) confirm(ctx context.Context, req *ConfirmRequest) error {
	user := userdb.Normalize(req.Place.User)
	// A cancelled store names the replica set it tried: one of them may
	// have stored it all the same (its answer was lost), and the reload
	// below must read it.
	for _, n := range cluster.NodeSet(append(slices.Clone(req.Nodes), req.Message.Replicas...)) {
		if err := m.users.Note(ctx, user, n); err != nil {
			return err
		}
	}
	if !req.Cancel {
		m.store.Observe(req.Message.Version)
	}
	w, err := m.lockWriter(ctx, user)
	if err != nil {
		return err
	}
	defer w.mu.Unlock()
	v := req.Place.UIDValidity
	b := w.boxes[v]
	if b == nil {
		// Not used here yet (a handoff may follow with the allocation):
		// a bare view, loaded at its first use, that knows it settled.
		b = &boxView{inflight: map[uint32]allocation{}}
		w.boxes[v] = b
	}
	b.settle(req.Place.UID)
	if !req.Cancel {
		// Allocated by an earlier writer (before a handoff) past
		// what this one knows: never hand that UID out again.
		b.follow(req.Place.UID+1, req.Place.ModSeq)
		b.markUsed(req.Place.UID, req.Place.ModSeq)
	} else if b.loaded && !req.Unused {
		// A store whose answer was lost (a coordinator cut off after
		// it applied) may have stored the message all the same:
		// load the view again so it is not hidden until the next
		// membership change.
		b.reloadSoon()
	}
	if b.loaded && !req.Cancel {
		msg := req.Message
		if old := b.msgs[msg.UID]; old != nil && old.ID != msg.ID {
			// Another writer handed out the same UID (two managers
			// for a moment, after a pause or a partition): load the
			// view again, which gives both messages new UIDs, rather
			// than hide one of them.
			b.reloadSoon()
		}
		b.msgs[msg.UID] = &ViewMsg{Message: msg, Holders: reuse(&b.holders, cluster.NodeSet(req.Nodes))}
	}
	w.changed(m, user, v)
	return nil
}

// --- profile changes, made by the writer so they are ordered with the
// reservations it writes into the same profile

// ApplyRequest changes a user's profile.
type ApplyRequest struct {
	Op      string `json:"op"` // add, passwd, scram, replication, spread, quota, admin, delete
	Address string `json:"address"`
	// Hash is the new password's argon2id hash (add, passwd), or for op
	// scram the hash the SCRAM keys were derived beside: they are stored
	// only if the password has not changed since.
	Hash string `json:"hash,omitempty"`
	// SCRAM is the password's SCRAM-SHA-256 keys (userdb.DeriveSCRAM).
	SCRAM string `json:"scram,omitempty"`
	// Replicas and Policy are the user's replication settings (op
	// replication; 0 and "" restore the cluster defaults).
	Replicas int    `json:"replicas,omitempty"`
	Policy   string `json:"policy,omitempty"`
	// QuotaStorage and QuotaMessages are the user's quota limits (op
	// quota; 0 is no limit).
	QuotaStorage  int64 `json:"quota_storage,omitempty"`
	QuotaMessages int64 `json:"quota_messages,omitempty"`
	// Admin is whether the user may sign in to the admin console (op
	// admin).
	Admin bool `json:"admin,omitempty"`
	// Spread is how many nodes the user's mail may spread over (op
	// spread; 0 restores the cluster default), Porcupine §5.
	Spread int `json:"spread,omitempty"`
}

// apply runs a profile change at the user's manager.
func (m *Manager) apply(ctx context.Context, req *ApplyRequest) (*userdb.Profile, error) {
	user := userdb.Normalize(req.Address)
	w, err := m.lockWriter(ctx, user)
	if err != nil {
		return nil, err
	}
	defer w.mu.Unlock()
	p, err := m.profileOf(user)
	if err != nil && !errors.Is(err, userdb.ErrNotFound) {
		return nil, err // the bucket moved away meanwhile
	}
	switch req.Op {
	case "add":
		if err == nil {
			return nil, fmt.Errorf("user %s: %w", user, userdb.ErrExists)
		}
		now := time.Now().UTC()
		np := &userdb.Profile{Address: user, PasswordHash: req.Hash, SCRAMSHA256: req.SCRAM, Created: now}
		if old, _ := m.users.Profile(user); old != nil {
			np.LastUIDValidity = old.LastUIDValidity // a deleted user's: never repeat
		}
		for _, d := range mailbox.DefaultMailboxes {
			np.Mailboxes = append(np.Mailboxes, userdb.MailboxDef{Name: d.Name, SpecialUse: d.SpecialUse,
				UIDValidity: m.nextValidity(np), Subscribed: true})
		}
		w.boxes = map[uint32]*boxView{}
		if err := m.saveProfile(ctx, np, userdb.ProfileReplicas); err != nil {
			return np, err
		}
		return np, m.store.SaveMailboxes(ctx, np)
	case "passwd":
		if err != nil {
			return nil, err
		}
		p.PasswordHash, p.SCRAMSHA256 = req.Hash, req.SCRAM
		return p, m.saveProfile(ctx, p, userdb.ProfileReplicas)
	case "scram":
		if err != nil {
			return nil, err
		}
		if p.PasswordHash != req.Hash || p.SCRAMSHA256 != "" {
			return p, nil // the password changed meanwhile, or keys came first
		}
		p.SCRAMSHA256 = req.SCRAM
		return p, m.saveProfile(ctx, p, userdb.ProfileReplicas)
	case "replication":
		if err != nil {
			return nil, err
		}
		p.Replicas, p.WritePolicy = req.Replicas, req.Policy
		return p, m.saveProfile(ctx, p, userdb.ProfileReplicas)
	case "spread":
		if err != nil {
			return nil, err
		}
		p.Spread = req.Spread
		return p, m.saveProfile(ctx, p, userdb.ProfileReplicas)
	case "quota":
		if err != nil {
			return nil, err
		}
		p.QuotaStorage, p.QuotaMessages = req.QuotaStorage, req.QuotaMessages
		return p, m.saveProfile(ctx, p, userdb.ProfileReplicas)
	case "admin":
		if err != nil {
			return nil, err
		}
		p.Admin = req.Admin
		return p, m.saveProfile(ctx, p, userdb.ProfileReplicas)
	case "delete":
		if err != nil {
			return nil, err
		}
		drop := m.store.DropUser(ctx, user, p)
		tomb := &userdb.Profile{Address: user, Created: p.Created, Deleted: true, LastUIDValidity: p.LastUIDValidity}
		if err := m.saveProfile(ctx, tomb, userdb.ProfileReplicas); err != nil {
			return nil, err
		}
		drop(ctx)
		w.boxes = map[uint32]*boxView{}
		return tomb, nil
	}
	return nil, fmt.Errorf("unknown profile operation %q", req.Op)
}

// --- mailbox views

// load fills the view of a mailbox from the storage. Messages that claim
// one UID (a writer that could not see a node's reservation, after a
// partition) all get new UIDs, so no UID ever names two messages.
func (m *Manager) load(ctx context.Context, w *userWriter, user string, p *userdb.Profile, def *userdb.MailboxDef, b *boxView) error {
	if err := m.store.Reserved(ctx, user, def, true); err != nil {
		return m.fencedOut(w, user, def, err)
	}
	b.absorb(def)
	gen := m.viewGen(user)
	if b.loaded && b.gen == gen && !(b.partial && time.Since(b.loadedAt) > partialRetry) {
		return nil
	}
	mv, err := m.store.Load(ctx, user, def, b.removed)
	if err != nil {
		return err
	}
	b.follow(mv.UIDNext, mv.ModSeq)
	if mv.Used > 0 {
		b.markUsed(mv.Used-1, mv.UsedMod)
	}
	b.msgs, b.loaded, b.gen, b.partial, b.loadedAt = mv.Msgs, true, gen, mv.Partial, time.Now()
	for _, vm := range mv.Clash {
		if err := m.relocate(ctx, w, user, p, def, b, vm); err != nil {
			// Hidden for now, not for good: the view loads again soon
			// and tries once more.
			m.log.Warn("could not renumber a clashing message", "user", user, "mailbox", def.Name, "uid", vm.UID, "err", err)
			b.reloadSoon()
		}
	}
	return nil
}

// viewGen returns the generation of the user's bucket's views.
func (m *Manager) viewGen(user string) uint64 { return m.users.ViewGen(user) }

// relocate gives a message a new UID in its own mailbox, on its node.
func (m *Manager) relocate(ctx context.Context, w *userWriter, user string, p *userdb.Profile, def *userdb.MailboxDef, b *boxView, vm *ViewMsg) error {
	if err := m.reserve(ctx, w, p, def, b, 1, 1); err != nil {
		return err
	}
	nv := *vm
	nv.UID, nv.ModSeq = b.take()
	c := &Change{Obj: mailbox.ObjectFrom(user, def.Name, def.UIDValidity, &nv.Message), Holders: vm.Holders,
		Was: &Place{UIDValidity: def.UIDValidity, UID: vm.UID}}
	m.store.Write(ctx, []*Change{c})
	if c.Err != nil {
		return c.Err
	}
	if err := m.logChanges(ctx, user, updateEntry([]*Change{c})); err != nil {
		return err // the view loads again soon and finds it renumbered
	}
	nv.Replicas, nv.Version = c.Obj.Replicas, c.Stamp
	b.msgs[nv.UID] = &nv
	b.markUsed(nv.UID, nv.ModSeq)
	return nil
}

// reloadSoon makes the view load again from the fragments at its next use
// after partialRetry.
func (b *boxView) reloadSoon() { b.partial, b.loadedAt = true, time.Now() }

// markUsed records a UID and a MODSEQ as stored (for UIDNEXT and
// HIGHESTMODSEQ as clients see them).
func (b *boxView) markUsed(uid uint32, modseq uint64) {
	if uid+1 > b.used {
		b.used = uid + 1
	}
	if modseq > b.usedMod {
		b.usedMod = modseq
	}
}

// expire drops allocations that will never be confirmed: too old, or
// from a node that has left. Such a message may be stored all the same, so
// the view is marked to be loaded again from the fragments.
func (b *boxView) expire(alive []cluster.MemberInfo) {
	live := map[cluster.Member]bool{}
	for _, a := range alive {
		live[a.Member] = true
	}
	for uid, a := range b.inflight {
		if time.Since(a.at) > allocTimeout || (a.from.ID != "" && !live[a.from]) {
			delete(b.inflight, uid)
			b.partial, b.loadedAt = true, time.Time{}
		}
	}
}

// visible returns the view's messages a session may see, in UID order:
// those below the oldest allocation still in flight.
// maxHiddenScan bounds the UIDs shown walks to find the messages an
// allocation in flight hides; past it, it walks the view.
const maxHiddenScan = 4096

// shown is the UIDNEXT and HIGHESTMODSEQ sessions are told while
// allocations are in flight. Those hide every UID from the lowest of them
// up (visible), and a message that then appears must be news to a
// session that has synced: UIDNEXT stays at the lowest hidden UID, and
// HIGHESTMODSEQ below the lowest MODSEQ an allocation in flight or a
// hidden message took (they were taken after everything shown before, so
// neither figure ever goes down). Without this a session that synced
// while a later delivery was confirmed but hidden would take its
// HIGHESTMODSEQ as seen and not look again when the message appeared.
func (b *boxView) shown() (uidNext uint32, modseq uint64) {
	uidNext, modseq = max(b.used, 1), max(b.usedMod, 1)
	if len(b.inflight) == 0 {
		return uidNext, modseq
	}
	limit, minMod := uint32(1<<32-1), uint64(1<<64-1)
	for uid, a := range b.inflight {
		limit = min(limit, uid)
		if a.modseq > 0 {
			minMod = min(minMod, a.modseq)
		}
	}
	hide := func(vm *ViewMsg) {
		if vm.UID >= limit && vm.ModSeq > 0 {
			minMod = min(minMod, vm.ModSeq)
		}
	}
	if b.used > limit && b.used-limit <= maxHiddenScan {
		for uid := limit; uid < b.used; uid++ {
			if vm := b.msgs[uid]; vm != nil {
				hide(vm)
			}
		}
	} else if b.used > limit {
		for _, vm := range b.msgs {
			hide(vm)
		}
	}
	uidNext = max(min(uidNext, limit), 1)
	if minMod != 1<<64-1 {
		modseq = max(min(modseq, minMod-1), 1)
	}
	return uidNext, modseq
}

func (b *boxView) visible() []ViewMsg {
	limit := uint32(1<<32 - 1)
	for uid := range b.inflight {
		if uid < limit {
			limit = uid
		}
	}
	// The UIDs are sorted rather than the messages: a large mailbox's
	// SELECT spent most of its time in sort.Slice moving whole ViewMsgs.
	uids := make([]uint32, 0, len(b.msgs))
	for uid := range b.msgs {
		if uid < limit {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	out := make([]ViewMsg, len(uids))
	for i, uid := range uids {
		out[i] = *b.msgs[uid]
	}
	return out
}
