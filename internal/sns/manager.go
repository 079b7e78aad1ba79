package sns

import (
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"
)

// The SNS manager (§3.1–3.3) across the nodes. One node at a time is the
// manager. It is elected by its beacons on the cluster's gossip: a node
// that hears none for beaconTimeout plus a random backoff (so the nodes do
// not all stand at once) becomes manager with a higher term; a manager
// that hears another manager's beacon with a higher term, or the same term
// and a lower node id, steps down, so two managers (after a partition
// heals) resolve to one. Every node reports its pools' load on the gossip
// too; the manager holds these reports as the launch table (soft state,
// rebuilt from the next reports by whichever node is manager), decides
// where workers are launched beyond each node's first and which are
// reaped, and piggybacks the aggregate load and its orders on its beacons.
// Nodes started with --overflow get workers only when every dedicated
// node has its maximum, and lose them first (§3.3.4).
//
// Manager is the decision state and pure steps over it (Hear, Tick, Plan),
// with the clock passed in; the node carries its messages on the gossip
// and carries out its orders on its pools.

// Timings of the manager, each randomized where it repeats (§3.5).
const (
	// beaconInterval is how often the manager beacons (±20%).
	beaconInterval = 500 * time.Millisecond
	// beaconTimeout is how long without a beacon before a node stands
	// for manager, plus a random backoff of up to beaconBackoff.
	beaconTimeout = 2 * time.Second
	beaconBackoff = 2 * time.Second
	// nodeReportInterval is how often a node reports its load (±20%).
	nodeReportInterval = time.Second
	// reportStale: a report older than this is out of the table (the node
	// is gone, or its reports are not getting through).
	reportStale = 4 * time.Second
	// orderLife is how long an order rides on the beacons (gossip may
	// drop one beacon; a node carries out an order once).
	orderLife = 3 * time.Second
	// overflowReapBelow: a cluster whose workers carry less than this
	// share of the launch threshold gives back an overflow worker.
	overflowReapBelow = 0.25
)

// Message is what the manager and the nodes say on the gossip: a beacon
// from the manager, or a node's load report. Short field names: a notice
// must fit in a gossip packet.
type Message struct {
	Beacon *Beacon  `json:"b,omitempty"`
	Report *Report  `json:"r,omitempty"`
	From   string   `json:"f"`
	Orders []Order  `json:"o,omitempty"`
	Load   []Aggreg `json:"a,omitempty"`
}

// Beacon says who the manager is.
type Beacon struct {
	Term uint64 `json:"t"`
}

// Report is one node's load in one class.
type Report struct {
	Class    string `json:"c"`
	Workers  int    `json:"w"`
	Max      int    `json:"x"`
	Pending  int    `json:"p"`
	Overflow bool   `json:"o,omitempty"`
}

// Aggreg is a class's load over the cluster, as the manager last saw it.
type Aggreg struct {
	Class   string `json:"c"`
	Workers int    `json:"w"`
	Pending int    `json:"p"`
	Nodes   int    `json:"n"`
}

// Order tells a node to launch or reap a worker of a class.
type Order struct {
	Seq   uint64 `json:"s"`
	Term  uint64 `json:"t"`
	Node  string `json:"n"`
	Class string `json:"c"`
	Reap  bool   `json:"r,omitempty"`
	at    time.Time
}

// Action is an order for this node, to carry out on its pool.
type Action struct {
	Class string
	Reap  bool
}

// NodeLoad is one node's row of the launch table: its report of a class,
// and when it was heard.
type NodeLoad struct {
	Node     string    `json:"node"`
	Class    string    `json:"class"`
	Workers  int       `json:"workers"`
	Max      int       `json:"max"`
	Pending  int       `json:"pending"`
	Overflow bool      `json:"overflow"`
	At       time.Time `json:"at"`
}

func rowOf(node string, r Report, at time.Time) NodeLoad {
	return NodeLoad{Node: node, Class: r.Class, Workers: r.Workers, Max: r.Max, Pending: r.Pending, Overflow: r.Overflow, At: at}
}

// Manager is one node's part in the manager election and, while it is the
// manager, the launch table and the orders.
type Manager struct {
	Self     string
	Overflow bool
	// Threshold is the load per worker past which the cluster needs
	// another worker of a class (as Config.Threshold).
	Threshold int

	mu         sync.Mutex
	manager    string // "" until a beacon is heard or this node stands
	term       uint64
	lastBeacon time.Time
	patience   time.Duration // beaconTimeout plus this wait's backoff
	nextBeacon time.Time
	nextReport time.Time
	table      map[string]NodeLoad // node/class -> its last report
	seq        uint64
	orders     []Order
	lastLaunch map[string]time.Time // class -> the manager's last launch
	done       map[uint64]uint64    // term -> last seq carried out here
	aggregate  []Aggreg
	elections  int
	rand       func() float64
}

