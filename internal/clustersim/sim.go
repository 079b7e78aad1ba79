package clustersim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
)

// pollEvery is how often the simulation looks at the nodes' views while it
// waits for them to agree (the figures it reports are that fine).
const pollEvery = 50 * time.Millisecond

// Node is one simulated node: the real membership manager on the
// simulated network.
type Node struct {
	ID  cluster.NodeID
	M   *cluster.Membership
	end *Endpoint

	mu sync.Mutex
	// adopted is when the node took its current user map.
	adopted time.Time
	// load is the pending disk operations the node gossips: while the
	// cluster is Busy it changes at every look, so every node gossips
	// new metadata at each refresh (a loaded cluster's worst case).
	load int
}

// Adopted returns when the node took its current user map.
func (n *Node) Adopted() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.adopted
}

// Cluster is a simulated cluster.
type Cluster struct {
	Net   *Network
	Nodes []*Node
	// Down are the nodes cut off.
	Down map[cluster.NodeID]bool
	// Scale is how many times slower than real time memberlist runs.
	Scale float64
	busy  atomic.Bool
}

// Busy makes every node's load change at each gossip refresh (on) or
// stand still (off).
func (c *Cluster) Busy(on bool) { c.busy.Store(on) }

// startParallel is how many nodes join at once: a join is a few round
// trips between goroutines, and one after the other they added up to
// minutes at 256 nodes on a busy machine.
const startParallel = 16

// Start starts n nodes, every one joining the first, as `quill serve
// --join` does; it returns once they are started, not settled (Settle).
// scale (1: real time) stretches every memberlist timer (probes, their
// timeouts, gossip, push-pull, stream timeouts) by that factor: the
// simulated network has no latency, so the protocol runs the same, only
// scale times slower, on a machine that could not give a few hundred
// nodes their CPU in real time. Durations measured are then scale times
// too long and rates scale times too low (Scale undoes both).
func Start(n int, scale float64) (*Cluster, error) {
	if n < 1 || n > 60000 {
		return nil, fmt.Errorf("simulated cluster of %d nodes: want 1 to 60000", n)
	}
	if scale < 1 {
		return nil, fmt.Errorf("time scale %g: want 1 or more", scale)
	}
	c := &Cluster{Net: NewNetwork(), Down: map[cluster.NodeID]bool{}, Scale: scale}
	for i := range n {
		addr := fmt.Sprintf("10.0.%d.%d:7946", i/250, i%250+1)
		end, err := c.Net.Endpoint(addr)
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, &Node{ID: cluster.NodeID(fmt.Sprintf("sim-%03d", i)), end: end})
	}
	if err := c.startNode(c.Nodes[0], nil); err != nil {
		return nil, err
	}
	seed := []string{c.Nodes[0].end.addr}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, startParallel)
	for _, node := range c.Nodes[1:] {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- c.startNode(node, seed)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// startNode starts one node's membership on its endpoint.
func (c *Cluster) startNode(node *Node, seed []string) error {
	addr := node.end.addr
	m, err := cluster.StartMembership(cluster.MembershipConfig{
		Self: node.ID, Boot: 1, Bind: addr, RPC: addr, Seeds: seed, Transport: node.end,
		Load: func() (int, bool) {
			node.mu.Lock()
			defer node.mu.Unlock()
			if c.busy.Load() {
				node.load = (node.load + 1) % 8
			}
			return node.load, false
		},
		Tune: func(mc *memberlist.Config) {
			stretch := func(d *time.Duration) { *d = time.Duration(float64(*d) * c.Scale) }
			for _, d := range []*time.Duration{&mc.ProbeInterval, &mc.ProbeTimeout, &mc.GossipInterval, &mc.PushPullInterval,
				&mc.GossipToTheDeadTime, &mc.TCPTimeout, &mc.DeadNodeReclaimTime} {
				stretch(d)
			}
		},
		OnChange: func(_, _ *cluster.UserMap) {
			node.mu.Lock()
			node.adopted = time.Now()
			node.mu.Unlock()
		},
	})
	if err != nil {
		return fmt.Errorf("simulated node %s: %w", node.ID, err)
	}
	node.mu.Lock()
	node.M = m
	node.mu.Unlock()
	return nil
}

// Live returns the nodes not cut off.
func (c *Cluster) Live() []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if !c.Down[n.ID] {
			out = append(out, n)
		}
	}
	return out
}

