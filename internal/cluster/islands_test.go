package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/rpc"
)

// members returns n live members named <isl><i> in each island.
func islandMembers(perIsland int, islands ...string) []MemberInfo {
	var out []MemberInfo
	for _, isl := range islands {
		for i := range perIsland {
			mi := MemberInfo{Member: Member{ID: NodeID(fmt.Sprintf("%s%d", isl, i)), Boot: 1}, State: "alive"}
			mi.Island = metaIsland(isl)
			out = append(out, mi)
		}
	}
	return out
}

func mustInitial(t *testing.T, names ...string) island.Table {
	t.Helper()
	tb, err := island.Initial(names)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// Without a table every live member is eligible, in Ranked's order; with
// one, only the bucket's island's, in the same relative order, and a
// bucket whose island is down gets ErrNoIslandMember (an
// rpc.ErrUnavailable) and the island's NoLiveMemberError, never members of
// another island.
func TestEligible(t *testing.T) {
	alive := islandMembers(3, "a", "b")
	var plain []Member
	for _, m := range alive {
		plain = append(plain, m.Member)
	}
	tb := mustInitial(t, "a", "b")
	for b := range Buckets {
		all, err := Eligible(uint8(b), alive, island.Table{}, false)
		if err != nil {
			t.Fatal(err)
		}
		ranked := Ranked(uint8(b), plain)
		if !slices.Equal(EligibleIDs(all), idsOf(ranked)) {
			t.Fatalf("bucket %d without a table: %v, want Ranked %v", b, EligibleIDs(all), idsOf(ranked))
		}
		in, err := Eligible(uint8(b), alive, tb, true)
		if err != nil {
			t.Fatal(err)
		}
		var want []NodeID
		for _, n := range idsOf(ranked) {
			if string(n[0]) == tb.Island(uint8(b)) {
				want = append(want, n)
			}
		}
		if !slices.Equal(EligibleIDs(in), want) {
			t.Fatalf("bucket %d of island %s: %v, want %v", b, tb.Island(uint8(b)), EligibleIDs(in), want)
		}
		onlyB := alive[3:]
		got, err := Eligible(uint8(b), onlyB, tb, true)
		if tb.Island(uint8(b)) == "a" {
			var nl *island.NoLiveMemberError
			if !errors.Is(err, ErrNoIslandMember) || !errors.Is(err, rpc.ErrUnavailable) || !errors.As(err, &nl) || len(got) != 0 {
				t.Fatalf("bucket %d of island a, which is down: %v, %v", b, got, err)
			}
		} else if err != nil || len(got) != 3 {
			t.Fatalf("bucket %d of island b: %v, %v", b, got, err)
		}
	}
}

func idsOf(ms []Member) []NodeID {
	out := make([]NodeID, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// The user map with a table gives every bucket to the highest-ranked live
// member of its island, which is the first Eligible member; a bucket whose
// island is down has no manager, and comes back to the same node with the
// island.
func TestComputeWithinIslands(t *testing.T) {
	alive := islandMembers(2, "a", "b", "c")
	tb := mustInitial(t, "a", "b", "c")
	of := map[NodeID]string{}
	var ms []Member
	for _, m := range alive {
		of[m.ID] = m.IslandOf()
		ms = append(ms, m.Member)
	}
	um := ComputeWithin(ms, within(tb, true, of), 1, nil)
	for b := range Buckets {
		el, _ := Eligible(uint8(b), alive, tb, true)
		if um.Node[b] != el[0].ID {
			t.Fatalf("bucket %d: manager %s, want %s (first of its island %s)", b, um.Node[b], el[0].ID, tb.Island(uint8(b)))
		}
	}
	var noA []Member
	for _, m := range ms {
		if of[m.ID] != "a" {
			noA = append(noA, m)
		}
	}
	down := ComputeWithin(noA, within(tb, true, of), 2, &um)
	back := ComputeWithin(ms, within(tb, true, of), 3, &down)
	for b := range Buckets {
		switch {
		case tb.Island(uint8(b)) == "a" && down.Node[b] != "":
			t.Fatalf("bucket %d of island a, down: manager %s", b, down.Node[b])
		case tb.Island(uint8(b)) != "a" && (down.Node[b] != um.Node[b] || down.Changed[b] != 1):
			t.Fatalf("bucket %d of island %s moved when island a went down", b, tb.Island(uint8(b)))
		case back.Node[b] != um.Node[b]:
			t.Fatalf("bucket %d: %s after island a came back, %s before", b, back.Node[b], um.Node[b])
		}
	}
	// Without a table, and with every node in the default island, the
	// map is Compute's.
	plain := ComputeWithin(ms, within(island.Table{}, false, of), 1, nil)
	if plain.Node != Compute(ms, 1, nil).Node {
		t.Fatal("ComputeWithin without a table differs from Compute")
	}
}

// The first table is made by the lowest live node, once the live set is
// stable, over the islands present, and only when there are several.
func TestNeedInitial(t *testing.T) {
	alive := islandMembers(2, "a", "b")
	if names, ok := NeedInitial("a0", alive, false, InitialStable); !ok || !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("lowest node, stable: %v %v", names, ok)
	}
	for _, tc := range []struct {
		why    string
		self   NodeID
		alive  []MemberInfo
		have   bool
		stable time.Duration
	}{
		{"not the lowest", "b0", alive, false, time.Hour},
		{"a table exists", "a0", alive, true, time.Hour},
		{"membership still changing", "a0", alive, false, InitialStable - time.Second},
		{"one island only", "a0", islandMembers(3, "a"), false, time.Hour},
		{"every node in the default island", "default0", islandMembers(3, island.Default), false, time.Hour},
	} {
		if names, ok := NeedInitial(tc.self, tc.alive, tc.have, tc.stable); ok {
			t.Errorf("%s: made a table over %v", tc.why, names)
		}
	}
}

// SetIslandTable installs higher epochs only, recomputes the user map (the
// buckets of other islands leave a node of one island) and tells OnChange.
func TestSetIslandTable(t *testing.T) {
	var heard []*UserMap
	m, err := StartMembership(MembershipConfig{Self: "solo", Boot: 1, Island: "a",
		OnChange: func(old, new *UserMap) { heard = append(heard, new) }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	if _, ok := m.IslandTable(); ok {
		t.Fatal("a table before any was set")
	}
	if self := m.Self(); self.IslandOf() != "a" {
		t.Fatalf("own island %q, want a", self.IslandOf())
	}
	tb := mustInitial(t, "a", "b")
	if !m.SetIslandTable(tb) {
		t.Fatal("first table not installed")
	}
	if m.SetIslandTable(tb) {
		t.Fatal("same epoch installed again")
	}
	if got, ok := m.IslandTable(); !ok || !got.Equal(tb) {
		t.Fatal("IslandTable does not return the installed table")
	}
	um := m.UserMap()
	for b := range Buckets {
		want := NodeID("solo")
		if tb.Island(uint8(b)) != "a" {
			want = ""
		}
		if um.Node[b] != want {
			t.Fatalf("bucket %d of island %s: manager %q, want %q", b, tb.Island(uint8(b)), um.Node[b], want)
		}
		_, err := m.Eligible(uint8(b))
		if (want == "") != errors.Is(err, ErrNoIslandMember) {
			t.Fatalf("bucket %d: Eligible error %v", b, err)
		}
	}
	if len(heard) != 2 || heard[1].Epoch != um.Epoch {
		t.Fatalf("OnChange heard %d maps, want the first and the table's", len(heard))
	}
	// A newer epoch giving every bucket to island a takes them all back.
	var owners [island.Buckets]string
	for b := range owners {
		owners[b] = "a"
	}
	all, err := island.New(2, owners, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if !m.SetIslandTable(all) {
		t.Fatal("epoch 2 not installed")
	}
	if um := m.UserMap(); um.Node != Compute([]Member{{ID: "solo", Boot: 1}}, 1, nil).Node {
		t.Fatal("every bucket in island a: solo should manage all")
	}
	if len(heard) != 3 {
		t.Fatalf("OnChange heard %d maps, want 3", len(heard))
	}
}

// A node of the default island gossips no island, as before islands.
func TestDefaultIslandGossipsNothing(t *testing.T) {
	if metaIsland(island.Default) != "" || (NodeMeta{}).IslandOf() != island.Default {
		t.Fatal("the default island is not the empty meta")
	}
}

// A user whose island has no live member gets a temporary failure naming
// the user, never a call to another island's node.
func TestOnManagerWithoutManager(t *testing.T) {
	called := false
	_, err := OnManager(t.Context(), func() UserMap { return UserMap{Epoch: 1} }, "self", "bob@example.org",
		"local", func(NodeID) string { called = true; return "remote" }, Idempotent,
		func(context.Context, string) (int, error) { called = true; return 0, nil })
	if !errors.Is(err, ErrNoIslandMember) || !errors.Is(err, rpc.ErrUnavailable) || called {
		t.Fatalf("err %v, called %v", err, called)
	}
}
