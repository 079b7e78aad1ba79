package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/rpc"
)

// Membership tunables. Porcupine's own protocol took ~10 s to settle a new
// membership on 30 nodes (§6.4); memberlist's SWIM on a LAN detects a dead
// node in a few probe intervals.
const (
	// RejoinInterval is how often a node tries to join seeds and members it
	// believes dead. memberlist never reconnects to a node it declared
	// dead, so without this two halves of a healed partition stay apart.
	RejoinInterval = 5 * time.Second
	// metaUpdateInterval is how often the node re-gossips its load when it
	// changed.
	metaUpdateInterval = 2 * time.Second
	// leaveTimeout bounds the graceful leave broadcast at shutdown.
	leaveTimeout = 2 * time.Second
	// knownJoinWait is how long Start waits for one remembered member to
	// answer before going on alone: long enough for a live peer on a LAN,
	// short enough that a node whose peers are all down still starts.
	// The other attempts go on in the background.
	knownJoinWait = 2 * time.Second
	// pushPullInterval is how often two nodes exchange their shared state
	// (the domains they hold users for); memberlist's LAN default is 30 s.
	pushPullInterval = 5 * time.Second
)

// DetectionTime is how long, at most, the membership of a cluster of n
// members takes from one member's failure (a crash, a pause, a cut cable)
// to every other member having declared it dead, and so having moved its
// buckets, as memberlist's LAN settings (DefaultLANConfig, which
// StartMembership keeps) make it when no node is overloaded:
//
//   - each member probes the others one per ProbeInterval in a shuffled
//     round, so the failed one is probed within 2(n-1)-1 intervals (last of
//     one round, first but one of the next);
//   - a probe (direct, then through other members) takes one interval;
//   - the failed member is then suspect for SuspicionMult x max(1, log10 n)
//     intervals (with enough members to confirm it, memberlist starts the
//     suspicion longer and shortens it to that as the others' own probes,
//     which come within the same rounds, confirm it);
//   - the dead notice reaches the others by gossip within two gossip
//     intervals.
//
// Lifeguard stretches the probes of a node whose own probes go unanswered
// (memberlist's awareness, up to 8 times): on an overloaded node detection
// takes longer than this. Measured on 3 nodes: 5.2-7.0 s (docs/cluster.md),
// against 8.4 s here.
func DetectionTime(n int) time.Duration {
	c := memberlist.DefaultLANConfig()
	n = max(n, 2)
	round := time.Duration(2*(n-1)-1) * c.ProbeInterval
	suspect := time.Duration(float64(c.SuspicionMult) * math.Max(1, math.Log10(float64(n))) * float64(c.ProbeInterval))
	return round + c.ProbeInterval + suspect + 2*c.GossipInterval
}

// NodeMeta is what a node gossips about itself (memberlist meta, at most 512
// bytes).
type NodeMeta struct {
	Boot     uint64 `json:"b"`
	RPC      string `json:"r"`           // node-to-node RPC address
	Load     int    `json:"l"`           // pending disk operations (Porcupine §5)
	DiskFull bool   `json:"f,omitempty"` // no room for new mail
	// Wide is the digest of the clusterwide objects the node holds
	// (clusterwide.Store.Digest): a peer with another digest is caught up.
	Wide uint64 `json:"w,omitempty"`
	// Held and Messages are the message bytes and copies the node holds
	// (its last scan, internal/rebalance): every node needs every
	// other's to rebalance, and gossip carries them in a few bytes of the
	// meta it sends anyway, where asking each node would be n² calls.
	// HeldKnown says the node has scanned since it started: before, its
	// zero figures would pass for an empty node's.
	Held      int64 `json:"h,omitempty"`
	Messages  int   `json:"m,omitempty"`
	HeldKnown bool  `json:"k,omitempty"`
	// Island is the node's island (quill serve --island); empty is
	// island.Default, so a node without islands gossips what it did
	// before them. IslandOf reads it.
	Island string `json:"i,omitempty"`
}

