package rebalance

import (
	"cmp"
	"slices"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/replica"
)

// The decisions, apart from any I/O: Plan says how many bytes this node
// sends to each under-full node, Choose which of its messages go where.
// Both are pure, so the band, the hysteresis and the placement rules are
// tested without a cluster (decide_test.go).

// Band is how far from the mean a node's bytes may be. Outside Start (and
// more than Floor bytes from the mean) the nodes begin moving mail; once
// begun they go on until every node is within Settle (hysteresis: a
// cluster just inside Start does not move mail back and forth each time a
// delivery tips a node over it).
type Band struct {
	Start, Settle float64
	// Floor is the least distance from the mean that starts a rebalance:
	// on a cluster holding little mail 20% is a handful of messages, and
	// moving them as each delivery tips the figures costs more than the
	// imbalance.
	Floor int64
}

// DefaultBand: the 20% of the mean, settling at 10% so that the
// mail delivered during and after a rebalance (which lands anywhere) does
// not start another one at once; no rebalance over less than 1 MiB.
var DefaultBand = Band{Start: 0.20, Settle: 0.10, Floor: 1 << 20}

// Node is one live node's holdings, as gossiped (cluster.NodeMeta).
type Node struct {
	ID       cluster.NodeID
	Bytes    int64
	Messages int
	// DiskFull nodes take no new content: they never receive.
	DiskFull bool
}

// mean is the nodes' mean bytes held.
func mean(nodes []Node) float64 {
	if len(nodes) == 0 {
		return 0
	}
	var total int64
	for _, n := range nodes {
		total += n.Bytes
	}
	return float64(total) / float64(len(nodes))
}

// outside reports whether some node is further from the mean than share
// of it and than floor bytes.
func outside(nodes []Node, share float64, floor int64) bool {
	m := mean(nodes)
	limit := max(share*m, float64(floor))
	for _, n := range nodes {
		if d := float64(n.Bytes) - m; d > limit || -d > limit {
			return true
		}
	}
	return false
}

// Plan decides what self sends: bytes to each under-full node, and whether
// the rebalance is on (to pass back as active next time). It is on when a
// node is outside band.Start and band.Floor, or when it was on and some
// node is still outside band.Settle. While on, every node above the mean sends a share
// of the total that must move (the smaller of all surpluses and all
// deficits) in proportion to its surplus, split over the nodes below the
// mean in proportion to their deficits. Every node computes the same plan
// from the same gossiped figures, so the sources together send each
// under-full node what it lacks, and no more.
func Plan(self cluster.NodeID, nodes []Node, band Band, active bool) (map[cluster.NodeID]int64, bool) {
	if len(nodes) < 2 {
		return nil, false
	}
	on := outside(nodes, band.Start, band.Floor) || (active && outside(nodes, band.Settle, 0))
	if !on {
		return nil, false
	}
	m := mean(nodes)
	var mine, surplus, deficit float64
	for _, n := range nodes {
		d := float64(n.Bytes) - m
		switch {
		case d > 0:
			surplus += d
			if n.ID == self {
				mine = d
			}
		case d < 0 && !n.DiskFull:
			deficit -= d
		}
	}
	if mine == 0 || deficit == 0 {
		return nil, true
	}
	move := min(surplus, deficit) * mine / surplus
	sends := map[cluster.NodeID]int64{}
	for _, n := range nodes {
		if d := m - float64(n.Bytes); d > 0 && !n.DiskFull && n.ID != self {
			if b := int64(move * d / deficit); b > 0 {
				sends[n.ID] = b
			}
		}
	}
	return sends, true
}

// Confine says whether a message of user's, held by a node of island
// self, may be rebalanced by it: always without an island table; with
// one, only when the user's bucket belongs to self (a node's targets are
// its island's nodes, so a message of another island's user would be
// moved within the wrong island; repair moves it home instead).
func Confine(t island.Table, islands bool, self, user string) bool {
	return !islands || t.Island(cluster.Bucket(user)) == self
}

// Held is a message this node holds (replica.Held of a message object).
type Held = replica.Held

// Choose picks the messages self moves to fill sends (bytes per node, from
// Plan). It moves a user's messages held here together: all of them go to
// one node that holds none of them, so the user's mail stays on as many
// nodes as before (the spread, Porcupine §5) and this node's fragment of
// the user empties, which takes it out of the user's mail map
// (writer/vacate.go). Users are taken largest first, each to the node with
// the most left to receive that it fits in. A message with a replica that
// is not live is left to repair, and so is its user's whole group; a
// message with more live replicas than it wants besides this one only
// drops this copy (one that does not say how many it wants keeps all).
// Each move names the set it was planned on (From): the writer skips it if
// the set changed since.
func Choose(self cluster.NodeID, held []Held, sends map[cluster.NodeID]int64, live map[cluster.NodeID]bool) []replica.Move {
	type group struct {
		user  string
		msgs  []Held
		nodes []cluster.NodeID // every replica of the group's messages
		bytes int64
		stuck bool
	}
	byUser := map[string]*group{}
	var order []*group
	var moves []replica.Move
	left := map[cluster.NodeID]int64{}
	var total int64
	for n, b := range sends {
		left[n] = b
		total += b
	}
	for _, h := range held {
		if !slices.Contains(h.Replicas, self) {
			continue
		}
		g := byUser[h.User]
		if g == nil {
			g = &group{user: h.User}
			byUser[h.User] = g
			order = append(order, g)
		}
		others := 0
		for _, n := range h.Replicas {
			switch {
			case !live[n]:
				g.stuck = true
			case n != self:
				others++
			}
		}
		if !g.stuck && h.Want > 0 && others >= h.Want && total > 0 {
			// A copy more than wanted (a move cut short between its two
			// writes): this one only goes. A message that does not say
			// how many copies it wants keeps them all.
			moves = append(moves, replica.Move{Object: h.Object, From: h.Replicas,
				Replicas: without(h.Replicas, self), Gone: []cluster.NodeID{self}})
			total -= h.Bytes
			continue
		}
		g.msgs = append(g.msgs, h)
		g.bytes += h.Bytes
		for _, n := range h.Replicas {
			if !slices.Contains(g.nodes, n) {
				g.nodes = append(g.nodes, n)
			}
		}
	}
	slices.SortStableFunc(order, func(a, b *group) int { return cmp.Compare(b.bytes, a.bytes) })
	for _, g := range order {
		if g.stuck || len(g.msgs) == 0 {
			continue
		}
		var to cluster.NodeID
		for n, b := range left {
			if b < g.bytes || slices.Contains(g.nodes, n) || !live[n] {
				continue
			}
			if to == "" || b > left[to] || (b == left[to] && n < to) {
				to = n
			}
		}
		if to == "" {
			continue
		}
		left[to] -= g.bytes
		for _, h := range g.msgs {
			set := append(without(h.Replicas, self), to)
			slices.Sort(set)
			moves = append(moves, replica.Move{Object: h.Object, From: h.Replicas, Replicas: set, Gone: []cluster.NodeID{self}})
		}
	}
	return moves
}

func without(set []cluster.NodeID, drop cluster.NodeID) []cluster.NodeID {
	out := make([]cluster.NodeID, 0, len(set))
	for _, n := range set {
		if n != drop {
			out = append(out, n)
		}
	}
	return out
}
