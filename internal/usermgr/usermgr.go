// Package usermgr is the user manager of Porcupine §2.2 and §3.3: the soft
// state of the users whose bucket this node manages in the user map — a
// cached copy of each profile and the mail map, the set of nodes holding
// mailbox fragments of each user. None of it is written to disk. When the
// user map or the set of live nodes changes, the manager of each bucket
// collects, from every live node, what that node's hard state implies for
// the bucket (a bucket-scoped scan of its profiles and fragments) and
// rebuilds the bucket's soft state from the replies.
//
// Any node can ask any question about any user: the question goes to the
// bucket's manager, by RPC when that is another node. User profiles are hard
// state kept on the two nodes ranked highest for the user's bucket, so one
// crash never stops a user from logging in.
//
// The mailbox writers of the bucket's users (internal/writer, Neptune's
// ordered writer) run beside the soft state: the manager opens them when it
// takes a bucket, drops and drains them when the bucket moves away (handing
// their state to the next manager, handoff.go), and resets them when a
// bucket is rebuilt from scratch.
package usermgr

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
)

// Tunables of soft-state reconstruction.
const (
	// ProfileReplicas is how many nodes keep each user profile.
	ProfileReplicas = userdb.ProfileReplicas
	// reconstructWait bounds how long a lookup waits for a bucket whose
	// soft state is being rebuilt before answering from what has arrived.
	reconstructWait = 5 * time.Second
)

var (
	// pullRetry spaces the scans asked again of a node that failed to
	// answer (until it answers or the membership changes; the pull is
	// then started afresh).
	pullRetry = retry.Policy{Base: time.Second, Factor: 1}
	// heldRetry spaces the scans asked again of a node that still
	// manages a bucket this node has taken over (its view of the
	// membership lags): the bucket is not complete until that node has
	// let go of it, so that two writers never serve one user for longer
	// than the membership takes to agree.
	heldRetry = retry.Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second, Factor: 2}
)

// Peers is what the user manager needs of the cluster: its view of the
// members and a way to call them.
type Peers interface {
	UserMap() cluster.UserMap
	Alive() []cluster.MemberInfo
	// Eligible lists the live members that may hold a bucket's users'
	// state, in rank order (cluster.Eligible: with islands, the bucket's
	// island's).
	Eligible(bucket uint8) ([]cluster.MemberInfo, error)
	Domains() map[string]bool
	// Degraded reports whether a member is away and the membership
	// changed recently (cluster.Peers.Degraded): a soft state merged from
	// the live nodes may then miss what only the away one holds.
	Degraded() bool
	// Conn reaches another node's services.
	cluster.Conns
}

// Manager is the node's user manager.
type Manager struct {
	self  cluster.NodeID
	users *userdb.DB
	boxes *mailbox.Manager
	// shared holds the profiles when set (Config.Shared).
	shared SharedProfiles
	clock  *hlc.Clock
	peers  Peers
	// parts and totals cache what domains' users take (domainusage.go).
	parts, totals usageCache
	log           *slog.Logger
	repl          Replicator
	// writers are the mailbox writers of the users of the buckets this
	// node manages.
	writers *writer.Manager

	mu      sync.RWMutex
	buckets [cluster.Buckets]*bucket
	gen     uint64 // bumped at every reconcile; stale pulls are dropped
	closed  bool
	// rebuildGen is the reconcile (gen) whose rebuild of the soft state
	// is being timed, 0 for none; rebuildFrom is when it began
	// (noteRebuiltLocked).
	rebuildFrom time.Time
	rebuildGen  uint64
	pulls       sync.WaitGroup
	// um and alive are what the last reconcile was given, for rebuilds
	// that are not caused by a membership change (Rebuild, handoffs).
	um    cluster.UserMap
	alive []cluster.MemberInfo
	// tenures counts this process's tenures of buckets; ended holds,
	// per bucket, the last of them that ended (the bucket was dropped).
	// A scan reply carries ended, so a manager that later receives a
	// handoff knows whether its soft state was read before or after the
	// sender let go (handoff.go).
	tenures uint64
	ended   [cluster.Buckets]uint64
	// draining counts, per bucket, drops whose writers are still being
	// drained (handoff.go): scans of it are answered Held meanwhile.
	draining [cluster.Buckets]int
	// ctx ends the manager's background work (scans, handoffs, repairs,
	// the audit) at Close.
	ctx    context.Context
	cancel context.CancelFunc
	// leaving is set once Leave handed every bucket over: later
	// membership changes (the node's own view still has it) change
	// nothing.
	leaving bool

	// verified caches, per user, a keyed MAC of the last password that
	// passed the argon2id check against a stored hash, so a client polling
	// every minute does not pay 20 MiB and tens of milliseconds of hashing
	// per login. It is keyed by the hash, not the profile version: the
	// mailbox writer rewrites the profile for its UID reservations, which
	// must not cost a user an argon2id check. The MAC key is random per
	// process: soft state.
	authMu    sync.Mutex
	verified  map[string]verifiedPW
	macKey    [32]byte
	dummyHash string

	domMu       sync.Mutex
	domains     []string
	domainsGood bool

	// lists keeps each node's last answer to the admin API's user
	// listing (listing.go).
	lists cluster.Recall[[]userdb.Profile]
}

type verifiedPW struct {
	hash string // the stored hash the password was checked against
	mac  [32]byte
}

// bucket is the soft state of one bucket this node manages.
type bucket struct {
	contrib  map[cluster.NodeID]uint64 // node -> boot whose scan is merged
	profiles map[string]*userdb.Profile
	holders  map[string]map[cluster.NodeID]bool // user -> nodes whose disk has the newest profile
	mailMap  map[string]map[cluster.NodeID]bool
	ready    chan struct{}
	isReady  bool
	// complete says every live node's scan is in (ready may come earlier,
	// after the readiness cap): until then a user not found may be one
	// whose profile replicas have not answered yet.
	complete bool
	viewGen  uint64 // bumped when the writers' views must be loaded again
	// tenure names this node's tenure of the bucket (handoff.go), and
	// since is when it began.
	tenure uint64
	since  time.Time
	// ended holds, per contributing node, the tenure of this bucket that
	// node had last ended when its merged scan was taken.
	ended map[cluster.NodeID]uint64
}