// MemberInfo is one member as seen by this node.
type MemberInfo struct {
	Member
	NodeMeta
	Gossip string `json:"gossip"`
	State  string `json:"state"` // alive, suspect, dead, left
	// Since is when this node saw State begin (for a member that is not
	// live, about when its gossiped figures stopped being current).
	Since time.Time `json:"since,omitzero"`
}

// MembershipConfig configures the membership manager.
type MembershipConfig struct {
	Self NodeID
	Boot uint64
	// Island is the node's island (empty: island.Default).
	Island string
	// Bind is the gossip address (host:port); empty means a cluster of one
	// with no gossip at all.
	Bind string
	// RPC is this node's RPC address, gossiped to the others.
	RPC string
	// Seeds are gossip addresses to join at start and retry forever.
	Seeds []string
	// KnownFile, if set, keeps the gossip addresses of the other live
	// members (rewritten when they change), which the node joins at start
	// and retries like seeds. Without it, a restarted node with no seeds
	// of its own (the cluster's first node) stays alone until a peer's
	// gossip happens to reach it, and takes mail as a cluster of one.
	KnownFile string
	// Load reports this node's current load for gossip.
	Load func() (pending int, diskFull bool)
	// Holds reports the message bytes and copies this node holds, for
	// gossip (nil: none).
	Holds func() (bytes int64, messages int, known bool)
	// Domains returns the mail domains this node holds user profiles
	// for; the union over live nodes is what the cluster accepts mail for.
	Domains func() []string
	// OnNotice hears of the messages other nodes Broadcast. It runs on
	// memberlist's goroutine: it must not block.
	OnNotice func(msg []byte)
	// Wide returns the digest of the node's clusterwide objects, for
	// gossip.
	Wide   func() uint64
	Logger *slog.Logger
	// OnChange is called, from one goroutine, whenever the user map or
	// the set of live (node, boot) pairs changed.
	OnChange func(old, new *UserMap)
	// Transport carries the gossip instead of UDP and TCP on Bind (the
	// simulation's in-memory network, internal/clustersim); Bind is then
	// only the address the node advertises.
	Transport memberlist.NodeAwareTransport
	// Tune, if set, changes memberlist's settings after Quill's (the
	// simulation slows every timer down on a busy machine).
	Tune func(*memberlist.Config)
	// Deferred makes StartMembership only set up gossip; the caller then
	// calls Start once whatever OnChange uses is in place.
	Deferred bool
}

// Membership is the membership manager of Porcupine §3.1: it keeps the node's
// view of the cluster (through hashicorp/memberlist's SWIM gossip and
// failure detection) and recomputes the user map whenever that view changes.
type Membership struct {
	cfg  MembershipConfig
	ml   *memberlist.Memberlist
	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.RWMutex
	userMap UserMap
	members map[NodeID]MemberInfo // every node ever seen, with its last state
	meta    NodeMeta
	live    string              // signature of the live (node, boot) set
	domains map[NodeID][]string // domains gossiped by each node
	// changedAt is when the live set last changed.
	changedAt time.Time
	// table is the installed island table (SetIslandTable), if hasTable.
	table    island.Table
	hasTable bool
	// recomputing serialises recompute, which runs on the loop and on
	// SetIslandTable, so OnChange hears the maps in order, one at a time.
	recomputing sync.Mutex
	// started is set by Start: a table installed before only waits for
	// the first user map.
	started atomic.Bool
	// known are the other members' gossip addresses last written to
	// KnownFile.
	known []string
	// joining is set while a rejoin attempt runs (it can block for
	// memberlist's TCP timeout on an unreachable address).
	joining atomic.Bool
	// leaveOnce makes Leave (and the Leave in Shutdown) happen once.
	leaveOnce sync.Once
	// notices are messages for every node (Broadcast), piggybacked on
	// gossip by memberlist.
	notices *memberlist.TransmitLimitedQueue
	// traffic counts the gossip's packets, streams and bytes.
	traffic *counting
	// lives holds, per live member that something called, a context that
	// ends when the member stops being live in this node's view (declared
	// dead, left, or back with another boot): calls to it in flight are
	// cut short then (Peers.Conn), not at their deadlines.
	lives map[NodeID]*life
}