// NewManager returns a node's manager state; the node is not manager
// until it has waited for beacons for a while.
func NewManager(self string, overflow bool, threshold int, now time.Time) *Manager {
	if threshold <= 0 {
		threshold = 4
	}
	m := &Manager{Self: self, Overflow: overflow, Threshold: threshold, lastBeacon: now,
		table: map[string]NodeLoad{}, lastLaunch: map[string]time.Time{}, done: map[uint64]uint64{},
		rand: rand.Float64}
	m.patience = m.backoff()
	return m
}

func (m *Manager) backoff() time.Duration {
	return beaconTimeout + time.Duration(m.rand()*float64(beaconBackoff))
}

// Hear takes a message from the gossip (or this node's own, looped back)
// and returns the orders this node is to carry out.
func (m *Manager) Hear(msg Message, now time.Time) []Action {
	m.mu.Lock()
	defer m.mu.Unlock()
	if msg.Report != nil {
		m.table[msg.From+"/"+msg.Report.Class] = rowOf(msg.From, *msg.Report, now)
	}
	if msg.Beacon == nil {
		return nil
	}
	b := msg.Beacon
	if msg.From != m.Self {
		if m.manager != "" && m.manager != msg.From && now.Sub(m.lastBeacon) <= m.patience &&
			!outranks(msg.From, b.Term, m.manager, m.term) {
			// The manager this node follows (or is) outranks it: a
			// stale beacon, or a rival that steps down when it hears
			// the better one.
			return nil
		}
		m.manager, m.term = msg.From, b.Term
		m.lastBeacon = now
		m.patience = m.backoff()
		m.aggregate = msg.Load
	}
	var acts []Action
	for _, o := range msg.Orders {
		if o.Node != m.Self || o.Term != b.Term || o.Seq <= m.done[o.Term] {
			continue
		}
		m.done[o.Term] = o.Seq
		acts = append(acts, Action{Class: o.Class, Reap: o.Reap})
	}
	return acts
}

// outranks reports whether manager a (with term ta) wins over b: the
// higher term, then the lower node id.
func outranks(a string, ta uint64, b string, tb uint64) bool {
	if ta != tb {
		return ta > tb
	}
	return a < b
}

// Tick advances the clock: it stands for manager when the beacons have
// stopped, and returns what to say on the gossip now (this node's reports,
// the manager's beacon) and the orders for this node itself. reports are
// this node's pools' loads.
func (m *Manager) Tick(now time.Time, reports []Report) (out []Message, acts []Action) {
	m.mu.Lock()
	if m.manager != m.Self && now.Sub(m.lastBeacon) > m.patience {
		m.manager = m.Self
		m.term++
		m.elections++
		m.nextBeacon = now
	}
	if now.After(m.nextReport) || now.Equal(m.nextReport) {
		m.nextReport = now.Add(jitter(nodeReportInterval, 0.2))
		for _, r := range reports {
			r.Overflow = m.Overflow
			r := r
			out = append(out, Message{From: m.Self, Report: &r})
		}
	}
	if m.manager == m.Self && !now.Before(m.nextBeacon) {
		m.nextBeacon = now.Add(jitter(beaconInterval, 0.2))
		m.lastBeacon = now
		m.planLocked(now)
		b := Message{From: m.Self, Beacon: &Beacon{Term: m.term}, Load: m.aggregate}
		for _, o := range m.orders {
			b.Orders = append(b.Orders, o)
		}
		out = append(out, b)
	}
	m.mu.Unlock()
	// This node hears its own messages (gossip does not loop them back).
	for _, msg := range out {
		acts = append(acts, m.Hear(msg, now)...)
	}
	return out, acts
}

// planLocked refreshes the table and the aggregate, drops old orders and
// adds the manager's new decisions.
func (m *Manager) planLocked(now time.Time) {
	var rows []NodeLoad
	for k, r := range m.table {
		if now.Sub(r.At) > reportStale {
			delete(m.table, k)
			continue
		}
		rows = append(rows, r)
	}
	m.orders = slices.DeleteFunc(m.orders, func(o Order) bool { return now.Sub(o.at) > orderLife })
	m.aggregate = Aggregate(rows)
	for _, a := range m.aggregate {
		if now.Sub(m.lastLaunch[a.Class]) < holdOff {
			continue
		}
		node, reap := Plan(rows, a.Class, m.Threshold)
		if node == "" {
			continue
		}
		m.seq++
		m.orders = append(m.orders, Order{Seq: m.seq, Term: m.term, Node: node, Class: a.Class, Reap: reap, at: now})
		// A launch or a reap both wait out the hold-off: the load must
		// settle before the next decision.
		m.lastLaunch[a.Class] = now
	}
	// At most the newest few ride on a beacon (a gossip packet).
	if len(m.orders) > 3 {
		m.orders = m.orders[len(m.orders)-3:]
	}
}