func newBucket() *bucket {
	return &bucket{contrib: map[cluster.NodeID]uint64{}, profiles: map[string]*userdb.Profile{},
		holders: map[string]map[cluster.NodeID]bool{},
		mailMap: map[string]map[cluster.NodeID]bool{}, ready: make(chan struct{}),
		ended: map[cluster.NodeID]uint64{}}
}

// Replicator is the node's replication manager, as the user manager and
// the writers use it.
type Replicator = writer.Replicator

// Config is what a user manager is made of.
type Config struct {
	Self  cluster.NodeID
	Users *userdb.DB
	Boxes *mailbox.Manager
	Clock *hlc.Clock
	Log   *slog.Logger
	// Repl writes profiles and message changes through the replication
	// manager; Peers reaches the other nodes.
	Repl  Replicator
	Peers Peers
	// Shared, when set, is the store every node reaches (Cassandra,
	// issue 15) that holds the profiles instead of Users: a bucket's soft
	// state is rebuilt from it, profiles are written to it, and there is
	// no mail map (every user's mail is in it). Storage is then the
	// writers' storage over it. Nil for both: the native store.
	Shared  SharedProfiles
	Storage writer.Storage
}

// SharedProfiles is a profile store every node reads and writes
// (cassandra.Store): it replicates by itself, so a profile is written
// once, at its version, and a bucket's profiles are read from it alone.
type SharedProfiles interface {
	ScanProfiles(ctx context.Context, bucket int, fn func(*userdb.Profile) error) error
	AllProfiles(ctx context.Context, fn func(*userdb.Profile) error) error
	PutProfile(ctx context.Context, p *userdb.Profile) error
}

// New returns a user manager with no soft state, and its writers; the soft
// state fills as the membership manager reports the user map (Reconcile).
// Profiles the replication manager applies here reach the soft state.
func New(c Config) *Manager {
	m := &Manager{self: c.Self, users: c.Users, boxes: c.Boxes, shared: c.Shared, clock: c.Clock, log: c.Log,
		repl: c.Repl, peers: c.Peers, verified: map[string]verifiedPW{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	rand.Read(m.macKey[:])
	m.dummyHash, _ = userdb.HashPassword("no such user")
	storage := c.Storage
	if storage == nil {
		storage = writer.NewNative(c.Self, m, c.Boxes, c.Repl, c.Peers, c.Log)
	}
	m.writers = writer.New(c.Self, m, storage, c.Peers, c.Clock, c.Log)
	if c.Users != nil {
		c.Users.OnApply = m.profileApplied
	}
	return m
}

// Writers returns the node's mailbox writers.
func (m *Manager) Writers() *writer.Manager { return m.writers }

// Close stops reconstruction, the writers' background work and the scans
// in flight, so the store can be closed after it.
func (m *Manager) Close() {
	m.writers.Close()
	m.cancel()
	m.mu.Lock()
	m.closed = true
	m.gen++
	m.mu.Unlock()
	m.pulls.Wait()
}

// --- soft-state reconstruction (Porcupine §3.3)

// Reconcile adapts the soft state to a new user map: buckets no longer ours
// are dropped (and handed to their new manager, handoff.go); for buckets
// that are ours, the contributions of nodes that are gone are removed, and
// every live node whose scan is missing is asked for it.
func (m *Manager) Reconcile(um cluster.UserMap, alive []cluster.MemberInfo) {
	m.reconcile(um, alive, nil)
}

// Rebuild throws away the soft state of every bucket this node manages and
// builds it again from every live node's scan, as if each bucket were new
// (the writers stay, their views are loaded again), and forgets the
// allocations made before cutoff (the moment the stall was noticed). A node whose process stood still
// (SIGSTOP, a paused VM) long enough for the others to declare it dead may
// never see its own membership change, yet others managed its buckets
// meanwhile: everything it holds about them is old, and the deliveries it
// had allocated UIDs for confirmed to them.
func (m *Manager) Rebuild(um cluster.UserMap, alive []cluster.MemberInfo, cutoff time.Time) {
	all := map[int]time.Time{}
	for b := 0; b < cluster.Buckets; b++ {
		all[b] = cutoff
	}
	m.reconcile(um, alive, all)
}

// rebuildBuckets rebuilds some buckets under the last user map; each maps
// to the time before which its writers' allocations are forgotten.
func (m *Manager) rebuildBuckets(reset map[int]time.Time) {
	m.mu.RLock()
	um, alive := m.um, m.alive
	m.mu.RUnlock()
	m.reconcile(um, alive, reset)
}

// reconcile applies a user map, rebuilding from scratch the buckets in
// reset, and hands the dropped buckets over.
func (m *Manager) reconcile(um cluster.UserMap, alive []cluster.MemberInfo, reset map[int]time.Time) {
	m.handOff(m.applyMap(um, alive, reset, false))
}

// applyMap does the work of reconcile and returns the buckets it dropped.
// Once the node leaves (leave, from Leave) later maps change nothing: the
// node's own view of the membership still has it.
func (m *Manager) applyMap(um cluster.UserMap, alive []cluster.MemberInfo, reset map[int]time.Time, leave bool) []droppedBucket {
	boot := map[cluster.NodeID]uint64{}
	for _, a := range alive {
		boot[a.ID] = a.Member.Boot
	}
	need := map[cluster.NodeID][]uint8{}
	var dropped []droppedBucket
	m.mu.Lock()
	if m.closed || (m.leaving && !leave) {
		m.mu.Unlock()
		return nil
	}
	m.leaving = m.leaving || leave
	m.gen++
	gen := m.gen
	m.rebuildFrom, m.rebuildGen = time.Now(), gen
	m.um, m.alive = um, slices.Clone(alive)
	for b := 0; b < cluster.Buckets; b++ {
		if um.Node[b] != m.self {
			if bk := m.buckets[b]; bk != nil {
				bk.wake()
				m.draining[b]++ // scans say Held until the writers are drained
				dropped = append(dropped, droppedBucket{b: uint8(b), bk: bk, writers: m.writers.Drop(uint8(b))})
			}
			m.buckets[b] = nil
			continue
		}
		bk := m.buckets[b]
		switch {
		case bk == nil:
			m.tenures++
			bk = newBucket()
			bk.tenure, bk.since = m.tenures, time.Now()
			m.buckets[b] = bk
			m.writers.Open(uint8(b), bk.tenure)
		default:
			cutoff, ok := reset[b]
			if !ok {
				break
			}
			// The same tenure and the same writers (so there is never a
			// second writer for a user), everything else read again.
			nb := newBucket()
			nb.tenure, nb.since, nb.viewGen = bk.tenure, bk.since, bk.viewGen
			bk.wake()
			m.buckets[b] = nb
			bk = nb
			m.writers.Reset(uint8(b), cutoff)
		}
		// Mailbox views depend on which fragments are reachable: rebuild
		// them lazily under the new membership. The writers themselves
		// (their locks and UID counters) stay, so there is never a second
		// writer for a user while an operation of the first is running.
		bk.viewGen++
		for n, nb := range bk.contrib {
			if boot[n] != nb {
				delete(bk.contrib, n)
				delete(bk.ended, n)
				for _, h := range bk.holders {
					delete(h, n)
				}
				for u := range bk.mailMap {
					forgetLocked(bk, u, n)
				}
			}
		}
		for n := range boot {
			if _, ok := bk.contrib[n]; !ok {
				need[n] = append(need[n], uint8(b))
			}
		}
		m.checkReadyLocked(bk, boot)
	}
	m.noteRebuiltLocked()
	m.mu.Unlock()
	for n, buckets := range need {
		m.spawn(func() { m.pull(gen, n, boot[n], buckets, boot) })
	}
	// A bucket whose contributions cannot all be had (a node that does not
	// answer, or one that still manages it) becomes usable anyway after
	// reconstructWait.
	time.AfterFunc(reconstructWait, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.gen != gen {
			return
		}
		if m.rebuildGen == gen {
			metrics.SoftStateRebuildSeconds.WithLabelValues("timeout").Observe(time.Since(m.rebuildFrom).Seconds())
			m.rebuildGen = 0
		}
		for _, bk := range m.buckets {
			if bk != nil && !bk.isReady {
				bk.isReady = true
				close(bk.ready)
			}
		}
	})
	return dropped
}

// spawn runs fn on a goroutine that Close waits for, unless the manager is
// closed (a WaitGroup must not gain work while Close waits on it). It must
// not be called with m.mu held.
func (m *Manager) spawn(fn func()) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return false
	}
	m.pulls.Add(1)
	go func() {
		defer m.pulls.Done()
		fn()
	}()
	return true
}