// life is one boot of a member as long as it stays live here.
type life struct {
	boot   uint64
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// StartMembership starts gossip (when cfg.Bind is set) and computes the
// first user map.
func StartMembership(cfg MembershipConfig) (*Membership, error) {
	m := &Membership{cfg: cfg, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		members: map[NodeID]MemberInfo{}, domains: map[NodeID][]string{}, lives: map[NodeID]*life{}}
	m.meta = NodeMeta{Boot: cfg.Boot, RPC: cfg.RPC, Island: metaIsland(cfg.Island)}
	m.known = readKnown(cfg.KnownFile)
	m.members[cfg.Self] = MemberInfo{Member: Member{ID: cfg.Self, Boot: cfg.Boot}, NodeMeta: m.meta, Gossip: cfg.Bind, State: "alive"}
	if cfg.Bind != "" {
		host, portStr, err := net.SplitHostPort(cfg.Bind)
		if err != nil {
			return nil, fmt.Errorf("cluster address %q: %w", cfg.Bind, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return nil, fmt.Errorf("cluster address %q: bad port: %w", cfg.Bind, err)
		}
		mc := memberlist.DefaultLANConfig()
		mc.Name = string(cfg.Self)
		mc.BindAddr = host
		mc.BindPort = port
		mc.AdvertiseAddr = host
		mc.AdvertisePort = port
		mc.Delegate = (*delegate)(m)
		mc.Events = (*events)(m)
		// Dead nodes are forgotten quickly so a node restarted on the same
		// address is taken back at once.
		mc.DeadNodeReclaimTime = 1 * time.Second
		mc.PushPullInterval = pushPullInterval
		mc.Logger = log.New(io.Discard, "", 0)
		if cfg.Logger != nil {
			mc.Logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
		}
		t := cfg.Transport
		if t == nil {
			nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: mc.Logger})
			if err != nil {
				return nil, fmt.Errorf("gossip on %s: %w", cfg.Bind, err)
			}
			t = nodeAware{nt}
		}
		m.traffic = countTraffic(t)
		mc.Transport = m.traffic
		if cfg.Tune != nil {
			cfg.Tune(mc)
		}
		ml, err := memberlist.Create(mc)
		if err != nil {
			m.traffic.Shutdown()
			return nil, fmt.Errorf("gossip on %s: %w", cfg.Bind, err)
		}
		m.ml = ml
		m.notices = &memberlist.TransmitLimitedQueue{NumNodes: ml.NumMembers, RetransmitMult: mc.RetransmitMult}
	}
	if !cfg.Deferred {
		m.Start()
	}
	return m, nil
}

// Start joins the seeds, computes the first user map and starts watching
// the membership.
func (m *Membership) Start() {
	if m.ml != nil && len(m.cfg.Seeds) > 0 {
		if _, err := m.ml.Join(m.cfg.Seeds); err != nil && m.cfg.Logger != nil {
			m.cfg.Logger.Warn("join failed, will retry", "seeds", m.cfg.Seeds, "err", err)
		}
	}
	m.joinKnown()
	m.started.Store(true)
	m.recompute()
	m.wg.Add(1)
	go m.loop()
}

// Gossip returns the membership traffic of this node so far (zero for a
// cluster of one).
func (m *Membership) Gossip() GossipStats {
	if m.traffic == nil {
		return GossipStats{}
	}
	return m.traffic.Stats()
}

// UserMap returns the current user map.
func (m *Membership) UserMap() UserMap {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.userMap
}

