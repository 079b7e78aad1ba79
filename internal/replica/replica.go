// Package replica is the replication manager of Porcupine §4.2–§4.4: it
// keeps the replicas of objects (a mail message, a user profile) consistent
// across the nodes that hold them. An object is updated totally: an update
// carries the object's whole content and a timestamp, and a replica keeps
// only the newest (update anywhere, ordering by clocks; here hybrid logical
// clocks, so a skewed wall clock cannot reorder a node's own updates after
// ones it has seen, BLUEPRINT invariant 6).
//
// The node that receives an update is its coordinator. It records the update
// in its persistent update log, ⟨timestamp, object, target nodes, remaining
// nodes⟩ (§4.4), in the same durable batch that applies it to its own
// replica, then pushes the update to every remaining target. A peer applies
// it if it is newer than its replica, and acknowledges; the coordinator
// prunes the remaining set, and an entry whose set is empty retires after
// RetireDelay. A peer that is not the last remaining node logs the update too,
// so that if the coordinator dies any remaining replica finishes the job
// (§4.4). Entries older than MaxAge (a week) are dropped; a node away for
// longer rejoins as a new node (internal/core wipes it).
//
// The manager does not know what an object is: a Handler per kind (the
// mailbox manager for messages, the user database for profiles) applies
// updates to the on-disk structures. It also runs the repair that Porcupine
// leaves to the operator: objects whose replicas are gone for longer than
// ReplaceAfter are given new replicas (repair.go).
package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/store"
	"google.golang.org/grpc"
)

// Policy is how many replicas must hold an update durably before its writer
// is answered (Neptune's consistency choice, CassMail's ONE/QUORUM/ALL): an
// SMTP 250 waits for it (BLUEPRINT invariant 1).
type Policy string

const (
	One    Policy = "one"
	Quorum Policy = "quorum"
	All    Policy = "all"
)

// ParsePolicy reads a policy name; empty is "" (the cluster default).
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(strings.ToLower(strings.TrimSpace(s))); p {
	case "", One, Quorum, All:
		return p, nil
	}
	return "", fmt.Errorf("write policy %q: want one, quorum or all", s)
}

// Need returns how many of n replicas the policy waits for.
func (p Policy) Need(n int) int {
	switch p {
	case All:
		return n
	case Quorum:
		return n/2 + 1
	}
	return min(1, n)
}

// Strictest returns the policy among ps that waits for the most of n
// copies (the first such; def for an empty list or "" entries): what a
// write for several users must meet to be as durable as each user's own.
func Strictest(n int, def Policy, ps ...Policy) Policy {
	best := def
	for _, p := range ps {
		if p == "" {
			p = def
		}
		if p.Need(n) > best.Need(n) {
			best = p
		}
	}
	return best
}

// Stamp orders the updates of one object: the coordinator's hybrid logical
// clock, then its node id (Porcupine's ⟨wall clock, node⟩ pair).
type Stamp struct {
	Clock hlc.Timestamp  `json:"c"`
	Node  cluster.NodeID `json:"n,omitempty"`
}

// Less reports whether a is older than b.
func (a Stamp) Less(b Stamp) bool {
	if a.Clock != b.Clock {
		return a.Clock < b.Clock
	}
	return a.Node < b.Node
}

// IsZero reports an unset stamp.
func (a Stamp) IsZero() bool { return a.Clock == 0 && a.Node == "" }

// Update is one total update of one object.
type Update struct {
	// Object names the object: its kind, a slash, then the kind's name
	// for it ("m/..." a message, "p/..." a profile).
	Object  string           `json:"object"`
	Stamp   Stamp            `json:"stamp"`
	Targets []cluster.NodeID `json:"targets"`
	// Data is the object's content, as its kind's handler encodes it.
	Data []byte `json:"data"`
	// Blob is the object's large immutable part (a message's bytes). The
	// log does not keep it: the local replica has it, and a push fills it
	// in again. A peer that already has it is sent updates without it.
	Blob []byte `json:"blob,omitempty"`
}

// Kind returns the object's kind.
func (u *Update) Kind() string {
	k, _, _ := strings.Cut(u.Object, "/")
	return k
}

