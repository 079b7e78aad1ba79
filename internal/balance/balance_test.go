package balance

import (
	"math/rand/v2"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
)

func loads(m map[cluster.NodeID]Load) func(cluster.NodeID) Load {
	return func(n cluster.NodeID) Load { return m[n] }
}

func TestChooseStaysWithinSpread(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	live := []cluster.NodeID{"a", "b", "c", "d"}
	// The user already has mail on a and b, spread 2: never c or d.
	for i := 0; i < 200; i++ {
		n, ok := Choose([]cluster.NodeID{"a", "b"}, live, 2, loads(nil), rnd)
		if !ok || (n != "a" && n != "b") {
			t.Fatalf("chose %q", n)
		}
	}
}

func TestChoosePrefersLeastLoaded(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	live := []cluster.NodeID{"a", "b", "c"}
	l := map[cluster.NodeID]Load{"a": {Pending: 9}, "b": {Pending: 1}}
	for i := 0; i < 50; i++ {
		if n, _ := Choose([]cluster.NodeID{"a", "b"}, live, 2, loads(l), rnd); n != "b" {
			t.Fatalf("chose %s over the idle b", n)
		}
	}
}

func TestChooseAvoidsFullDisksAndDeadNodes(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	live := []cluster.NodeID{"a", "c"}
	l := map[cluster.NodeID]Load{"a": {DiskFull: true}}
	// b is dead, a is full: the message goes outside the spread, to c.
	n, ok := Choose([]cluster.NodeID{"a", "b"}, live, 2, loads(l), rnd)
	if !ok || n != "c" {
		t.Fatalf("chose %q %v", n, ok)
	}
	l["c"] = Load{DiskFull: true}
	if _, ok := Choose(nil, live, 2, loads(l), rnd); ok {
		t.Fatal("chose a node when every disk is full")
	}
}

func TestNewUserSpreadsOverNodes(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	live := []cluster.NodeID{"a", "b", "c", "d"}
	seen := map[cluster.NodeID]bool{}
	for i := 0; i < 200; i++ {
		n, _ := Choose(nil, live, 2, loads(nil), rnd)
		seen[n] = true
	}
	if len(seen) != 4 {
		t.Fatalf("new users' mail went to %d of 4 nodes", len(seen))
	}
}
