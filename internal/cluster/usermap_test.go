package cluster

import (
	"fmt"
	"testing"
)

func TestBucketCaseInsensitive(t *testing.T) {
	if Bucket("Alice@Example.org") != Bucket("alice@example.org") {
		t.Fatal("bucket depends on case")
	}
}

func TestComputeMinimalMovement(t *testing.T) {
	var nodes []NodeID
	for i := 0; i < 8; i++ {
		nodes = append(nodes, NodeID(fmt.Sprintf("node-%d", i)))
	}
	m7 := Compute(nodes[:7], 1, nil)
	m8 := Compute(nodes, 2, &m7)
	moved := 0
	for b := 0; b < Buckets; b++ {
		if m7.Node[b] != m8.Node[b] {
			moved++
			if m8.Node[b] != nodes[7] {
				t.Fatalf("bucket %d moved between old nodes %s -> %s", b, m7.Node[b], m8.Node[b])
			}
			if m8.Changed[b] != 2 {
				t.Fatalf("moved bucket %d has epoch %d, want 2", b, m8.Changed[b])
			}
		} else if m8.Changed[b] != 1 {
			t.Fatalf("unmoved bucket %d has epoch %d, want 1", b, m8.Changed[b])
		}
	}
	// The new node should take about 1/8 of the buckets.
	if moved < 16 || moved > 50 {
		t.Fatalf("new node took %d buckets, want about %d", moved, Buckets/8)
	}
	// Removing it again restores the old assignment exactly.
	back := Compute(nodes[:7], 3, &m8)
	if back.Node != m7.Node {
		t.Fatal("removing a node did not restore the previous map")
	}
}

func TestComputeBalance(t *testing.T) {
	nodes := []NodeID{"a", "b", "c"}
	m := Compute(nodes, 1, nil)
	count := map[NodeID]int{}
	for _, n := range m.Node {
		count[n]++
	}
	for _, n := range nodes {
		if count[n] < 50 {
			t.Fatalf("node %s got only %d of %d buckets", n, count[n], Buckets)
		}
	}
}