// Entry is a record of the update log (§4.4).
type Entry struct {
	Update
	Remaining []cluster.NodeID `json:"remaining"`
	Logged    time.Time        `json:"logged"`
	Done      time.Time        `json:"done,omitzero"`
}

// Outcome is what a replica did with an update.
type Outcome int

const (
	// Applied: the update is now the replica (durably).
	Applied Outcome = iota
	// Stale: the replica already holds this update or a newer one.
	Stale
	// NeedContent: the update left out part of the content (a body) that
	// this replica does not have; push it again whole.
	NeedContent
	// Failed: the replica could not apply it (logged there).
	Failed
	// Conflict: the replica holds another object in the place the update
	// names (two writers cut off from each other gave one UID to two
	// messages). Only the object's writer can resolve it, with a newer
	// update (a new UID); until then the push is tried again.
	Conflict
)

// Handler applies the updates of one kind of object to this node's
// on-disk structures.
type Handler interface {
	// Apply makes each update the local replica of its object when it is
	// newer than what is here, and calls logw with the batch and the
	// outcomes before committing, so log entries and replicas are durable
	// together (one fsync).
	Apply(ups []*Update, logw func(b *store.Batch, outs []Outcome) error) ([]Outcome, error)
	// Fill sets u.Blob from the local replica, for a peer that lacks it;
	// it fails if the replica here no longer matches the update.
	Fill(u *Update) error
}

// Peers is what the manager needs of the cluster.
type Peers interface {
	Alive() []cluster.MemberInfo
	// Expected is how many nodes the cluster has, counting those away.
	Expected() int
	// Conn reaches another node's services.
	Conn(node cluster.NodeID) (grpc.ClientConnInterface, error)
}

// Timings of the update log. Each is deliberate:
const (
	// DefaultRetireDelay is how long a completed entry stays in the log.
	// Porcupine waits 3 minutes (clock skew plus packet lifetime) to filter
	// out-of-order updates; replicas here also keep each object's stamp, so
	// the delay only keeps a record of recent work for operators.
	DefaultRetireDelay = 3 * time.Minute
	// DefaultMaxAge is how long an entry waits for an absent node (§4.4: a
	// week); a node away longer rejoins as a new one.
	DefaultMaxAge = 7 * 24 * time.Hour
	// takeoverAfter is how long a non-coordinating replica leaves an
	// entry to its live coordinator before pushing it itself.
	takeoverAfter = 30 * time.Second
	// pushInterval is how often the log is worked through for updates
	// that could not be pushed at once (a peer down, paused or cut off).
	pushInterval = time.Second
	// pushTimeout bounds one push to one peer.
	pushTimeout = 5 * time.Second
	// pushBatch bounds how many updates one push carries.
	pushBatch = 64
)

// Manager is a node's replication manager.
type Manager struct {
	self     cluster.NodeID
	db       *store.DB
	clock    *hlc.Clock
	log      *slog.Logger
	handlers map[string]Handler

	peers Peers

	RetireDelay  time.Duration
	MaxAge       time.Duration
	ReplaceAfter time.Duration

	mu      sync.Mutex
	entries map[string]*Entry // the log, by object
	pushing map[string]int    // object/node pushes in flight, how many
	// conflicts are objects whose writer was asked to resolve a conflict,
	// and when.
	conflicts map[string]time.Time
	// writers and placer are the collaborators Start was given: the
	// objects' ordered writers (repair, conflicts) and the balancer.
	writers Writers
	placer  Placer
	// room reports whether the disk can take new content; noRoomLogged
	// is when a refusal for lack of it was last logged.
	room         func() bool
	noRoomLogged time.Time
	kick         chan struct{}
	stop         chan struct{}
	wg           sync.WaitGroup

	repair repairState
}

// Options configure a replication manager.
type Options struct {
	// Peers reaches the other nodes.
	Peers Peers
	// Room reports whether this node's disk can take new content
	// (message bytes); nil: always. A node whose disk is nearly full
	// refuses updates that carry content, here and in pushes; the
	// coordinators keep them in their logs until it has room again.
	// Without this the disk could fill up entirely, and Pebble ends the
	// process when it cannot write its WAL.
	Room func() bool
	// MaxAge, ReplaceAfter and RetireDelay: 0 takes DefaultMaxAge,
	// DefaultReplaceAfter and DefaultRetireDelay.
	MaxAge, ReplaceAfter, RetireDelay time.Duration
}