// wake releases whoever waits for the bucket's rebuild: they find the
// bucket gone or replaced and look again (managed).
func (bk *bucket) wake() {
	if !bk.isReady {
		bk.isReady = true
		close(bk.ready)
	}
}

// noteRebuiltLocked times the reconcile under way once every bucket this
// node manages has the scan of every node it was given as alive
// (quill_softstate_rebuild_seconds); a reconcile that leaves the node no
// bucket is not timed. m.mu is held.
func (m *Manager) noteRebuiltLocked() {
	if m.rebuildGen != m.gen {
		return
	}
	managed := 0
	for _, bk := range m.buckets {
		if bk == nil {
			continue
		}
		for _, a := range m.alive {
			if _, ok := bk.contrib[a.ID]; !ok {
				return
			}
		}
		managed++
	}
	if managed > 0 {
		metrics.SoftStateRebuildSeconds.WithLabelValues("complete").Observe(time.Since(m.rebuildFrom).Seconds())
	}
	m.rebuildGen = 0
}

func (m *Manager) checkReadyLocked(bk *bucket, boot map[cluster.NodeID]uint64) {
	for n := range boot {
		if _, ok := bk.contrib[n]; !ok {
			return
		}
	}
	if !bk.isReady {
		bk.isReady = true
		close(bk.ready)
	}
	bk.complete = true
	// Every live node's scan is in: profiles with fewer than
	// ProfileReplicas live copies where they belong (the bucket's island)
	// get copied again (a node that died, or came back with an empty
	// disk, took a copy with it; an island table change moved the user).
	var repair []userdb.Profile
	var eligible []cluster.NodeID
	for u, p := range bk.profiles {
		if m.shared != nil {
			break // the shared store keeps its own copies
		}
		if eligible == nil {
			ms, _ := m.peers.Eligible(cluster.Bucket(u)) // none: its island is down, nothing to copy to
			eligible = cluster.EligibleIDs(ms)
		}
		if ProfileShort(bk.holders[u], eligible) {
			repair = append(repair, *p)
		}
	}
	if len(repair) > 0 {
		m.pulls.Add(1)
		go func() {
			defer m.pulls.Done()
			for i := range repair {
				ctx, cancel := context.WithTimeout(m.ctx, rpc.DefaultTimeout)
				if err := m.writeProfile(ctx, &repair[i]); err != nil {
					m.log.Warn("profile re-replication failed", "user", repair[i].Address, "err", err)
				}
				cancel()
			}
		}()
	}
}

// ScanRequest asks a node for what its hard state implies for buckets.
type ScanRequest struct {
	Buckets []uint8 `json:"buckets"`
	// From is the manager asking (taking the buckets over).
	From cluster.NodeID `json:"from,omitempty"`
}

// ScanReply is one node's contribution: the profiles it stores and the
// users it holds mail for, in the requested buckets.
type ScanReply struct {
	Node      cluster.NodeID   `json:"node"`
	Boot      uint64           `json:"boot"`
	Profiles  []userdb.Profile `json:"profiles"`
	Fragments []string         `json:"fragments"`
	// Held are requested buckets this node still manages (its view of
	// the membership has not caught up): their part of the scan may still
	// change, so it is not final; ask again.
	Held []uint8 `json:"held,omitempty"`
	// Ended is, for each scanned bucket in request order, this node's
	// last ended tenure of it (0: none).
	Ended []uint64 `json:"ended,omitempty"`
}