// Members returns every node this node has seen, sorted by id.
func (m *Membership) Members() []MemberInfo {
	m.mu.RLock()
	out := make([]MemberInfo, 0, len(m.members))
	for _, mi := range m.members {
		out = append(out, mi)
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// ChangedAt returns when the set of live members last changed.
func (m *Membership) ChangedAt() time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.changedAt
}

// Alive returns the members currently taking part in the user map.
func (m *Membership) Alive() []MemberInfo {
	var out []MemberInfo
	for _, mi := range m.Members() {
		if mi.State == "alive" || mi.State == "suspect" {
			out = append(out, mi)
		}
	}
	return out
}

// Expected returns how many nodes the cluster has as far as this node
// knows: the members it has seen (but those that left), and the members it
// remembers (KnownFile) but has not seen since it started. A node cut off
// or restarted alone thus still knows it is not a cluster of one.
func (m *Membership) Expected() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	addrs := map[string]bool{}
	n := 0
	for _, mi := range m.members {
		if mi.State != "left" {
			n++
			addrs[mi.Gossip] = true
		}
	}
	for _, a := range m.known {
		if !addrs[a] {
			addrs[a] = true
			n++
		}
	}
	return n
}

// Lookup returns what this node knows of a member.
func (m *Membership) Lookup(id NodeID) (MemberInfo, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mi, ok := m.members[id]
	return mi, ok
}

// Life returns what this node knows of a live (or suspect) member and a
// context that ends, with a cause wrapping rpc.ErrNodeGone, when this
// node stops counting that boot of it live; ok is false if it is not
// live now.
func (m *Membership) Life(id NodeID) (ctx context.Context, mi MemberInfo, ok bool) {
	m.mu.RLock()
	mi, ok = m.members[id]
	l := m.lives[id]
	m.mu.RUnlock()
	if !ok || !isLive(mi.State) {
		return nil, mi, false
	}
	if l != nil && l.boot == mi.Member.Boot {
		return l.ctx, mi, true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Looked up again: recompute may have run in between.
	mi, ok = m.members[id]
	if !ok || !isLive(mi.State) {
		return nil, mi, false
	}
	if l = m.lives[id]; l == nil || l.boot != mi.Member.Boot {
		if l != nil {
			l.cancel(fmt.Errorf("node %s came back with boot %d: %w", id, mi.Member.Boot, rpc.ErrNodeGone))
		}
		l = &life{boot: mi.Member.Boot}
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		m.lives[id] = l
	}
	return l.ctx, mi, true
}

// endLives ends the lives of members no longer live, or live with another
// boot (m.mu held).
func (m *Membership) endLives() {
	for id, l := range m.lives {
		mi, ok := m.members[id]
		switch {
		case !ok || !isLive(mi.State):
			l.cancel(fmt.Errorf("node %s %s: %w", id, mi.State, rpc.ErrNodeGone))
		case mi.Member.Boot != l.boot:
			l.cancel(fmt.Errorf("node %s came back with boot %d: %w", id, mi.Member.Boot, rpc.ErrNodeGone))
		default:
			continue
		}
		delete(m.lives, id)
	}
}

// isLive says whether a member in state takes part in the user map.
func isLive(state string) bool { return state == "alive" || state == "suspect" }

// Leave stops watching the membership and tells the others that this node
// leaves (memberlist's graceful leave, at most leaveTimeout), so they take
// its buckets at once instead of after failure detection. Gossip goes on
// answering until Shutdown.
func (m *Membership) Leave() {
	m.leaveOnce.Do(func() {
		close(m.stop)
		m.wg.Wait()
		if m.ml != nil {
			if err := m.ml.Leave(leaveTimeout); err != nil && m.cfg.Logger != nil {
				m.cfg.Logger.Warn("leave not announced to every member", "err", err)
			}
		}
	})
}

// Shutdown leaves the cluster (if Leave was not called) and stops gossip.
func (m *Membership) Shutdown() {
	m.Leave()
	if m.ml != nil {
		m.ml.Shutdown()
	}
}

func (m *Membership) trigger() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *Membership) loop() {
	defer m.wg.Done()
	rejoin := time.NewTicker(RejoinInterval)
	defer rejoin.Stop()
	meta := time.NewTicker(metaUpdateInterval)
	defer meta.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-m.kick:
			m.recompute()
		case <-rejoin.C:
			m.rejoin()
		case <-meta.C:
			m.refreshMeta()
		}
	}
}