// Writers is what the manager needs of the objects' ordered writers (for
// messages, the users' mailbox writers): new replica sets for repair, and
// the resolution of conflicts a replica reports.
type Writers interface {
	// Rehome has the writer of a user's objects move them to new replica
	// sets.
	Rehome(ctx context.Context, user string, moves []Move) error
	// ResolveConflict asks the writer of an object that a replica refused
	// for a conflict to resolve it (for messages: load the user's views,
	// which renumbers messages that share a UID).
	ResolveConflict(ctx context.Context, object string) error
}

// Placer chooses nodes for new replicas (the load balancer).
type Placer interface {
	// Replicas picks n live nodes outside exclude that may hold a
	// bucket's users' state (with islands: its island's).
	Replicas(bucket uint8, exclude []cluster.NodeID, n int) []cluster.NodeID
	// May says whether node n may hold a bucket's users' state.
	May(bucket uint8, n cluster.NodeID) bool
}

// New returns the replication manager and loads the update log.
func New(self cluster.NodeID, db *store.DB, clock *hlc.Clock, log *slog.Logger, o Options) (*Manager, error) {
	m := &Manager{self: self, db: db, clock: clock, log: log, handlers: map[string]Handler{},
		peers: o.Peers, room: o.Room, RetireDelay: o.RetireDelay, MaxAge: o.MaxAge, ReplaceAfter: o.ReplaceAfter,
		entries: map[string]*Entry{}, pushing: map[string]int{}, conflicts: map[string]time.Time{},
		kick: make(chan struct{}, 1), stop: make(chan struct{})}
	if m.RetireDelay <= 0 {
		m.RetireDelay = DefaultRetireDelay
	}
	if m.MaxAge <= 0 {
		m.MaxAge = DefaultMaxAge
	}
	if m.ReplaceAfter <= 0 {
		m.ReplaceAfter = DefaultReplaceAfter
	}
	it, err := db.PrefixIter(nil, store.KindPrefix(store.KindLog))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var stale [][]byte
	for it.First(); it.Valid(); it.Next() {
		ep, err := decodeEntry(it.Value())
		if err != nil {
			return nil, fmt.Errorf("update log entry %q: %w", it.Key(), err)
		}
		e := *ep
		clock.Observe(e.Stamp.Clock)
		if old := m.entries[e.Object]; old != nil {
			if e.Stamp.Less(old.Stamp) {
				stale = append(stale, logKey(e.Object, e.Stamp))
				continue
			}
			stale = append(stale, logKey(old.Object, old.Stamp))
		}
		m.entries[e.Object] = &e
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	if len(stale) > 0 {
		b := db.NewBatch()
		defer b.Close()
		for _, k := range stale {
			b.Delete(k)
		}
		if err := b.Commit(store.NoSync); err != nil {
			return nil, fmt.Errorf("update log: %w", err)
		}
	}
	return m, nil
}

// Handle registers the handler of a kind of object.
func (m *Manager) Handle(kind string, h Handler) { m.handlers[kind] = h }

func (m *Manager) getPeers() Peers { return m.peers }

// Start runs the log's background work — pushes that failed at first,
// retirement, and repair — with the objects' writers and the balancer it
// needs for repair and conflicts (nil: no repair, conflicts left to
// retries).
func (m *Manager) Start(w Writers, p Placer) {
	m.mu.Lock()
	m.writers, m.placer = w, p
	m.mu.Unlock()
	m.wg.Add(2)
	go m.pushLoop()
	go m.repairLoop()
}

// Close stops the background work.
func (m *Manager) Close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.wg.Wait()
}

// Kick makes the manager work through its log now (a node came back).
func (m *Manager) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Now returns a new stamp from this node's clock.
func (m *Manager) Now() Stamp { return Stamp{Clock: m.clock.Now(), Node: m.self} }

// Observe moves this node's clock past a stamp seen elsewhere.
func (m *Manager) Observe(s Stamp) { m.clock.Observe(s.Clock) }