// Aggregate sums the table per class.
func Aggregate(rows []NodeLoad) []Aggreg {
	by := map[string]*Aggreg{}
	for _, r := range rows {
		a := by[r.Class]
		if a == nil {
			a = &Aggreg{Class: r.Class}
			by[r.Class] = a
		}
		a.Workers += r.Workers
		a.Pending += r.Pending
		a.Nodes++
	}
	out := make([]Aggreg, 0, len(by))
	for _, a := range by {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Class < out[j].Class })
	return out
}

// Plan is the manager's decision for one class: the node to launch a
// worker on when the cluster's workers all carry the threshold on average
// (a dedicated node with room first, the least loaded; an overflow node
// only when no dedicated node has room), or, when the load is light, an
// overflow node to reap one from (reap true). "" is no decision.
func Plan(rows []NodeLoad, class string, threshold int) (node string, reap bool) {
	var mine []NodeLoad
	workers, pending := 0, 0
	for _, r := range rows {
		if r.Class == class {
			mine = append(mine, r)
			workers += r.Workers
			pending += r.Pending
		}
	}
	if workers == 0 {
		return "", false // the first worker is launched on demand
	}
	perWorker := float64(pending) / float64(workers)
	if perWorker >= float64(threshold) {
		best := -1
		for i, r := range mine {
			if r.Workers >= r.Max {
				continue
			}
			if best < 0 || better(r, mine[best]) {
				best = i
			}
		}
		if best < 0 {
			return "", false
		}
		return mine[best].Node, false
	}
	if perWorker < overflowReapBelow*float64(threshold) {
		most := -1
		for i, r := range mine {
			if r.Overflow && r.Workers > 0 && (most < 0 || r.Workers > mine[most].Workers) {
				most = i
			}
		}
		if most >= 0 {
			return mine[most].Node, true
		}
	}
	return "", false
}

// better orders launch candidates: dedicated before overflow, then the
// lighter load per worker, then fewer workers, then the node id.
func better(a, b NodeLoad) bool {
	if a.Overflow != b.Overflow {
		return !a.Overflow
	}
	la, lb := float64(a.Pending)/float64(max(a.Workers, 1)), float64(b.Pending)/float64(max(b.Workers, 1))
	if la != lb {
		return la < lb
	}
	if a.Workers != b.Workers {
		return a.Workers < b.Workers
	}
	return a.Node < b.Node
}

// Remote returns the other nodes' rows of a class with live workers, for
// dispatch across the cluster.
func (m *Manager) Remote(class string, now time.Time) []NodeLoad {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []NodeLoad
	for _, r := range m.table {
		if r.Node != m.Self && r.Class == class && r.Workers > 0 && now.Sub(r.At) <= reportStale {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// ManagerStatus is what the admin API shows of the manager.
type ManagerStatus struct {
	Manager   string      `json:"manager"`
	Term      uint64      `json:"term"`
	Self      bool        `json:"self"`
	Overflow  bool        `json:"overflow"`
	Elections int         `json:"elections"`
	Aggregate []ClassLoad `json:"aggregate"`
	Table     []NodeLoad  `json:"table"`
}

// ClassLoad is a class's load over the cluster as the admin API shows it
// (Aggreg, in the gossip's short names, is what the beacons carry).
type ClassLoad struct {
	Class   string `json:"class"`
	Workers int    `json:"workers"`
	Pending int    `json:"pending"`
	Nodes   int    `json:"nodes"`
}

// Status returns the manager state as this node sees it.
func (m *Manager) Status(now time.Time) ManagerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := ManagerStatus{Manager: m.manager, Term: m.term, Self: m.manager == m.Self, Overflow: m.Overflow,
		Elections: m.elections}
	for _, a := range m.aggregate {
		st.Aggregate = append(st.Aggregate, ClassLoad(a))
	}
	for _, r := range m.table {
		if now.Sub(r.At) <= reportStale {
			st.Table = append(st.Table, r)
		}
	}
	sort.Slice(st.Table, func(i, j int) bool {
		if st.Table[i].Node != st.Table[j].Node {
			return st.Table[i].Node < st.Table[j].Node
		}
		return st.Table[i].Class < st.Table[j].Class
	})
	return st
}