// joinKnown joins the members remembered in KnownFile, each address on its
// own, and waits up to knownJoinWait for the first to answer.
func (m *Membership) joinKnown() {
	var try []string
	m.mu.RLock()
	known := m.known
	m.mu.RUnlock()
	for _, a := range known {
		if a != m.cfg.Bind && !slices.Contains(m.cfg.Seeds, a) {
			try = append(try, a)
		}
	}
	if m.ml == nil || len(try) == 0 {
		return
	}
	joined := make(chan struct{}, len(try))
	for _, a := range try {
		go func() {
			if _, err := m.ml.Join([]string{a}); err == nil {
				joined <- struct{}{}
			}
		}()
	}
	select {
	case <-joined:
	case <-time.After(knownJoinWait):
		if m.cfg.Logger != nil {
			m.cfg.Logger.Warn("no remembered member answered yet, starting alone for now", "known", try, "waited", knownJoinWait)
		}
	}
}

// readKnown reads the addresses KnownFile keeps (none if it is missing or
// unreadable: it is only a hint).
func readKnown(path string) []string {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// remember writes the other live members' gossip addresses to KnownFile
// when they changed. A view with no other member keeps the old list: that
// is the moment it is needed. Written without fsync: a lost update only
// means rejoining through an older list, plus the seeds.
func (m *Membership) remember(live []MemberInfo) {
	if m.cfg.KnownFile == "" {
		return
	}
	var addrs []string
	for _, mi := range live {
		if mi.ID != m.cfg.Self && mi.Gossip != "" {
			addrs = append(addrs, mi.Gossip)
		}
	}
	sort.Strings(addrs)
	if len(addrs) == 0 || slices.Equal(addrs, m.known) {
		return
	}
	m.known = addrs
	tmp := m.cfg.KnownFile + ".tmp"
	err := os.WriteFile(tmp, []byte(strings.Join(addrs, "\n")+"\n"), 0o600)
	if err == nil {
		err = os.Rename(tmp, m.cfg.KnownFile)
	}
	if err != nil && m.cfg.Logger != nil {
		m.cfg.Logger.Warn("could not remember the cluster's members", "file", m.cfg.KnownFile, "err", err)
	}
}

// rejoin tries the seeds, the remembered members and every member not alive
// now: memberlist does not probe dead nodes, so this is what heals a
// partition and takes back a node that was paused for longer than the
// failure detector's patience. The attempt runs on its own goroutine, one
// at a time: joining an unreachable address blocks for memberlist's TCP
// timeout, and the membership loop must go on meanwhile.
func (m *Membership) rejoin() {
	if m.ml == nil || !m.joining.CompareAndSwap(false, true) {
		return
	}
	try := m.rejoinTargets()
	if len(try) == 0 {
		m.joining.Store(false)
		return
	}
	go func() {
		defer m.joining.Store(false)
		m.ml.Join(try)
	}()
}

// rejoinTargets lists the addresses rejoin tries.
func (m *Membership) rejoinTargets() []string {
	alive := map[string]bool{}
	for _, n := range m.ml.Members() {
		alive[n.Address()] = true
	}
	var try []string
	seen := map[string]bool{}
	add := func(a string) {
		if a != "" && a != m.cfg.Bind && !alive[a] && !seen[a] {
			seen[a] = true
			try = append(try, a)
		}
	}
	for _, s := range m.cfg.Seeds {
		add(s)
	}
	m.mu.RLock()
	known := m.known
	m.mu.RUnlock()
	for _, s := range known {
		add(s)
	}
	for _, mi := range m.Members() {
		if mi.State != "alive" && mi.State != "suspect" {
			add(mi.Gossip)
		}
	}
	return try
}

func (m *Membership) refreshMeta() {
	if m.cfg.Load == nil {
		return
	}
	load, full := m.cfg.Load()
	var state uint64
	if m.cfg.Wide != nil {
		state = m.cfg.Wide()
	}
	var held int64
	var msgs int
	var known bool
	if m.cfg.Holds != nil {
		held, msgs, known = m.cfg.Holds()
	}
	m.mu.Lock()
	changed := load != m.meta.Load || full != m.meta.DiskFull || state != m.meta.Wide ||
		held != m.meta.Held || msgs != m.meta.Messages || known != m.meta.HeldKnown
	m.meta.Load, m.meta.DiskFull, m.meta.Wide = load, full, state
	m.meta.Held, m.meta.Messages, m.meta.HeldKnown = held, msgs, known
	self := m.members[m.cfg.Self]
	self.NodeMeta = m.meta
	m.members[m.cfg.Self] = self
	m.mu.Unlock()
	if changed && m.ml != nil {
		m.ml.UpdateNode(metaUpdateInterval)
	}
}

// recompute rebuilds the member table from memberlist and, if the set of
// (node, boot) pairs changed, the user map.
func (m *Membership) recompute() {
	m.recomputing.Lock()
	defer m.recomputing.Unlock()
	var live []Member
	m.mu.Lock()
	before := maps.Clone(m.members)
	if m.ml != nil {
		for id, mi := range m.members {
			if id != m.cfg.Self && (mi.State == "alive" || mi.State == "suspect") {
				mi.State = "dead"
				m.members[id] = mi
			}
		}
		for _, n := range m.ml.Members() {
			if NodeID(n.Name) == m.cfg.Self {
				continue
			}
			var meta NodeMeta
			if err := json.Unmarshal(n.Meta, &meta); err != nil {
				continue // not a Quill node, or a newer meta format
			}
			m.members[NodeID(n.Name)] = MemberInfo{Member: Member{ID: NodeID(n.Name), Boot: meta.Boot},
				NodeMeta: meta, Gossip: n.Address(), State: stateName(n.State)}
		}
	}
	now := time.Now()
	for id, mi := range m.members {
		if b, ok := before[id]; ok && b.State == mi.State && !b.Since.IsZero() {
			mi.Since = b.Since
		} else {
			mi.Since = now
		}
		m.members[id] = mi
	}
	m.endLives()
	for _, mi := range m.members {
		if mi.State == "alive" || mi.State == "suspect" {
			live = append(live, mi.Member)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].ID < live[j].ID })
	islandOf := map[NodeID]string{}
	for _, n := range live {
		islandOf[n.ID] = m.members[n.ID].IslandOf()
	}
	sig := fmt.Sprint(live)
	if m.hasTable {
		// A new table changes the map as a new member would.
		sig += fmt.Sprintf(" islands@%d %v", m.table.Epoch(), islandOf)
	}
	old := m.userMap
	next := ComputeWithin(live, within(m.table, m.hasTable, islandOf), old.Epoch+1, &old)
	if old.Epoch != 0 && len(next.ChangedSince(&old)) == 0 && sig == m.live {
		m.mu.Unlock()
		return
	}
	if len(next.ChangedSince(&old)) == 0 {
		next = old // same map: keep its epoch
	}
	m.live = sig
	m.userMap = next
	m.changedAt = time.Now()
	var liveInfo []MemberInfo
	for _, mi := range m.members {
		if mi.State == "alive" || mi.State == "suspect" {
			liveInfo = append(liveInfo, mi)
		}
	}
	m.remember(liveInfo)
	m.mu.Unlock()
	if m.cfg.Logger != nil {
		m.cfg.Logger.Info("user map changed", "epoch", next.Epoch, "members", len(live), "changed_buckets", len(next.ChangedSince(&old)))
	}
	if m.cfg.OnChange != nil {
		if old.Epoch == 0 {
			m.cfg.OnChange(nil, &next)
		} else {
			m.cfg.OnChange(&old, &next)
		}
	}
}