// Scan is the bucket-scoped disk scan every node runs for a manager. A
// bucket this node still manages for itself is reported Held: until it
// lets go, its writers may still change what a scan would say.
func (m *Manager) Scan(ctx context.Context, req *ScanRequest) (*ScanReply, error) {
	out := &ScanReply{Node: m.self}
	m.mu.RLock()
	for _, b := range req.Buckets {
		if req.From != "" && req.From != m.self && (m.buckets[b] != nil || m.draining[b] > 0) {
			out.Held = append(out.Held, b)
			continue
		}
		out.Ended = append(out.Ended, m.ended[b])
	}
	m.mu.RUnlock()
	if m.shared != nil {
		// Every node reads the same profiles from the shared store; it
		// holds all mail, so there are no fragments to report.
		return out, m.scanShared(ctx, req.Buckets, func(p *userdb.Profile) { out.Profiles = append(out.Profiles, *p) })
	}
	for _, b := range req.Buckets {
		if err := m.users.Scan(int(b), func(p *userdb.Profile) error {
			out.Profiles = append(out.Profiles, *p)
			return nil
		}); err != nil {
			return nil, err
		}
		if err := m.boxes.FragmentUsers(int(b), func(user string, n int) error {
			if n > 0 {
				out.Fragments = append(out.Fragments, user)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sharedScanAllFrom is how many buckets a scan of the shared store must
// ask for to read the whole users table in one paged scan rather than
// each bucket's partitions (16 reads a bucket): a node that starts alone
// asks for all 256 buckets, 4,096 reads one after the other, which took
// longer than the soft state's readiness wait.
const sharedScanAllFrom = 16

// scanShared calls fn with the shared store's profiles of buckets.
func (m *Manager) scanShared(ctx context.Context, buckets []uint8, fn func(*userdb.Profile)) error {
	if len(buckets) >= sharedScanAllFrom {
		want := map[uint8]bool{}
		for _, b := range buckets {
			want[b] = true
		}
		return m.shared.AllProfiles(ctx, func(p *userdb.Profile) error {
			if want[cluster.Bucket(p.Address)] {
				fn(p)
			}
			return nil
		})
	}
	for _, b := range buckets {
		if err := m.shared.ScanProfiles(ctx, int(b), func(p *userdb.Profile) error {
			fn(p)
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) pull(gen uint64, n cluster.NodeID, boot uint64, buckets []uint8, alive map[cluster.NodeID]uint64) {
	failed, held := 0, 0
	for len(buckets) > 0 {
		if m.closedOrStale(gen) {
			return
		}
		var rep ScanReply
		var err error
		req := &ScanRequest{Buckets: buckets, From: m.self}
		if n == m.self {
			var r *ScanReply
			r, err = m.Scan(m.ctx, req)
			if r != nil {
				rep = *r
			}
		} else {
			ctx, cancel := context.WithTimeout(m.ctx, rpc.DefaultTimeout)
			var r *ScanReply
			r, err = m.on(n).Scan(ctx, req)
			cancel()
			if r != nil {
				rep = *r
			}
		}
		if err != nil {
			m.log.Warn("soft-state scan failed, retrying", "node", n, "buckets", len(buckets), "err", err)
			if !retry.Sleep(m.ctx, pullRetry.Wait(failed)) {
				return
			}
			failed++
			continue
		}
		if m.closedOrStale(gen) {
			return
		}
		final := make([]uint8, 0, len(buckets))
		for _, b := range buckets {
			if !slices.Contains(rep.Held, b) {
				final = append(final, b)
			}
		}
		if len(rep.Ended) != len(final) {
			rep.Ended = make([]uint64, len(final)) // an older node: no tenures
		}
		// Held buckets' data is merged too (a bucket served before the
		// holder lets go, after reconstructWait, then misses little), but
		// is not the node's contribution yet.
		m.merge(gen, n, boot, final, &rep, alive)
		if len(rep.Held) > 0 {
			if !retry.Sleep(m.ctx, heldRetry.Wait(held)) {
				return
			}
			held++
		}
		buckets = rep.Held
	}
}

func (m *Manager) closedOrStale(gen uint64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.closed || m.gen != gen
}

// merge takes a scan reply into the soft state; buckets are those for which
// it is the node's final contribution.
func (m *Manager) merge(gen uint64, n cluster.NodeID, boot uint64, buckets []uint8, rep *ScanReply, alive map[cluster.NodeID]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen {
		return
	}
	for i := range rep.Profiles {
		p := rep.Profiles[i]
		m.clock.Observe(p.Version)
		if bk := m.buckets[cluster.Bucket(p.Address)]; bk != nil {
			cur, ok := bk.profiles[p.Address]
			switch {
			case !ok || cur.Version < p.Version:
				bk.profiles[p.Address] = &p
				bk.holders[p.Address] = map[cluster.NodeID]bool{n: true}
			case cur.Version == p.Version:
				bk.holders[p.Address][n] = true
			}
		}
	}
	for _, u := range rep.Fragments {
		if bk := m.buckets[cluster.Bucket(u)]; bk != nil {
			if bk.isReady && !bk.mailMap[u][n] {
				// A fragment the mail map did not know of (a store whose
				// confirmation never came, such as a failed delivery
				// attempt kept by its coordinator): the views must read
				// it, or its messages stay hidden and their UIDs may
				// clash with later ones, which replicas then refuse.
				bk.viewGen++
			}
			noteLocked(bk, u, n)
		}
	}
	for i, b := range buckets {
		if bk := m.buckets[b]; bk != nil {
			bk.contrib[n] = boot
			bk.ended[n] = rep.Ended[i]
			m.checkReadyLocked(bk, alive)
		}
	}
	m.noteRebuiltLocked()
	// Mail of deleted users, in the buckets this merge leaves complete:
	// whichever node's scan came last, every fragment is known by now.
	drops := map[cluster.NodeID][]string{}
	for _, b := range buckets {
		bk := m.buckets[b]
		if bk == nil || !bk.isReady {
			continue
		}
		for u, nodes := range bk.mailMap {
			if p, ok := bk.profiles[u]; ok && p.Deleted {
				for nd := range nodes {
					drops[nd] = append(drops[nd], u)
				}
			}
		}
	}
	for nd, users := range drops {
		m.pulls.Add(1)
		go func() {
			defer m.pulls.Done()
			m.dropDeleted(nd, users)
		}()
	}
}

// dropDeleted removes from node n the mail of users whose profile is a
// tombstone: a node that was down when a user was deleted comes back with
// the user's fragments (and update logs may push a message of the user
// after the deletion). The manager finds them in its scans and drops them,
// but not while the membership is degraded: the tombstone must be the
// newest profile of the address, not an old one standing in for a
// re-created user whose profile replicas are away (once they have been
// away for the degraded window, repair has copied profiles elsewhere).
func (m *Manager) dropDeleted(n cluster.NodeID, users []string) {
	if m.peers.Degraded() {
		return
	}
	for _, u := range users {
		ctx, cancel := context.WithTimeout(m.ctx, rpc.DefaultTimeout)
		err := m.boxes.On(m.peers, n).DropUser(ctx, &mailbox.FragmentRequest{User: u})
		cancel()
		if err != nil {
			m.log.Warn("mail of a deleted user left on a node: could not drop it", "user", u, "node", n, "err", err)
			continue
		}
		m.log.Info("mail of a deleted user left on a node: dropped", "user", u, "node", n)
		m.mu.Lock()
		if bk := m.buckets[cluster.Bucket(u)]; bk != nil {
			forgetLocked(bk, u, n)
		}
		m.mu.Unlock()
	}
}

func noteLocked(bk *bucket, user string, n cluster.NodeID) {
	s := bk.mailMap[user]
	if s == nil {
		s = map[cluster.NodeID]bool{}
		bk.mailMap[user] = s
	}
	s[n] = true
}

// forgetLocked takes n out of the user's mail map; a user whose map
// empties has none, as after a rebuild.
func forgetLocked(bk *bucket, user string, n cluster.NodeID) {
	delete(bk.mailMap[user], n)
	if len(bk.mailMap[user]) == 0 {
		delete(bk.mailMap, user)
	}
}

// RefreshInterval is how often a manager asks every live node again for
// the scan of its buckets, merging what it learns into the soft state
// without making the buckets wait. It closes the window in which a node
// stored mail while its user map and the manager's briefly disagreed, and
// its mail-map note went to the old manager.
const RefreshInterval = time.Minute

// Refresh asks every live node for a scan of the buckets this node manages
// and merges the replies into the current soft state.
func (m *Manager) Refresh(alive []cluster.MemberInfo) {
	boot := map[cluster.NodeID]uint64{}
	for _, a := range alive {
		boot[a.ID] = a.Member.Boot
	}
	m.mu.RLock()
	gen := m.gen
	var mine []uint8
	for b, bk := range m.buckets {
		// An incomplete bucket has pulls of its own still retrying.
		if bk != nil && bk.complete {
			mine = append(mine, uint8(b))
		}
	}
	m.mu.RUnlock()
	if len(mine) == 0 {
		return
	}
	for n, nb := range boot {
		m.spawn(func() { m.pull(gen, n, nb, mine, boot) })
	}
}

// Reconstruction reports how many buckets this node manages and how many of
// them have their soft state rebuilt from every live node's scan.
func (m *Manager) Reconstruction() (managed, ready int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, bk := range m.buckets {
		if bk != nil {
			managed++
			if bk.isReady {
				ready++
			}
		}
	}
	return managed, ready
}

// --- the manager's side: questions about users of our buckets

// LookupRequest asks a bucket's manager about a user.
type LookupRequest struct {
	User string `json:"user"`
}

// LookupReply is the manager's soft state for a user.
type LookupReply struct {
	Profile *userdb.Profile  `json:"profile,omitempty"`
	MailMap []cluster.NodeID `json:"mail_map"`
}

// managed returns our soft state of the user's bucket, waiting for its
// reconstruction if it is under way.
func (m *Manager) managed(ctx context.Context, user string) (*bucket, error) {
	b := cluster.Bucket(user)
	for {
		m.mu.RLock()
		bk := m.buckets[b]
		m.mu.RUnlock()
		if bk == nil {
			return nil, fmt.Errorf("bucket %d of %s on %s: %w", b, user, m.self, rpc.ErrNotManager)
		}
		select {
		case <-bk.ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("bucket %d: soft state not rebuilt yet: %w", b, ctx.Err())
		}
		m.mu.RLock()
		still := m.buckets[b] == bk
		m.mu.RUnlock()
		if still {
			return bk, nil
		}
		// The bucket was dropped while we waited (the user map moved it,
		// perhaps back again as a new bucket): look again.
	}
}

// lookup answers a lookup for a user of a bucket this node manages.
func (m *Manager) lookup(ctx context.Context, req *LookupRequest) (*LookupReply, error) {
	user := userdb.Normalize(req.User)
	bk, err := m.managed(ctx, user)
	if err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := &LookupReply{}
	if p, ok := bk.profiles[user]; ok && !p.Deleted {
		cp := *p
		out.Profile = &cp
	} else if !ok && !bk.complete {
		// Not "no such user" (a 550 bounce) while a node that may hold
		// the profile has not been heard: a temporary failure instead.
		return nil, fmt.Errorf("user %s: bucket %d soft state incomplete: %w", user, cluster.Bucket(user), rpc.ErrUnavailable)
	}
	for n := range bk.mailMap[user] {
		out.MailMap = append(out.MailMap, n)
	}
	sort.Slice(out.MailMap, func(i, j int) bool { return out.MailMap[i] < out.MailMap[j] })
	return out, nil
}

// NoteRequest tells a manager that a node stores mail of a user.
type NoteRequest struct {
	User string         `json:"user"`
	Node cluster.NodeID `json:"node"`
}

// note records a fragment in the mail map of a user we manage.
func (m *Manager) note(ctx context.Context, req *NoteRequest) error {
	user := userdb.Normalize(req.User)
	bk, err := m.managed(ctx, user)
	if err != nil {
		return err
	}
	m.mu.Lock()
	noteLocked(bk, user, req.Node)
	m.mu.Unlock()
	return nil
}

// UpdateRequest carries a new version of a profile.
type UpdateRequest struct {
	Profile userdb.Profile `json:"profile"`
}

// update merges a profile version into the soft state if we manage its
// bucket (ignored otherwise: the next reconstruction will find it on disk).
func (m *Manager) update(req *UpdateRequest) error {
	p := req.Profile
	m.clock.Observe(p.Version)
	m.mu.Lock()
	if bk := m.buckets[cluster.Bucket(p.Address)]; bk != nil {
		if cur, ok := bk.profiles[p.Address]; !ok || cur.Version < p.Version {
			bk.profiles[p.Address] = &p
			bk.holders[p.Address] = map[cluster.NodeID]bool{}
		}
	}
	m.mu.Unlock()
	return nil
}

// ListReply is the profiles of the buckets a node manages.
type ListReply struct {
	Profiles []userdb.Profile `json:"profiles"`
}

// list returns the live profiles of the buckets we manage.
func (m *Manager) list(ctx context.Context) (*ListReply, error) {
	out := &ListReply{}
	m.mu.RLock()
	var waits []chan struct{}
	for _, bk := range m.buckets {
		if bk != nil {
			waits = append(waits, bk.ready)
		}
	}
	m.mu.RUnlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return nil, fmt.Errorf("list users: soft state not rebuilt yet: %w", ctx.Err())
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, bk := range m.buckets {
		if bk == nil {
			continue
		}
		for _, p := range bk.profiles {
			if !p.Deleted {
				cp := *p
				cp.PasswordHash, cp.SCRAMSHA256 = "", ""
				out.Profiles = append(out.Profiles, cp)
			}
		}
	}
	return out, nil
}

// ManagedUsers counts the live profiles of the buckets this node manages.
func (m *Manager) ManagedUsers() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for _, bk := range m.buckets {
		if bk == nil {
			continue
		}
		for _, p := range bk.profiles {
			if !p.Deleted {
				n++
			}
		}
	}
	return n
}

// --- any node's side: asking the manager

// Lookup returns a user's profile and mail map from the user's manager.
func (m *Manager) Lookup(ctx context.Context, addr string) (*userdb.Profile, []cluster.NodeID, error) {
	addr = userdb.Normalize(addr)
	rep, err := onManager(ctx, m, addr, func(ctx context.Context, s Service) (*LookupReply, error) {
		return s.Lookup(ctx, &LookupRequest{User: addr})
	})
	if err != nil {
		return nil, nil, fmt.Errorf("user %s: %w", addr, err)
	}
	if rep.Profile == nil {
		return nil, rep.MailMap, fmt.Errorf("user %s: %w", addr, userdb.ErrNotFound)
	}
	return rep.Profile, rep.MailMap, nil
}

// MailHolders asks every live node whether it holds any of the user's
// mail: the hard state the mail map stands for, which the admin API shows
// beside it. Nil on the shared store, which holds every user's mail.
func (m *Manager) MailHolders(ctx context.Context, addr string) ([]cluster.NodeID, error) {
	if m.shared != nil {
		return nil, nil
	}
	addr = userdb.Normalize(addr)
	var ids []cluster.NodeID
	for _, a := range m.peers.Alive() {
		ids = append(ids, a.ID)
	}
	// One question to every live node at once, each bounded (the admin
	// API's fan-out); nothing is recalled between calls.
	var ask cluster.Recall[bool]
	answers := ask.Ask(ctx, ids, rpc.DefaultTimeout, func(cctx context.Context, n cluster.NodeID) (bool, error) {
		rep, err := m.boxes.On(m.peers, n).Audit(cctx, &mailbox.AuditRequest{Users: []string{addr}})
		if err == nil && !rep.UsersAnswered {
			err = errors.New("the node is too old to say which users it holds mail of")
		}
		return err == nil && len(rep.Users) > 0, err
	})
	var out []cluster.NodeID
	for _, a := range answers {
		if a.Err != nil {
			return nil, fmt.Errorf("user %s: does node %s hold mail of it: %w", addr, a.Node, a.Err)
		}
		if a.Value {
			out = append(out, a.Node)
		}
	}
	slices.Sort(out)
	return out, nil
}

// ServesDomain reports whether any user lives in the domain, anywhere in the
// cluster: the domains of the users are the domains we accept mail for.
func (m *Manager) ServesDomain(domain string) bool {
	return m.peers.Domains()[userdb.Normalize(domain)]
}

// LocalDomains returns the domains of the live profiles stored on this node,
// for gossip.
func (m *Manager) LocalDomains() []string {
	m.domMu.Lock()
	defer m.domMu.Unlock()
	if m.domainsGood {
		return m.domains
	}
	set := map[string]bool{}
	note := func(p *userdb.Profile) error {
		if !p.Deleted {
			set[p.Domain()] = true
		}
		return nil
	}
	if m.shared != nil {
		// Every node sees every profile of the shared store.
		ctx, cancel := context.WithTimeout(m.ctx, sharedScanTimeout)
		err := m.shared.AllProfiles(ctx, note)
		cancel()
		if err != nil {
			m.log.Warn("domains of the shared store's profiles not read; the last ones are gossiped", "err", err)
			return m.domains
		}
	} else {
		m.users.Scan(-1, note)
	}
	m.domains = m.domains[:0]
	for d := range set {
		m.domains = append(m.domains, d)
	}
	sort.Strings(m.domains)
	m.domainsGood = true
	return m.domains
}

// Authenticate checks a user's password. The error names the user and says
// whether the user is unknown or the password wrong; protocol servers must
// not pass that difference on to the client.
func (m *Manager) Authenticate(ctx context.Context, addr, password string) (*userdb.Profile, error) {
	addr = userdb.Normalize(addr)
	p, _, err := m.Lookup(ctx, addr)
	if errors.Is(err, userdb.ErrNotFound) {
		// The same work as for a real user, so timing does not tell
		// which addresses exist.
		if cerr := userdb.CheckPassword(ctx, m.dummyHash, password); errors.Is(cerr, userdb.ErrBusy) {
			return nil, cerr
		}
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	mac := m.mac(addr, password)
	m.authMu.Lock()
	v, hit := m.verified[addr]
	m.authMu.Unlock()
	if hit && v.hash == p.PasswordHash && hmac.Equal(v.mac[:], mac[:]) {
		if p.SCRAMSHA256 == "" { // an earlier attempt to add them failed
			m.addSCRAMKeys(ctx, p, password)
		}
		return p, nil
	}
	if err := userdb.CheckPassword(ctx, p.PasswordHash, password); err != nil {
		return nil, fmt.Errorf("user %s: %w", addr, err)
	}
	m.authMu.Lock()
	m.verified[addr] = verifiedPW{hash: p.PasswordHash, mac: mac}
	m.authMu.Unlock()
	if p.SCRAMSHA256 == "" {
		m.addSCRAMKeys(ctx, p, password)
	}
	return p, nil
}

// scramUpgradeTimeout bounds the profile write that adds SCRAM keys during
// a login: the login does not wait longer for what is only a convenience.
const scramUpgradeTimeout = 2 * time.Second

// addSCRAMKeys gives a user whose password was set before Quill derived
// SCRAM keys those keys, now that a login has shown the password, so their
// next login may use SCRAM-SHA-256. Best effort: a failure only leaves the
// user without SCRAM until the next password login.
func (m *Manager) addSCRAMKeys(ctx context.Context, p *userdb.Profile, password string) {
	keys, err := userdb.DeriveSCRAM(password)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, scramUpgradeTimeout)
	defer cancel()
	_, err = m.writers.For(p.Address).Apply(ctx, &writer.ApplyRequest{Op: "scram", Address: p.Address, Hash: p.PasswordHash, SCRAM: keys})
	if err != nil {
		m.log.Info("user: could not add SCRAM keys at login", "user", p.Address, "err", err)
	}
}

func (m *Manager) mac(user, password string) [32]byte {
	h := hmac.New(sha256.New, m.macKey[:])
	h.Write([]byte(user))
	h.Write([]byte{0})
	h.Write([]byte(password))
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// writeProfile stores a profile version on the ProfileReplicas nodes ranked
// highest for its bucket and tells the bucket's manager. It fails unless
// every chosen replica has it durably, so a profile that was acknowledged
// survives one crash.
func (m *Manager) writeProfile(ctx context.Context, p *userdb.Profile) error {
	return m.writeProfileAcks(ctx, p, ProfileReplicas)
}

// writeProfileAcks stores a profile version on the ProfileReplicas nodes
// ranked highest for its bucket and fails unless at least minAcks of them
// have it durably.
func (m *Manager) writeProfileAcks(ctx context.Context, p *userdb.Profile, minAcks int) error {
	if m.shared != nil {
		return m.writeShared(ctx, p)
	}
	eligible, err := m.peers.Eligible(cluster.Bucket(p.Address))
	if err != nil {
		return fmt.Errorf("user %s: store profile: %w", p.Address, err)
	}
	targets := ProfileTargets(cluster.EligibleIDs(eligible))
	data, err := p.Encode()
	if err != nil {
		return err
	}
	// The profile's replicas are written through the replication manager
	// (Porcupine §4.1: profiles are replicated like messages), stamped with
	// the profile's own HLC version so the two orders agree.
	policy := replica.One
	if minAcks >= ProfileReplicas {
		policy = replica.All
	}
	u := &replica.Update{Object: userdb.ObjectName(p.Address), Stamp: replica.Stamp{Clock: p.Version, Node: m.self},
		Targets: targets, Data: data}
	rep, err := m.repl.Write(ctx, &replica.WriteRequest{Updates: []*replica.Update{u}, Policy: policy})
	if rep != nil {
		m.mu.Lock()
		if bk := m.buckets[cluster.Bucket(p.Address)]; bk != nil {
			if cur, ok := bk.profiles[p.Address]; ok && cur.Version == p.Version {
				if bk.holders[p.Address] == nil {
					bk.holders[p.Address] = map[cluster.NodeID]bool{}
				}
				for _, n := range rep.Acked {
					bk.holders[p.Address][n] = true
				}
			}
		}
		m.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("user %s: store profile: %w", p.Address, err)
	}
	req := &UpdateRequest{Profile: *p}
	_, err = onManager(ctx, m, p.Address, func(ctx context.Context, s Service) (struct{}, error) {
		return struct{}{}, s.Update(ctx, req)
	})
	return err
}

// writeShared writes a profile version to the shared store (at its own
// version, so the newest wins there as on native replicas) and tells the
// bucket's manager, as writeProfileAcks does for the native store.
func (m *Manager) writeShared(ctx context.Context, p *userdb.Profile) error {
	if err := m.shared.PutProfile(ctx, p); err != nil {
		return fmt.Errorf("user %s: store profile: %w", p.Address, err)
	}
	m.clock.Observe(p.Version)
	m.domMu.Lock()
	m.domainsGood = false
	m.domMu.Unlock()
	req := &UpdateRequest{Profile: *p}
	_, err := onManager(ctx, m, p.Address, func(ctx context.Context, s Service) (struct{}, error) {
		return struct{}{}, s.Update(ctx, req)
	})
	return err
}

// sharedScanTimeout bounds reading every profile of the shared store for
// the domains this node gossips.
const sharedScanTimeout = 30 * time.Second

// profileApplied hears of a profile the replication manager wrote here.
func (m *Manager) profileApplied(p *userdb.Profile) {
	m.clock.Observe(p.Version)
	m.domMu.Lock()
	m.domainsGood = false
	m.domMu.Unlock()
	m.update(&UpdateRequest{Profile: *p})
}

// AddUser creates a user: its manager writes the profile, with the default
// mailboxes, to the profile's replicas (hard state) and its soft state.
func (m *Manager) AddUser(ctx context.Context, addr, password string) (*userdb.Profile, error) {
	addr = userdb.Normalize(addr)
	if err := userdb.ValidateNewAddress(addr); err != nil {
		return nil, err
	}
	hash, keys, err := hashAndKeys(password)
	if err != nil {
		return nil, fmt.Errorf("user %s: %w", addr, err)
	}
	return m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "add", Address: addr, Hash: hash, SCRAM: keys})
}

// SetPassword changes a user's password. The hash is computed here, on the
// node that took the request; the manager only stores it.
func (m *Manager) SetPassword(ctx context.Context, addr, password string) error {
	hash, keys, err := hashAndKeys(password)
	if err != nil {
		return fmt.Errorf("user %s: %w", userdb.Normalize(addr), err)
	}
	_, err = m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "passwd", Address: addr, Hash: hash, SCRAM: keys})
	return err
}

// hashAndKeys derives what a profile keeps of a password: its argon2id
// hash and its SCRAM-SHA-256 keys.
func hashAndKeys(password string) (hash, keys string, err error) {
	if hash, err = userdb.HashPassword(password); err != nil {
		return "", "", err
	}
	if keys, err = userdb.DeriveSCRAM(password); err != nil {
		return "", "", err
	}
	return hash, keys, nil
}

// maxReplicas bounds a user's replica count: more copies than this cost
// disk and delivery time for no availability a cluster of this kind needs.
const maxReplicas = 5

// SetReplication sets how many copies of a user's messages the cluster
// keeps and how many must be durable before delivery is acknowledged; 0 and
// "" go back to the cluster's defaults. New mail follows the new settings.
func (m *Manager) SetReplication(ctx context.Context, addr string, replicas int, policy string) error {
	addr = userdb.Normalize(addr)
	if replicas < 0 || replicas > maxReplicas {
		return fmt.Errorf("user %s: replicas %d: want 0 (cluster default) to %d", addr, replicas, maxReplicas)
	}
	pol, err := replica.ParsePolicy(policy)
	if err != nil {
		return fmt.Errorf("user %s: %w", addr, err)
	}
	_, err = m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "replication", Address: addr, Replicas: replicas, Policy: string(pol)})
	return err
}

// maxSpread bounds a user's spread: past the size of any cluster Quill
// runs, a larger number means the same (every node) and is more likely a
// typing mistake.
const maxSpread = 1000

// SetSpread sets over how many nodes a user's mail may spread (Porcupine
// §5: the balancer stores a new message on the nodes already holding the
// user's mail plus random others up to this many); 0 goes back to the
// cluster's --spread. New mail follows it; mail already stored stays.
func (m *Manager) SetSpread(ctx context.Context, addr string, spread int) error {
	addr = userdb.Normalize(addr)
	if spread < 0 || spread > maxSpread {
		return fmt.Errorf("user %s: spread %d: want 0 (cluster default) to %d", addr, spread, maxSpread)
	}
	_, err := m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "spread", Address: addr, Spread: spread})
	return err
}

