package balance

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"

	"github.com/quillmail/quill/internal/cluster"
)

// Policy is how new mail is placed. Only Dynamic is Quill's design; Random
// and Static exist to redo Porcupine's comparison of placement policies
// (§6.3, Fig. 10 and 11; docs/benchmarks.md, "Porcupine Fig. 10/11"):
// they are an experiment's settings (`quill serve --placement`), not
// choices for a deployment.
type Policy string

const (
	// Dynamic is Porcupine's spread-limited, load-aware choice (Choose):
	// the least loaded of the user's holders plus random others up to the
	// spread.
	Dynamic Policy = "dynamic"
	// Random takes the same candidates as Dynamic and picks among them at
	// random, blind to load (a full disk is still avoided): it isolates
	// what load awareness is worth.
	Random Policy = "random"
	// Static puts a user's mail on fixed nodes: the first max(spread, r)
	// live nodes in an order hashed from the user's name (StaticSet), as
	// a statically partitioned mail server does (Porcupine's S1, S2, S4).
	Static Policy = "static"
)

// ParsePolicy reads a --placement value ("" is Dynamic).
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case "":
		return Dynamic, nil
	case Dynamic, Random, Static:
		return p, nil
	}
	return "", fmt.Errorf("placement %q: want dynamic, random or static", s)
}

// blind hides the pending operations of every node from the choice,
// keeping only whether its disk is full (the Random policy).
func blind(load func(cluster.NodeID) Load) func(cluster.NodeID) Load {
	return func(n cluster.NodeID) Load { return Load{DiskFull: load(n).DiskFull} }
}

// StaticSet is the Static policy's replica set for user: the live nodes
// ranked by a hash of the user's name and the node's (rendezvous hashing:
// a user keeps its nodes while they live, and losing one moves only the
// users it held), the first max(spread, r) of them taken as the user's
// fixed nodes, r of those in random order, blind to load. Nodes whose disk
// is full are left out, as every policy does.
func StaticSet(user string, live []cluster.NodeID, spread, r int, load func(cluster.NodeID) Load, rnd *rand.Rand) []cluster.NodeID {
	ranked := slices.Clone(live)
	score := func(n cluster.NodeID) uint64 {
		h := fnv.New64a()
		h.Write([]byte(user))
		h.Write([]byte{0})
		h.Write([]byte(n))
		return mix64(h.Sum64())
	}
	slices.SortFunc(ranked, func(a, b cluster.NodeID) int {
		sa, sb := score(a), score(b)
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return 0
	})
	ranked = slices.DeleteFunc(ranked, func(n cluster.NodeID) bool { return load(n).DiskFull })
	fixed := ranked[:min(max(spread, r), len(ranked))]
	rnd.Shuffle(len(fixed), func(i, j int) { fixed[i], fixed[j] = fixed[j], fixed[i] })
	return fixed[:min(r, len(fixed))]
}

// mix64 is splitmix64's finalizer: FNV alone ranks nodes of names that
// differ in a last character unevenly, and every node must rank alike.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