func stateName(s memberlist.NodeStateType) string {
	switch s {
	case memberlist.StateAlive:
		return "alive"
	case memberlist.StateSuspect:
		return "suspect"
	case memberlist.StateLeft:
		return "left"
	default:
		return "dead"
	}
}

// delegate gives memberlist our metadata.
type delegate Membership

func (d *delegate) NodeMeta(limit int) []byte {
	m := (*Membership)(d)
	m.mu.RLock()
	b, _ := json.Marshal(m.meta)
	m.mu.RUnlock()
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg hands a notice from another node to OnNotice.
func (d *delegate) NotifyMsg(b []byte) {
	if d.cfg.OnNotice != nil && len(b) > 0 {
		d.cfg.OnNotice(slices.Clone(b)) // memberlist reuses b
	}
}

// GetBroadcasts gives memberlist the notices to piggyback.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.notices == nil {
		return nil
	}
	return d.notices.GetBroadcasts(overhead, limit)
}

// maxNotice bounds one notice: it must fit in a gossip packet.
const maxNotice = 512

// Broadcast sends a short message to every node, by gossip (best effort:
// a node that is away misses it). A cluster of one sends nothing.
func (m *Membership) Broadcast(msg []byte) error {
	if m.notices == nil {
		return nil
	}
	if len(msg) > maxNotice {
		return fmt.Errorf("cluster notice of %d bytes: limit is %d", len(msg), maxNotice)
	}
	m.notices.QueueBroadcast(notice(slices.Clone(msg)))
	return nil
}