// Settle waits until every live node sees every live node alive and holds
// the same user map, and returns how long that took.
func (c *Cluster) Settle(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	for {
		if err := c.Agreed(); err == nil {
			return time.Since(start), nil
		} else if ctx.Err() != nil {
			return time.Since(start), fmt.Errorf("simulated cluster of %d did not settle in %s: %w", len(c.Live()), time.Since(start).Round(time.Second), err)
		}
		time.Sleep(pollEvery)
	}
}

// Agreed says whether every live node sees exactly the live nodes alive and
// holds the same user map, on live nodes only; if not, what differs.
func (c *Cluster) Agreed() error {
	live := c.Live()
	want := map[cluster.NodeID]bool{}
	for _, n := range live {
		want[n.ID] = true
	}
	first := live[0].M.UserMap()
	for _, n := range live {
		alive := n.M.Alive()
		if len(alive) != len(live) {
			return fmt.Errorf("node %s sees %d members alive, not %d", n.ID, len(alive), len(live))
		}
		for _, a := range alive {
			if !want[a.ID] {
				return fmt.Errorf("node %s sees %s alive", n.ID, a.ID)
			}
		}
		um := n.M.UserMap()
		if um.Node != first.Node {
			return fmt.Errorf("node %s holds another user map than %s", n.ID, live[0].ID)
		}
	}
	for b, id := range first.Node {
		if !want[id] {
			return fmt.Errorf("bucket %d is on %s, which is down", b, id)
		}
	}
	return nil
}

// Gossip is the membership traffic a node sent over a window.
type Gossip struct {
	Bytes, Messages float64 // per node per second: mean over the live nodes
	MaxBytes        float64 // per second, the busiest node
}

// MeasureGossip counts what the live nodes send over d (of the real
// clock), per second of simulated time.
func (c *Cluster) MeasureGossip(d time.Duration) Gossip {
	live := c.Live()
	before := make([]cluster.GossipStats, len(live))
	for i, n := range live {
		before[i] = n.M.Gossip()
	}
	start := time.Now()
	time.Sleep(d)
	secs := time.Since(start).Seconds() / c.Scale
	var g Gossip
	for i, n := range live {
		s := n.M.Gossip()
		b := float64(s.SentBytes-before[i].SentBytes) / secs
		g.Bytes += b
		g.Messages += float64(s.SentMessages-before[i].SentMessages) / secs
		g.MaxBytes = max(g.MaxBytes, b)
	}
	g.Bytes /= float64(len(live))
	g.Messages /= float64(len(live))
	return g
}

// Calls are the node-to-node calls of simulated deliveries, by the method
// the real delivery (proxy.Proxy: CheckRecipient, then placeTracked) would
// call: the recipient's lookup, UID allocation and confirmation at the
// user's manager (a call when the manager is another node than the one the
// SMTP session is on), the store at the replica set's coordinator (a call
// when the session's node is not in the set) and the coordinator's pushes
// to the other replicas.
type Calls struct {
	Deliveries                            int
	Lookup, Alloc, Write, Push, Confirm   int
	BodyCopies                            int // calls that carry the message: Write and Push
	SetNodes, SetMin, SetMax, SpreadOver2 int
}

// Total is every call.
func (k Calls) Total() int { return k.Lookup + k.Alloc + k.Write + k.Push + k.Confirm }

