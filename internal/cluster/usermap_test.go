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
	var nodes []Member
	for i := 0; i < 8; i++ {
		nodes = append(nodes, Member{ID: NodeID(fmt.Sprintf("node-%d", i)), Boot: 1})
	}
	m7 := Compute(nodes[:7], 1, nil)
	m8 := Compute(nodes, 2, &m7)
	moved := 0
	for b := 0; b < Buckets; b++ {
		if m7.Node[b] != m8.Node[b] {
			moved++
			if m8.Node[b] != nodes[7].ID {
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
	nodes := []Member{{"a", 1}, {"b", 1}, {"c", 1}}
	m := Compute(nodes, 1, nil)
	count := map[NodeID]int{}
	for _, n := range m.Node {
		count[n]++
	}
	for _, n := range nodes {
		if count[n.ID] < 50 {
			t.Fatalf("node %s got only %d of %d buckets", n.ID, count[n.ID], Buckets)
		}
	}
}

// A node that restarted before anyone noticed (Porcupine Fig. 6) keeps its
// buckets but every one of them must count as changed.
func TestComputeDetectsQuickRestart(t *testing.T) {
	before := Compute([]Member{{"a", 1}, {"b", 1}}, 1, nil)
	after := Compute([]Member{{"a", 1}, {"b", 2}}, 2, &before)
	changed := after.ChangedSince(&before)
	for _, b := range changed {
		if after.Node[b] != "b" {
			t.Fatalf("bucket %d of a counted as changed", b)
		}
	}
	nb := 0
	for b := 0; b < Buckets; b++ {
		if after.Node[b] == "b" {
			nb++
			if after.Changed[b] != 2 {
				t.Fatalf("bucket %d of restarted b has epoch %d", b, after.Changed[b])
			}
		}
	}
	if nb == 0 || len(changed) != nb {
		t.Fatalf("changed %d buckets, b manages %d", len(changed), nb)
	}
}

func TestRanked(t *testing.T) {
	ms := []Member{{"a", 1}, {"b", 1}, {"c", 1}}
	m := Compute(ms, 1, nil)
	for b := 0; b < Buckets; b++ {
		r := Ranked(uint8(b), ms)
		if r[0].ID != m.Node[b] || len(r) != 3 {
			t.Fatalf("bucket %d: ranked %v, manager %s", b, r, m.Node[b])
		}
	}
}
