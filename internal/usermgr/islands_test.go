package usermgr

import (
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
)

// A profile goes to the ProfileReplicas first of the nodes that may hold
// it, and counts as short when fewer of its copies are among them: a copy
// on another island's node (after an island table change) does not count,
// so it is written again into the user's island.
func TestProfilePlacement(t *testing.T) {
	eligible := []cluster.NodeID{"a2", "a1", "a3"}
	if got := ProfileTargets(eligible); !slices.Equal(got, []cluster.NodeID{"a2", "a1"}) {
		t.Fatalf("targets %v", got)
	}
	if got := ProfileTargets(eligible[:1]); !slices.Equal(got, []cluster.NodeID{"a2"}) {
		t.Fatalf("targets in an island of one: %v", got)
	}
	if got := ProfileTargets(nil); len(got) != 0 {
		t.Fatalf("targets with the island down: %v", got)
	}
	held := func(ns ...cluster.NodeID) map[cluster.NodeID]bool {
		m := map[cluster.NodeID]bool{}
		for _, n := range ns {
			m[n] = true
		}
		return m
	}
	for _, tc := range []struct {
		holders  map[cluster.NodeID]bool
		eligible []cluster.NodeID
		short    bool
	}{
		{held("a1", "a2"), eligible, false},
		{held("a1", "a3"), eligible, false}, // any two of the island's
		{held("a1"), eligible, true},
		{held("b1", "b2"), eligible, true}, // the other island's: moved
		{held("a1", "b1"), eligible, true},
		{held("a1"), eligible[:1], true},  // a2 is the only one
		{held("a2"), eligible[:1], false}, // an island of one holds one
		{held("b1"), nil, false},          // island down: nowhere to write
	} {
		if got := ProfileShort(tc.holders, tc.eligible); got != tc.short {
			t.Errorf("holders %v, eligible %v: short %v, want %v", tc.holders, tc.eligible, got, tc.short)
		}
	}
}
