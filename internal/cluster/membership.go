package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
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
)

// NodeMeta is what a node gossips about itself (memberlist meta, at most 512
// bytes).
type NodeMeta struct {
	Boot     uint64 `json:"b"`
	RPC      string `json:"r"`           // node-to-node RPC address
	Load     int    `json:"l"`           // pending disk operations (Porcupine §5)
	DiskFull bool   `json:"f,omitempty"` // no room for new mail
}

// MemberInfo is one member as seen by this node.
type MemberInfo struct {
	Member
	NodeMeta
	Gossip string `json:"gossip"`
	State  string `json:"state"` // alive, suspect, dead, left
}

// MembershipConfig configures the membership manager.
type MembershipConfig struct {
	Self NodeID
	Boot uint64
	// Bind is the gossip address (host:port); empty means a cluster of one
	// with no gossip at all.
	Bind string
	// RPC is this node's RPC address, gossiped to the others.
	RPC string
	// Seeds are gossip addresses to join at start and retry forever.
	Seeds []string
	// Load reports this node's current load for gossip.
	Load     func() (pending int, diskFull bool)
	Logger   *slog.Logger
	OnChange func(old, new *UserMap)
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
}

// StartMembership starts gossip (when cfg.Bind is set) and computes the
// first user map.
func StartMembership(cfg MembershipConfig) (*Membership, error) {
	m := &Membership{cfg: cfg, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		members: map[NodeID]MemberInfo{}}
	m.meta = NodeMeta{Boot: cfg.Boot, RPC: cfg.RPC}
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
		mc.Logger = log.New(io.Discard, "", 0)
		if cfg.Logger != nil {
			mc.Logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
		}
		ml, err := memberlist.Create(mc)
		if err != nil {
			return nil, fmt.Errorf("gossip on %s: %w", cfg.Bind, err)
		}
		m.ml = ml
		if len(cfg.Seeds) > 0 {
			if _, err := ml.Join(cfg.Seeds); err != nil && cfg.Logger != nil {
				cfg.Logger.Warn("join failed, will retry", "seeds", cfg.Seeds, "err", err)
			}
		}
	}
	m.recompute()
	m.wg.Add(1)
	go m.loop()
	return m, nil
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

// Lookup returns what this node knows of a member.
func (m *Membership) Lookup(id NodeID) (MemberInfo, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mi, ok := m.members[id]
	return mi, ok
}

// Shutdown leaves the cluster gracefully and stops gossip.
func (m *Membership) Shutdown() {
	close(m.stop)
	m.wg.Wait()
	if m.ml != nil {
		m.ml.Leave(leaveTimeout)
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

// rejoin tries the seeds and every member not alive now: memberlist does not
// probe dead nodes, so this is what heals a partition and takes back a node
// that was paused for longer than the failure detector's patience.
func (m *Membership) rejoin() {
	if m.ml == nil {
		return
	}
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
	for _, mi := range m.Members() {
		if mi.State != "alive" && mi.State != "suspect" {
			add(mi.Gossip)
		}
	}
	if len(try) > 0 {
		m.ml.Join(try)
	}
}

func (m *Membership) refreshMeta() {
	if m.cfg.Load == nil {
		return
	}
	load, full := m.cfg.Load()
	m.mu.Lock()
	changed := load != m.meta.Load || full != m.meta.DiskFull
	m.meta.Load, m.meta.DiskFull = load, full
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
	var live []Member
	m.mu.Lock()
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
	for _, mi := range m.members {
		if mi.State == "alive" || mi.State == "suspect" {
			live = append(live, mi.Member)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].ID < live[j].ID })
	old := m.userMap
	next := Compute(live, old.Epoch+1, &old)
	if old.Epoch != 0 && len(next.ChangedSince(&old)) == 0 {
		m.mu.Unlock()
		return
	}
	m.userMap = next
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
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// events turns memberlist's callbacks into user-map recomputations; they
// run on memberlist's goroutines, so they only signal.
type events Membership

func (e *events) NotifyJoin(*memberlist.Node)   { (*Membership)(e).trigger() }
func (e *events) NotifyLeave(*memberlist.Node)  { (*Membership)(e).trigger() }
func (e *events) NotifyUpdate(*memberlist.Node) { (*Membership)(e).trigger() }