// logKey names a log entry by object and stamp, so that recording an
// acknowledgement of an older update can never overwrite the entry of a newer
// one; when the log is loaded only the newest entry per object is kept.
func logKey(object string, s Stamp) []byte {
	k := append(store.KindPrefix(store.KindLog), object...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(s.Clock))
	return append(k, s.Node...)
}

func without(set []cluster.NodeID, drop ...cluster.NodeID) []cluster.NodeID {
	out := make([]cluster.NodeID, 0, len(set))
	for _, n := range set {
		if !slices.Contains(drop, n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// ErrPolicy is returned when fewer replicas than the write policy asks for
// acknowledged an update in time. The update is not lost: it is in the
// coordinator's log and reaches the others when they can be reached.
var ErrPolicy = errors.New("write policy not met")

// ErrNoRoom refuses new content on a node whose disk is nearly full.
var ErrNoRoom = fmt.Errorf("disk nearly full: no new content taken: %w", rpc.ErrNoSpace)

// WriteRequest is an update sent to its coordinator.
type WriteRequest struct {
	Updates []*Update `json:"updates"`
	Policy  Policy    `json:"policy"`
	// Want is the number of replicas the policy counts from (the user's
	// R), when more than the targets; 0 counts the targets.
	Want int `json:"want,omitempty"`
}

// WriteReply says which targets hold the updates durably.
type WriteReply struct {
	Acked []cluster.NodeID `json:"acked"`
}

// Write coordinates updates that share one set of targets: it logs and
// applies them here (when this node is a target), pushes them to the other
// targets, and returns once the policy's number of targets hold them.
// Updates without a stamp get one from this node's clock.
func (m *Manager) Write(ctx context.Context, req *WriteRequest) (*WriteReply, error) {
	if len(req.Updates) == 0 {
		return &WriteReply{}, nil
	}
	ups := req.Updates
	plan, err := planWrite(m.self, req)
	if err != nil {
		return nil, err
	}
	h := m.handlers[plan.kind]
	if h == nil {
		return nil, fmt.Errorf("update of %s: no handler for kind %q", ups[0].Object, plan.kind)
	}
	for _, u := range ups {
		if u.Stamp.IsZero() {
			u.Stamp = m.Now()
		} else {
			m.Observe(u.Stamp)
		}
	}
	if plan.local && plan.content && !m.hasRoom(len(ups)) {
		return nil, fmt.Errorf("update of %s on %s: %w", ups[0].Object, m.self, ErrNoRoom)
	}
	var acked []cluster.NodeID
	if plan.local {
		if err := m.applyHere(h, plan, ups); err != nil {
			return nil, err
		}
		acked = append(acked, m.self)
	} else if len(plan.remaining) > 0 {
		if err := m.logOnly(plan, ups); err != nil {
			return nil, err
		}
	}
	// Timely propagation (§4.4): push now, in parallel, and answer as soon
	// as the policy is decided; the rest goes on in the background.
	t := newTally(plan.need, acked, len(plan.remaining))
	type result struct {
		n   cluster.NodeID
		err error
	}
	results := make(chan result, len(plan.remaining))
	for _, n := range plan.remaining {
		// Marked as being pushed, so the log worker does not push the
		// same updates to n again (reading the bodies back) while this
		// push is on its way: one push per copy.
		m.markPushing(n, ups)
		go func(n cluster.NodeID) {
			err := m.push(n, ups, false)
			m.unmarkPushing(n, ups)
			results <- result{n, err}
		}(n)
	}
	for !t.decided() {
		select {
		case r := <-results:
			t.step(r.n, r.err)
		case <-ctx.Done():
			t.errs = append(t.errs, ctx.Err())
			return t.verdict(ups[0].Object)
		}
	}
	return t.verdict(ups[0].Object)
}

// applyHere applies a write to this node's replicas and logs, in the same
// durable batch, the updates other targets still need.
func (m *Manager) applyHere(h Handler, plan writePlan, ups []*Update) error {
	now := time.Now()
	logged := make([]*Entry, 0, len(ups))
	outs, err := h.Apply(ups, func(b *store.Batch, outs []Outcome) error {
		for i, u := range ups {
			if !plan.loggedHere(outs[i]) {
				continue
			}
			e := &Entry{Update: *u, Remaining: plan.remaining, Logged: now}
			e.Blob = nil
			if err := m.replaceEntry(b, e); err != nil {
				return err
			}
			logged = append(logged, e)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply update of %s here: %w", ups[0].Object, err)
	}
	m.install(logged)
	objects := make([]string, len(ups))
	for i, u := range ups {
		objects[i] = u.Object
	}
	conflicts, err := judgeLocal(objects, outs)
	m.conflicted(conflicts)
	return err
}

// logOnly logs a write on a node that is not among its targets (a profile's
// manager that is not one of its replicas): the log keeps the whole
// content, blob included, forced to disk, as there is no local replica to
// fill it from.
func (m *Manager) logOnly(plan writePlan, ups []*Update) error {
	now := time.Now()
	b := m.db.NewBatch()
	defer b.Close()
	logged := make([]*Entry, 0, len(ups))
	for _, u := range ups {
		e := &Entry{Update: *u, Remaining: plan.remaining, Logged: now}
		if err := m.replaceEntry(b, e); err != nil {
			return err
		}
		logged = append(logged, e)
	}
	if err := b.Commit(store.Sync); err != nil {
		return fmt.Errorf("update log: %w", err)
	}
	m.install(logged)
	return nil
}

// install makes committed log entries current, unless a newer entry of the
// same object got there first; an entry with no stamp removes the object's.
func (m *Manager) install(entries []*Entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range entries {
		cur := m.entries[e.Object]
		switch {
		case e.Stamp.IsZero():
			delete(m.entries, e.Object)
		case cur == nil || cur.Stamp.Less(e.Stamp):
			m.entries[e.Object] = e
		}
	}
}

func setEntry(b *store.Batch, e *Entry) error {
	v, err := encodeEntry(e)
	if err != nil {
		return err
	}
	return b.Set(logKey(e.Object, e.Stamp), v)
}

// replaceEntry writes e into b and removes the older entry of the same
// object, if this node logged one.
func (m *Manager) replaceEntry(b *store.Batch, e *Entry) error {
	m.mu.Lock()
	old := m.entries[e.Object]
	m.mu.Unlock()
	if old != nil && old.Stamp != e.Stamp {
		if err := b.Delete(logKey(old.Object, old.Stamp)); err != nil {
			return err
		}
	}
	return setEntry(b, e)
}

// PushRequest carries updates and their log entries to a peer.
type PushRequest struct {
	Entries []*Entry `json:"entries"`
}

// PushReply is the peer's outcome for each.
type PushReply struct {
	Outcomes []Outcome `json:"outcomes"`
}

// push sends updates to one peer and records its acknowledgements. whole
// fills each update's content from the local replica first.
func (m *Manager) push(n cluster.NodeID, ups []*Update, whole bool) error {
	peers := m.getPeers()
	if peers == nil {
		return fmt.Errorf("push to %s: %w", n, rpc.ErrUnavailable)
	}
	req := &PushRequest{}
	for _, u := range ups {
		e := &Entry{Update: *u}
		m.mu.Lock()
		if le := m.entries[u.Object]; le != nil && le.Stamp == u.Stamp {
			e.Remaining = without(le.Remaining, n)
		}
		m.mu.Unlock()
		if whole && e.Blob == nil {
			if err := m.handlers[u.Kind()].Fill(&e.Update); err != nil {
				// The replica here moved on (a newer update replaced
				// it); the newer entry is pushed instead.
				m.log.Debug("update no longer fillable", "object", u.Object, "err", err)
				m.acked(u.Object, u.Stamp, n)
				continue
			}
		}
		req.Entries = append(req.Entries, e)
	}
	if len(req.Entries) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
	defer cancel()
	rep, err := Remote(peers, n).Push(ctx, req)
	if err != nil {
		return fmt.Errorf("push %d updates to %s: %w", len(req.Entries), n, err)
	}
	if len(rep.Outcomes) != len(req.Entries) {
		return fmt.Errorf("push to %s: %d outcomes for %d updates", n, len(rep.Outcomes), len(req.Entries))
	}
	var again []*Update
	var conflicts []string
	failed := 0
	for i, o := range rep.Outcomes {
		e := req.Entries[i]
		switch o {
		case Applied, Stale:
			m.acked(e.Object, e.Stamp, n)
		case NeedContent:
			u := e.Update
			again = append(again, &u)
		case Conflict:
			conflicts = append(conflicts, e.Object)
			failed++
		default:
			failed++
		}
	}
	m.conflicted(conflicts)
	if len(again) > 0 && !whole {
		return m.push(n, again, true)
	}
	if failed > 0 || len(again) > 0 {
		return fmt.Errorf("push to %s: %d of %d updates not applied", n, failed+len(again), len(req.Entries))
	}
	return nil
}

// hasRoom reports whether new content may be written here, and logs a
// refusal at most once per noRoomLogEvery.
func (m *Manager) hasRoom(refused int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.room == nil || m.room() {
		return true
	}
	if refused > 0 && time.Since(m.noRoomLogged) >= noRoomLogEvery {
		m.noRoomLogged = time.Now()
		m.log.Warn("updates with content refused: the disk is nearly full", "updates", refused)
	}
	return false
}

// noRoomLogEvery spaces the log lines about refusals for lack of room:
// coordinators retry every second.
const noRoomLogEvery = 10 * time.Second

// conflictRetry is how often the writer of an object whose pushes are
// refused for a conflict is asked again to resolve it: pushes are retried
// every second, and asking each time would only repeat the writer's work.
const conflictRetry = 10 * time.Second

// conflicted hands objects whose update a replica refused for a conflict
// to the conflict handler, each at most once per conflictRetry. Without
// it, such an update waits in the log until something else makes the
// writer look at the object (a user reading the mailbox), and the object
// has fewer replicas meanwhile.
func (m *Manager) conflicted(objects []string) {
	if len(objects) == 0 {
		return
	}
	now := time.Now()
	m.mu.Lock()
	w := m.writers
	if w == nil {
		// Not started yet (RPCs are served before Start installs the
		// writers): record nothing, so the next refusal asks at once.
		m.mu.Unlock()
		return
	}
	var ask []string
	for _, o := range objects {
		if t, ok := m.conflicts[o]; ok && now.Sub(t) < conflictRetry {
			continue
		}
		m.conflicts[o] = now
		ask = append(ask, o)
	}
	for o, t := range m.conflicts {
		if now.Sub(t) >= conflictRetry {
			delete(m.conflicts, o)
		}
	}
	m.mu.Unlock()
	for _, o := range ask {
		m.log.Info("a replica refused an update for a conflict: asking the writer to resolve it", "object", o)
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), rpc.DefaultTimeout)
			defer cancel()
			if err := w.ResolveConflict(ctx, o); err != nil {
				m.log.Warn("could not have a conflict resolved", "object", o, "err", err)
			}
		}()
	}
}

// acked records that node n holds the update of object with stamp s.
func (m *Manager) acked(object string, s Stamp, n cluster.NodeID) {
	m.mu.Lock()
	e := m.entries[object]
	if e == nil || e.Stamp != s || !slices.Contains(e.Remaining, n) {
		m.mu.Unlock()
		return
	}
	ne := *e
	// An entry left with no remaining node is marked done by the log
	// worker, which also tells the other targets in one batch (notifyDone).
	ne.Remaining = without(e.Remaining, n)
	m.entries[object] = &ne
	m.mu.Unlock()
	// Not forced: an acknowledgement lost in a crash only makes the update
	// go out once more, and replicas drop what they already have. The key
	// names the stamp, so this cannot overwrite a newer entry.
	b := m.db.NewBatch()
	defer b.Close()
	if err := setEntry(b, &ne); err == nil {
		b.Commit(store.NoSync)
	}
}

// Push applies updates pushed by a coordinator (or by a replica finishing
// a dead coordinator's work).
func (m *Manager) Push(ctx context.Context, req *PushRequest) (*PushReply, error) {
	out := &PushReply{Outcomes: make([]Outcome, len(req.Entries))}
	byKind := map[string][]int{}
	withContent := 0
	for _, e := range req.Entries {
		if e != nil && len(e.Blob) > 0 {
			withContent++
		}
	}
	room := withContent == 0 || m.hasRoom(withContent)
	for i, e := range req.Entries {
		if e == nil || (len(e.Blob) > 0 && !room) {
			out.Outcomes[i] = Failed
			continue
		}
		m.Observe(e.Stamp)
		byKind[e.Kind()] = append(byKind[e.Kind()], i)
	}
	now := time.Now()
	for kind, idx := range byKind {
		h := m.handlers[kind]
		if h == nil {
			for _, i := range idx {
				out.Outcomes[i] = Failed
			}
			continue
		}
		ups := make([]*Update, len(idx))
		for j, i := range idx {
			ups[j] = &req.Entries[i].Update
		}
		var logged []*Entry
		outs, err := h.Apply(ups, func(b *store.Batch, outs []Outcome) error {
			for j, i := range idx {
				e := req.Entries[i]
				rest := without(e.Remaining, m.self)
				if outs[j] != Applied {
					continue
				}
				m.mu.Lock()
				old := m.entries[e.Object]
				m.mu.Unlock()
				if len(rest) == 0 {
					// The last remaining replica need not log it (§4.4),
					// but an older entry of ours for the object is now moot.
					if old != nil && old.Stamp.Less(e.Stamp) {
						if err := b.Delete(logKey(old.Object, old.Stamp)); err != nil {
							return err
						}
						logged = append(logged, &Entry{Update: Update{Object: e.Object}})
					}
					continue
				}
				le := &Entry{Update: e.Update, Remaining: rest, Logged: now}
				le.Blob = nil
				if err := m.replaceEntry(b, le); err != nil {
					return err
				}
				logged = append(logged, le)
			}
			return nil
		})
		if err != nil {
			m.log.Warn("pushed updates not applied", "kind", kind, "count", len(ups), "err", err)
			for _, i := range idx {
				out.Outcomes[i] = Failed
			}
			continue
		}
		for j, i := range idx {
			out.Outcomes[i] = outs[j]
		}
		m.install(logged)
	}
	return out, nil
}

// DoneRequest tells the other replicas that an update reached them all.
type DoneRequest struct {
	Objects []string `json:"objects"`
	Stamps  []Stamp  `json:"stamps"`
}

// Done marks entries complete (the coordinator heard from every replica).
func (m *Manager) Done(ctx context.Context, req *DoneRequest) error {
	for i, o := range req.Objects {
		m.mu.Lock()
		e := m.entries[o]
		if e != nil && e.Stamp == req.Stamps[i] && e.Done.IsZero() {
			ne := *e
			ne.Remaining, ne.Done = nil, time.Now()
			m.entries[o] = &ne
		}
		m.mu.Unlock()
	}
	return nil
}

// pushLoop works through the log: updates whose first push failed go out
// when their node is back (catch-up, §4.4), completed entries retire, and
// entries older than MaxAge are dropped.
func (m *Manager) pushLoop() { m.every(pushInterval, m.kick, m.workLog) }

// every runs work each interval, and at once when kick fires (nil: never),
// until Close.
func (m *Manager) every(interval time.Duration, kick <-chan struct{}, work func()) {
	defer m.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		case <-kick:
		}
		work()
	}
}