// SetQuota sets a user's quota limits (RFC 9208's STORAGE, in bytes, and
// MESSAGE): delivery, APPEND and COPY that would pass them are refused; 0
// is no limit. Sessions open at the time apply them from their next login.
func (m *Manager) SetQuota(ctx context.Context, addr string, storage, messages int64) error {
	addr = userdb.Normalize(addr)
	if storage < 0 || messages < 0 {
		return fmt.Errorf("user %s: quota of %d bytes and %d messages: limits cannot be negative", addr, storage, messages)
	}
	_, err := m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "quota", Address: addr, QuotaStorage: storage, QuotaMessages: messages})
	return err
}

// SetAdmin lets a user sign in to the admin console with their password,
// or stops them.
func (m *Manager) SetAdmin(ctx context.Context, addr string, on bool) error {
	addr = userdb.Normalize(addr)
	_, err := m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "admin", Address: addr, Admin: on})
	return err
}

// Usage returns what a user's mail takes over all mailboxes, and their
// quota limits.
func (m *Manager) Usage(ctx context.Context, addr string) (mailbox.Usage, error) {
	addr = userdb.Normalize(addr)
	rep, err := m.writers.For(addr).Mailboxes(ctx, &writer.MailboxRequest{User: addr, UsageAll: true})
	if err != nil {
		return mailbox.Usage{}, fmt.Errorf("user %s: usage: %w", addr, err)
	}
	return rep.Usage, nil
}

// DeleteUser replaces a user's profile by a tombstone and removes the
// user's fragments from every node in the mail map.
func (m *Manager) DeleteUser(ctx context.Context, addr string) error {
	_, err := m.writers.For(addr).Apply(ctx, &writer.ApplyRequest{Op: "delete", Address: addr})
	return err
}

// ProfileTargets returns the nodes a profile is written to: the
// ProfileReplicas highest ranked of the nodes that may hold it (eligible,
// in rank order: cluster.Eligible, with islands the bucket's island's).
func ProfileTargets(eligible []cluster.NodeID) []cluster.NodeID {
	return slices.Clone(eligible[:min(len(eligible), ProfileReplicas)])
}

// ProfileShort says whether a profile held by holders has fewer copies
// where it belongs than it should: fewer than ProfileReplicas (or than
// the eligible nodes, if fewer) among the eligible nodes. A copy outside
// them (another island's node, after an island table change) does not
// count, so the profile is written again into its island.
func ProfileShort(holders map[cluster.NodeID]bool, eligible []cluster.NodeID) bool {
	in := 0
	for _, n := range eligible {
		if holders[n] {
			in++
		}
	}
	return in < min(ProfileReplicas, len(eligible))
}