// notice is a memberlist.Broadcast of one message.
type notice []byte

func (n notice) Invalidates(memberlist.Broadcast) bool { return false }
func (n notice) Message() []byte                       { return n }
func (n notice) Finished()                             {}

// sharedState is what push/pull exchanges between two nodes.
type sharedState struct {
	ID      NodeID              `json:"id"`
	Domains map[NodeID][]string `json:"domains"`
}

// LocalState sends our domains and every other node's we know, so a domain
// reaches the whole cluster even through nodes that hold no user of it.
func (d *delegate) LocalState(join bool) []byte {
	m := (*Membership)(d)
	st := sharedState{ID: m.cfg.Self, Domains: map[NodeID][]string{}}
	m.mu.RLock()
	for id, ds := range m.domains {
		st.Domains[id] = ds
	}
	m.mu.RUnlock()
	if m.cfg.Domains != nil {
		st.Domains[m.cfg.Self] = m.cfg.Domains()
	}
	b, _ := json.Marshal(st)
	return b
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	m := (*Membership)(d)
	var st sharedState
	if json.Unmarshal(buf, &st) != nil {
		return
	}
	m.mu.Lock()
	for id, ds := range st.Domains {
		// A node's own word about itself wins over hearsay.
		if id == m.cfg.Self || (id != st.ID && m.domains[id] != nil) {
			continue
		}
		m.domains[id] = ds
	}
	m.mu.Unlock()
}

// Domains returns the union of the domains of live nodes and this node.
func (m *Membership) Domains() map[string]bool {
	out := map[string]bool{}
	if m.cfg.Domains != nil {
		for _, d := range m.cfg.Domains() {
			out[d] = true
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for id, ds := range m.domains {
		if mi, ok := m.members[id]; ok && (mi.State == "alive" || mi.State == "suspect") {
			for _, d := range ds {
				out[d] = true
			}
		}
	}
	return out
}

// events turns memberlist's callbacks into user-map recomputations; they
// run on memberlist's goroutines, so they only signal.
type events Membership

// NotifyJoin and NotifyLeave also log the change: one line per member
// that joins, leaves or is declared dead (memberlist does not say which
// of the last two; the user-map line that follows says who is live).
func (e *events) NotifyJoin(n *memberlist.Node) {
	if e.cfg.Logger != nil {
		e.cfg.Logger.Info("member joined", "node", n.Name, "addr", n.Address())
	}
	(*Membership)(e).trigger()
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	if e.cfg.Logger != nil {
		e.cfg.Logger.Info("member left or failed", "node", n.Name, "addr", n.Address())
	}
	(*Membership)(e).trigger()
}
func (e *events) NotifyUpdate(*memberlist.Node) { (*Membership)(e).trigger() }
