package balance

import (
	"fmt"
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
	// live nodes in the rank order of the user's bucket (StaticSet), as
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

// StaticSet is the Static policy's replica set: ranked is the live nodes
// that may hold the user's state in the rank order of the user's bucket
// (cluster.Eligible: rendezvous hashing, so a user keeps its nodes while
// they live, and losing one moves only the users it held); the first
// max(spread, r) of them are the user's fixed nodes, r of those taken in
// random order, blind to load. Nodes whose disk is full are left out, as
// every policy does.
func StaticSet(ranked []cluster.NodeID, spread, r int, load func(cluster.NodeID) Load, rnd *rand.Rand) []cluster.NodeID {
	fixed := slices.DeleteFunc(slices.Clone(ranked), func(n cluster.NodeID) bool { return load(n).DiskFull })
	fixed = fixed[:min(max(spread, r), len(fixed))]
	rnd.Shuffle(len(fixed), func(i, j int) { fixed[i], fixed[j] = fixed[j], fixed[i] })
	return fixed[:min(r, len(fixed))]
}