// alive returns the members in state alive: the ones pushes go to and
// replicas count on.
func (m *Manager) alive() map[cluster.NodeID]bool {
	out := map[cluster.NodeID]bool{}
	if p := m.getPeers(); p != nil {
		for _, mi := range p.Alive() {
			if mi.State == "alive" {
				out[mi.ID] = true
			}
		}
	}
	return out
}

func (m *Manager) workLog() {
	if m.getPeers() == nil {
		return
	}
	alive := m.alive()
	now := time.Now()
	byNode := map[cluster.NodeID][]*Update{}
	var retire []*Entry
	var notify []*Entry
	m.mu.Lock()
	for obj, e := range m.entries {
		age := now.Sub(e.Stamp.Clock.Wall())
		switch {
		case !e.Done.IsZero():
			if now.Sub(e.Done) >= m.RetireDelay {
				retire = append(retire, e)
			}
			continue
		case age > m.MaxAge:
			m.log.Warn("update log entry dropped after the maximum age", "object", obj, "remaining", e.Remaining, "age", age.Round(time.Second))
			retire = append(retire, e)
			continue
		case len(e.Remaining) == 0:
			ne := *e
			ne.Done = now
			m.entries[obj] = &ne
			notify = append(notify, &ne)
			continue
		}
		// A replica that is not the coordinator leaves the entry to a
		// live coordinator for a while (§4.4: any remaining replica can
		// become the coordinator when the first one fails).
		if e.Stamp.Node != m.self && alive[e.Stamp.Node] && now.Sub(e.Logged) < takeoverAfter {
			continue
		}
		for _, n := range e.Remaining {
			if k := pushingKey(obj, n); alive[n] && m.pushing[k] == 0 {
				m.pushing[k]++ // under the lock the check was made under
				u := e.Update
				byNode[n] = append(byNode[n], &u)
			}
		}
	}
	m.mu.Unlock()
	if len(retire) > 0 {
		b := m.db.NewBatch()
		for _, e := range retire {
			b.Delete(logKey(e.Object, e.Stamp))
		}
		b.Commit(store.NoSync)
		b.Close()
		m.mu.Lock()
		for _, e := range retire {
			if cur := m.entries[e.Object]; cur != nil && cur.Stamp == e.Stamp {
				delete(m.entries, e.Object)
			}
		}
		m.mu.Unlock()
	}
	m.notifyDone(notify)
	for n, ups := range byNode {
		sort.Slice(ups, func(i, j int) bool { return ups[i].Stamp.Less(ups[j].Stamp) })
		for len(ups) > 0 {
			k := min(len(ups), pushBatch)
			chunk := ups[:k]
			ups = ups[k:]
			m.wg.Add(1)
			go func(n cluster.NodeID, chunk []*Update) {
				defer m.wg.Done()
				if err := m.push(n, chunk, true); err != nil {
					m.log.Debug("catch-up push failed", "node", n, "err", err)
				}
				m.unmarkPushing(n, chunk)
			}(n, chunk)
		}
	}
}

