// Package cluster is the membership manager of Porcupine §3.1–§3.2: the
// node's view of the cluster and the user map, the table of 256 buckets that
// names, for every hash of a user name, the node managing that user's soft
// state. A one-node install is a cluster of one: the same user map, with
// every bucket on the local node.
package cluster

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
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

// UserMap maps each bucket to the node that manages it, with the epoch at
// which that assignment was made: a bucket whose manager changed gets the new
// epoch, so a node can tell exactly which buckets need their soft state
// rebuilt (Porcupine §3.2, Fig. 6).
type UserMap struct {
	Epoch   uint64
	Node    [Buckets]NodeID
	Changed [Buckets]uint64 // epoch at which Node[b] was last assigned
}

// Compute assigns every bucket among members by rendezvous hashing (highest
// random weight): each bucket goes to the member with the highest hash of
// (bucket, member). Adding or removing one member moves only the buckets that
// member wins or held, which is the minimal movement Porcupine §3.2 asks for,
// and every node computes the same map from the same member set without
// coordination. prev may be nil; buckets whose node differs from prev get the
// new epoch.
func Compute(members []NodeID, epoch uint64, prev *UserMap) UserMap {
	var m UserMap
	m.Epoch = epoch
	for b := 0; b < Buckets; b++ {
		var best NodeID
		var bestW uint64
		for _, n := range members {
			w := weight(b, n)
			if best == "" || w > bestW || (w == bestW && n < best) {
				best, bestW = n, w
			}
		}
		m.Node[b] = best
		if prev != nil && prev.Node[b] == best {
			m.Changed[b] = prev.Changed[b]
		} else {
			m.Changed[b] = epoch
		}
	}
	return m
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

// Manager returns the node managing a user's soft state.
func (m *UserMap) Manager(user string) NodeID { return m.Node[Bucket(user)] }