// Deliver simulates deliveries of one message each to users uniformly
// drawn from users, each arriving on a random live node, with replicas
// copies: the user map of the arrival node names the manager, the node's
// placer (the real balance.Placer over its membership view, every node
// equally loaded) picks the replica set from the user's mail map, which
// grows as the writer's does. It returns the calls counted.
func (c *Cluster) Deliver(deliveries, users, replicas int, seed uint64) (Calls, error) {
	live := c.Live()
	rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	loads := balance.NewTracker()
	placers := map[cluster.NodeID]*balance.Placer{}
	for _, n := range live {
		placers[n.ID] = balance.NewPlacer(n.M, loads, 0)
	}
	mailMap := map[string][]cluster.NodeID{}
	k := Calls{SetMin: replicas}
	for range deliveries {
		entry := live[rnd.IntN(len(live))]
		user := fmt.Sprintf("user%05d@sim.example", rnd.IntN(users))
		um := entry.M.UserMap()
		manager := um.Manager(user)
		if c.Down[manager] {
			return k, fmt.Errorf("user %s: node %s's user map names %s, which is down", user, entry.ID, manager)
		}
		remote := 0
		if manager != entry.ID {
			remote = 1
		}
		set := placers[entry.ID].Set(cluster.Bucket(user), mailMap[user], 0, replicas, nil)
		if len(set) != replicas {
			return k, fmt.Errorf("user %s: replica set %v of %d nodes, want %d", user, set, len(set), replicas)
		}
		coord := set[0]
		if slices.Contains(set, entry.ID) {
			coord = entry.ID
		}
		k.Deliveries++
		k.Lookup += remote
		k.Alloc += remote
		k.Confirm += remote
		if coord != entry.ID {
			k.Write++
			k.BodyCopies++
		}
		k.Push += len(set) - 1
		k.BodyCopies += len(set) - 1
		for _, n := range set {
			if !slices.Contains(mailMap[user], n) {
				mailMap[user] = append(mailMap[user], n)
			}
		}
	}
	k.SetMax = 0
	for _, holders := range mailMap {
		k.SetNodes += len(holders)
		k.SetMin = min(k.SetMin, len(holders))
		k.SetMax = max(k.SetMax, len(holders))
		if len(holders) > max(replicas, balance.DefaultSpread) {
			k.SpreadOver2++
		}
	}
	return k, nil
}

// Failure is what followed a node's crash.
type Failure struct {
	Victim cluster.NodeID
	// Converged is the time from the crash to every survivor holding the
	// same user map without the victim, in simulated time; First and Median the first and
	// the median survivor's adoption of it.
	Converged, First, Median time.Duration
	// Moved are the buckets the victim managed, now on Gainers nodes;
	// Scans the soft-state scans they ask for (usermgr: every node that
	// gains buckets asks each other live node once for those buckets).
	Moved, Gainers, Scans int
}

// Kill cuts one node off (a crash: no leave message) and waits until every
// survivor holds the same user map without it.
func (c *Cluster) Kill(ctx context.Context, victim *Node) (Failure, error) {
	before := victim.M.UserMap()
	f := Failure{Victim: victim.ID}
	start := time.Now()
	victim.end.Cut()
	c.Down[victim.ID] = true
	for {
		err := c.Agreed()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return f, fmt.Errorf("survivors of %s did not agree in %s: %w", victim.ID, time.Since(start).Round(time.Second), err)
		}
		time.Sleep(pollEvery)
	}
	simTime := func(d time.Duration) time.Duration { return time.Duration(float64(d) / c.Scale) }
	f.Converged = simTime(time.Since(start))
	var took []time.Duration
	for _, n := range c.Live() {
		took = append(took, simTime(n.Adopted().Sub(start)))
	}
	slices.Sort(took)
	f.First, f.Median = took[0], took[len(took)/2]
	after := c.Live()[0].M.UserMap()
	gainers := map[cluster.NodeID]bool{}
	for b, id := range before.Node {
		if id == victim.ID {
			f.Moved++
			gainers[after.Node[b]] = true
		}
	}
	f.Gainers = len(gainers)
	f.Scans = f.Gainers * (len(c.Live()) - 1)
	return f, nil
}

// Stop stops every node, each leaving (the cut ones to no one), at once.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		n.mu.Lock()
		m := n.M
		n.mu.Unlock()
		if m == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Shutdown()
		}()
	}
	wg.Wait()
}