// pushingKey names a push of an object's updates to a node in m.pushing.
func pushingKey(object string, n cluster.NodeID) string { return object + "\x00" + string(n) }

// markPushing records that ups are being pushed to n.
func (m *Manager) markPushing(n cluster.NodeID, ups []*Update) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range ups {
		m.pushing[pushingKey(u.Object, n)]++
	}
}

// unmarkPushing records that the push of ups to n is over.
func (m *Manager) unmarkPushing(n cluster.NodeID, ups []*Update) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range ups {
		k := pushingKey(u.Object, n)
		if m.pushing[k]--; m.pushing[k] <= 0 {
			delete(m.pushing, k)
		}
	}
}

// notifyDone tells the other targets of entries this node coordinated that
// they are complete, so they do not take them over (only with more than
// two targets: with two, the other target logged nothing).
func (m *Manager) notifyDone(entries []*Entry) {
	peers := m.getPeers()
	byNode := map[cluster.NodeID]*DoneRequest{}
	for _, e := range entries {
		if e.Stamp.Node != m.self || len(e.Targets) <= 2 {
			continue
		}
		for _, n := range without(e.Targets, m.self) {
			r := byNode[n]
			if r == nil {
				r = &DoneRequest{}
				byNode[n] = r
			}
			r.Objects = append(r.Objects, e.Object)
			r.Stamps = append(r.Stamps, e.Stamp)
		}
	}
	for n, r := range byNode {
		go func(n cluster.NodeID, r *DoneRequest) {
			ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
			defer cancel()
			Remote(peers, n).Done(ctx, r)
		}(n, r)
	}
}

// LogStats counts the log's entries: pending ones waiting for a live node,
// ones waiting only for absent nodes, and completed ones not yet retired.
type LogStats struct {
	Pending int `json:"log_pending"`
	Waiting int `json:"log_waiting_absent"`
	Done    int `json:"log_done"`
}

// Stats returns the log's counts.
func (m *Manager) Stats() LogStats {
	alive := m.alive()
	var s LogStats
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		switch {
		case !e.Done.IsZero() || len(e.Remaining) == 0:
			s.Done++
		case slices.ContainsFunc(e.Remaining, func(n cluster.NodeID) bool { return alive[n] }):
			s.Pending++
		default:
			s.Waiting++
		}
	}
	return s
}
