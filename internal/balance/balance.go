// Package balance is the load balancer of Porcupine §5: it keeps what this
// node knows of every other node's load — pending disk operations and a
// disk-full flag, learned from RPC replies and gossip — and picks where a new
// message goes. The choice is spread-limited: among the nodes that already
// hold the user's mail plus random others up to the user's spread, the
// least loaded one that has disk space wins, so a user's mail stays on few
// nodes while load still moves away from busy ones.
package balance

import (
	"math/rand/v2"
	"sort"
	"sync"

	"github.com/quillmail/quill/internal/cluster"
)

// DefaultSpread is how many nodes a user's mail may be spread over when the
// profile does not say (Porcupine §5 uses small spreads; 2 balanced best
// for its workload, §6.3).
const DefaultSpread = 2

// Load is one node's load as last heard.
type Load struct {
	Pending  int
	DiskFull bool
}

// Tracker holds the latest load of every node.
type Tracker struct {
	mu    sync.RWMutex
	loads map[cluster.NodeID]Load
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{loads: map[cluster.NodeID]Load{}} }

// Observe records a node's load (from an RPC reply or gossip).
func (t *Tracker) Observe(n cluster.NodeID, l Load) {
	t.mu.Lock()
	t.loads[n] = l
	t.mu.Unlock()
}

// Get returns the last load heard from n (zero if never heard).
func (t *Tracker) Get(n cluster.NodeID) Load {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.loads[n]
}

// Choose picks the node for a new message of a user whose mail map is
// holders, among the live nodes. It is a pure function of its inputs and
// rnd, so its policy is tested without a cluster.
func Choose(holders, live []cluster.NodeID, spread int, load func(cluster.NodeID) Load, rnd *rand.Rand) (cluster.NodeID, bool) {
	if spread <= 0 {
		spread = DefaultSpread
	}
	isLive := map[cluster.NodeID]bool{}
	for _, n := range live {
		isLive[n] = true
	}
	var cand []cluster.NodeID
	inCand := map[cluster.NodeID]bool{}
	for _, n := range holders {
		if isLive[n] && !inCand[n] {
			cand = append(cand, n)
			inCand[n] = true
		}
	}
	// Random others up to the spread, so a new user (empty mail map) and a
	// user whose nodes are busy still get a choice.
	others := make([]cluster.NodeID, 0, len(live))
	for _, n := range live {
		if !inCand[n] {
			others = append(others, n)
		}
	}
	rnd.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	for _, n := range others {
		if len(cand) >= spread {
			break
		}
		cand = append(cand, n)
	}
	// If every candidate's disk is full, any live node with room will do
	// (Porcupine §2.3.1: "the proxy is free to select any other node").
	pick := func(from []cluster.NodeID) (cluster.NodeID, bool) {
		var ok []cluster.NodeID
		for _, n := range from {
			if !load(n).DiskFull {
				ok = append(ok, n)
			}
		}
		if len(ok) == 0 {
			return "", false
		}
		rnd.Shuffle(len(ok), func(i, j int) { ok[i], ok[j] = ok[j], ok[i] })
		sort.SliceStable(ok, func(i, j int) bool { return load(ok[i]).Pending < load(ok[j]).Pending })
		return ok[0], true
	}
	if n, ok := pick(cand); ok {
		return n, true
	}
	return pick(others)
}
