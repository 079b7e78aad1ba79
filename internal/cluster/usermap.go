// Package cluster is the membership manager of Porcupine §3.1–§3.2: the
// node's view of the cluster and the user map, the table of 256 buckets that
// names, for every hash of a user name, the node managing that user's soft
// state. A one-node install is a cluster of one: the same user map, with
// every bucket on the local node.
package cluster

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Buckets is the width of the user map. Porcupine uses 256 (§6.1); the
// mailbox fragments on disk are grouped by the same bucket so one scan finds
// every fragment of a bucket during soft-state reconstruction (§3.3).
const Buckets = 256

// NodeID names a node for its whole life; it is generated once and kept in
// the node's data directory.
type NodeID string

// Bucket returns the user-map bucket of a user. Addresses are compared
// case-insensitively, so the hash is taken of the lower-cased address.
func Bucket(user string) uint8 {
	h := fnv.New32a()
	h.Write([]byte(strings.ToLower(user)))
	return uint8(h.Sum32() % Buckets)
}

// Member is one node as the user map sees it: its id and its boot
// incarnation, a number that grows every time the node process starts.
type Member struct {
	ID   NodeID
	Boot uint64
}

// UserMap maps each bucket to the node that manages it, with the epoch at
// which that assignment was made: a bucket whose manager changed gets the new
// epoch, so a node can tell exactly which buckets need their soft state
// rebuilt (Porcupine §3.2, Fig. 6). A manager that crashed and came back
// before anyone noticed keeps its id but not its boot incarnation, so its
// buckets count as changed too: its soft state is gone and must be pushed
// again.
type UserMap struct {
	Epoch   uint64
	Node    [Buckets]NodeID
	Boot    [Buckets]uint64 // boot incarnation of Node[b] when assigned
	Changed [Buckets]uint64 // epoch at which Node[b] was last assigned
}

// Compute assigns every bucket among members by rendezvous hashing (highest
// random weight): each bucket goes to the member with the highest hash of
// (bucket, member). Adding or removing one member moves only the buckets that
// member wins or held, which is the minimal movement Porcupine §3.2 asks for,
// and every node computes the same map from the same member set without
// coordination. prev may be nil; buckets whose node differs from prev get the
// new epoch.
func Compute(members []Member, epoch uint64, prev *UserMap) UserMap {
	return ComputeWithin(members, nil, epoch, prev)
}

// ComputeWithin is Compute where bucket b may go only to a member n for
// which in(b, n) holds (nil: any): with an island table, the members of
// b's island (Archipelago's one-island principle), ranked among
// themselves as Compute ranks all. A bucket no member may take has no
// manager (Node "" : its users are unavailable until one comes back).
func ComputeWithin(members []Member, in func(bucket uint8, n NodeID) bool, epoch uint64, prev *UserMap) UserMap {
	var m UserMap
	m.Epoch = epoch
	ws := make([]*[Buckets]uint64, len(members))
	for i, n := range members {
		ws[i] = nodeWeights(n.ID)
	}
	for b := 0; b < Buckets; b++ {
		var best Member
		var bestW uint64
		for i, n := range members {
			if in != nil && !in(uint8(b), n.ID) {
				continue
			}
			w := ws[i][b]
			if best.ID == "" || w > bestW || (w == bestW && n.ID < best.ID) {
				best, bestW = n, w
			}
		}
		m.Node[b] = best.ID
		m.Boot[b] = best.Boot
		if prev != nil && prev.Node[b] == best.ID && prev.Boot[b] == best.Boot {
			m.Changed[b] = prev.Changed[b]
		} else {
			m.Changed[b] = epoch
		}
	}
	return m
}

// weights caches every node's weights for the 256 buckets: each node
// computes the user map at every membership change, and hashing every
// (bucket, node) pair again each time was most of that work at a hundred
// nodes and more (the simulation, internal/clustersim). It holds one entry
// (2 KB) per node id the process has seen.
var weights sync.Map // NodeID -> *[Buckets]uint64

// nodeWeights returns n's weight for every bucket.
func nodeWeights(n NodeID) *[Buckets]uint64 {
	if w, ok := weights.Load(n); ok {
		return w.(*[Buckets]uint64)
	}
	w := new([Buckets]uint64)
	for b := range w {
		w[b] = weight(b, n)
	}
	v, _ := weights.LoadOrStore(n, w)
	return v.(*[Buckets]uint64)
}

func weight(bucket int, n NodeID) uint64 {
	h := fnv.New64a()
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(bucket))
	h.Write(b[:])
	h.Write([]byte(n))
	// fnv's low bits mix poorly for short inputs; finish with a 64-bit mixer
	// (splitmix64) so weights spread evenly over members.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Ranked returns the members ordered by their weight for a bucket, highest
// first: the first is the bucket's manager, the next ones are where hard
// state that must survive the manager (user profiles) is kept.
func Ranked(bucket uint8, members []Member) []Member {
	return rankBy(bucket, members, func(m Member) NodeID { return m.ID })
}

// rankBy returns a copy of xs ordered by their nodes' weights for a
// bucket, highest first, ties by node id (Ranked's order).
func rankBy[T any](bucket uint8, xs []T, id func(T) NodeID) []T {
	out := append([]T(nil), xs...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := id(out[i]), id(out[j])
		wi, wj := nodeWeights(a)[bucket], nodeWeights(b)[bucket]
		if wi != wj {
			return wi > wj
		}
		return a < b
	})
	return out
}

// ChangedSince returns the buckets whose assignment differs from prev (all
// when prev is nil).
func (m *UserMap) ChangedSince(prev *UserMap) []uint8 {
	var out []uint8
	for b := 0; b < Buckets; b++ {
		if prev == nil || prev.Node[b] != m.Node[b] || prev.Boot[b] != m.Boot[b] {
			out = append(out, uint8(b))
		}
	}
	return out
}

// Manager returns the node managing a user's soft state ("" if the
// user's island has no live member).
func (m *UserMap) Manager(user string) NodeID { return m.Node[Bucket(user)] }

// NodeSet returns ns as a set: sorted, each node once, no empty id. Replica
// sets and holder lists are compared and merged in this form.
func NodeSet(ns []NodeID) []NodeID {
	out := make([]NodeID, 0, len(ns))
	for _, n := range ns {
		if n != "" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SameNodes reports whether two node lists name the same nodes.
func SameNodes(a, b []NodeID) bool { return slices.Equal(NodeSet(a), NodeSet(b)) }
