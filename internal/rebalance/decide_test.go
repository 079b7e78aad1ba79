package rebalance

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/replica"
)

// testBand is DefaultBand without its floor, for figures in bytes small
// enough to read.
var testBand = Band{Start: DefaultBand.Start, Settle: DefaultBand.Settle}

func nodes(bytes ...int64) []Node {
	out := make([]Node, len(bytes))
	for i, b := range bytes {
		out[i] = Node{ID: cluster.NodeID(string(rune('a' + i))), Bytes: b}
	}
	return out
}

func TestPlanJoinSplitsDeficitBySurplus(t *testing.T) {
	ns := nodes(300, 300, 300, 0) // a fourth node joined empty: mean 225
	var total int64
	for _, n := range ns[:3] {
		sends, on := Plan(n.ID, ns, testBand, false)
		if !on {
			t.Fatalf("%s: no rebalance with an empty node", n.ID)
		}
		if len(sends) != 1 || sends["d"] != 75 {
			t.Fatalf("%s sends %v, want 75 to d", n.ID, sends)
		}
		total += sends["d"]
	}
	if total != 225 {
		t.Fatalf("d is sent %d, want its deficit 225", total)
	}
	if sends, on := Plan("d", ns, testBand, false); !on || len(sends) != 0 {
		t.Fatalf("the under-full node sends %v (on %v): only over-full nodes push", sends, on)
	}
}

func TestPlanBandAndHysteresis(t *testing.T) {
	// 15% from the mean: inside the start band, nothing moves ...
	ns := nodes(115, 100, 85)
	if sends, on := Plan("a", ns, testBand, false); on || sends != nil {
		t.Fatalf("inside the band: sends %v, on %v", sends, on)
	}
	// ... unless a rebalance is on: it goes on until within Settle.
	sends, on := Plan("a", ns, testBand, true)
	if !on || sends["c"] != 15 {
		t.Fatalf("a rebalance under way: sends %v, on %v; want 15 to c", sends, on)
	}
	// Within Settle it stops.
	if sends, on := Plan("a", nodes(105, 100, 95), testBand, true); on || sends != nil {
		t.Fatalf("within settle: sends %v, on %v", sends, on)
	}
	// Past Start it begins.
	if _, on := Plan("a", nodes(125, 100, 75), testBand, false); !on {
		t.Fatal("25% over the mean: no rebalance")
	}
}

func TestPlanFloor(t *testing.T) {
	// 50% off the mean but under a MiB: left alone ...
	if _, on := Plan("a", nodes(150_000, 100_000, 50_000), DefaultBand, false); on {
		t.Fatal("a rebalance over less than the floor")
	}
	// ... past it, moved; and once on, the floor does not stop it.
	if _, on := Plan("a", nodes(4<<20, 2<<20, 0), DefaultBand, false); !on {
		t.Fatal("no rebalance 2 MiB and 100% off the mean")
	}
	if sends, on := Plan("a", nodes(2<<20+300_000, 2<<20, 2<<20-300_000), DefaultBand, true); !on || sends == nil {
		t.Fatalf("a rebalance under way stopped at the floor, 14%% off the mean: %v %v", sends, on)
	}
}

func TestPlanSkipsDiskFullAndLoneNodes(t *testing.T) {
	ns := nodes(300, 300, 0, 0)
	ns[3].DiskFull = true
	sends, _ := Plan("a", ns, testBand, false)
	if _, ok := sends["d"]; ok || sends["c"] == 0 {
		t.Fatalf("sends %v: want c only (d's disk is full)", sends)
	}
	if sends, on := Plan("a", nodes(300), testBand, true); on || sends != nil {
		t.Fatalf("one node: sends %v, on %v", sends, on)
	}
}

// TestPlanConverges runs rounds of the plan on every node, each applying
// what it sends, and checks every node ends within the band and stays
// there (no oscillation).
func TestPlanConverges(t *testing.T) {
	ns := nodes(9000, 7000, 8000, 0, 0)
	active := map[cluster.NodeID]bool{}
	for round := range 20 {
		next := slices.Clone(ns)
		moved := false
		for _, n := range ns {
			sends, on := Plan(n.ID, ns, testBand, active[n.ID])
			active[n.ID] = on
			for to, b := range sends {
				moved = true
				for i := range next {
					switch next[i].ID {
					case to:
						next[i].Bytes += b
					case n.ID:
						next[i].Bytes -= b
					}
				}
			}
		}
		ns = next
		if !moved {
			if outside(ns, testBand.Start, 0) {
				t.Fatalf("round %d: stopped outside the band: %v", round, ns)
			}
			return
		}
	}
	t.Fatalf("still moving after 20 rounds: %v", ns)
}

func held(user, id string, bytes int64, replicas ...cluster.NodeID) Held {
	return Held{Object: "m/" + id + "/" + user, User: user, Replicas: replicas, Want: len(replicas), Bytes: bytes}
}

func liveSet(ids ...cluster.NodeID) map[cluster.NodeID]bool {
	m := map[cluster.NodeID]bool{}
	for _, n := range ids {
		m[n] = true
	}
	return m
}

func TestChooseMovesWholeUsersToNodesWithoutThem(t *testing.T) {
	var hs []Held
	for u := range 10 {
		for i := range 5 {
			// users 0-4 on a+b, users 5-9 on a+c.
			other := cluster.NodeID("b")
			if u >= 5 {
				other = "c"
			}
			hs = append(hs, held(fmt.Sprint("u", u), fmt.Sprint(u, "-", i), 10, "a", other))
		}
	}
	moves := Choose("a", hs, map[cluster.NodeID]int64{"d": 200, "c": 50}, liveSet("a", "b", "c", "d"))
	perUser := map[string]cluster.NodeID{}
	var toD, toC int64
	for _, mv := range moves {
		if len(mv.Replicas) != 2 || slices.Contains(mv.Replicas, "a") || !slices.Equal(mv.Gone, []cluster.NodeID{"a"}) {
			t.Fatalf("move %+v: want two replicas without a, a gone", mv)
		}
		if mv.Replicas[0] == mv.Replicas[1] {
			t.Fatalf("move %+v: two replicas on one node", mv)
		}
		if len(mv.From) != 2 || !slices.Contains(mv.From, "a") {
			t.Fatalf("move %+v: the set planned on is not named", mv)
		}
		u := mv.Object[strings.LastIndex(mv.Object, "/")+1:]
		to := cluster.NodeID("")
		for _, n := range mv.Replicas {
			if !slices.Contains(mv.From, n) {
				to = n
			}
		}
		if prev, ok := perUser[u]; ok && prev != to {
			t.Fatalf("user %s split over %s and %s", u, prev, to)
		}
		perUser[u] = to
		if to == "d" {
			toD += 10
		} else {
			toC += 10
		}
	}
	if toD != 200 || toC != 50 {
		t.Fatalf("sent %d to d, %d to c; want 200 and 50 (whole users that fit)", toD, toC)
	}
	for u, to := range perUser {
		if to == "c" && u >= "u5" {
			t.Fatalf("user %s moved to c, which holds its mail already", u)
		}
	}
}

func TestChooseLeavesRepairAndFullNodesAlone(t *testing.T) {
	hs := []Held{held("x", "1", 10, "a", "b"), held("y", "2", 10, "a", "gone")}
	moves := Choose("a", hs, map[cluster.NodeID]int64{"c": 100}, liveSet("a", "b", "c"))
	if len(moves) != 1 || moves[0].Object != "m/1/x" {
		t.Fatalf("moves %+v: want only x's message (y's has a replica away: repair's)", moves)
	}
	// Nothing to send (a disk-full node gets no entry from Plan).
	if moves := Choose("a", hs, nil, liveSet("a", "b", "c")); len(moves) != 0 {
		t.Fatalf("moves %+v with nothing to send", moves)
	}
	// A group bigger than any node's share stays.
	if moves := Choose("a", hs[:1], map[cluster.NodeID]int64{"c": 5}, liveSet("a", "b", "c")); len(moves) != 0 {
		t.Fatalf("moves %+v: a user bigger than the share moved", moves)
	}
}

func TestChooseDropsASurplusCopy(t *testing.T) {
	hs := []Held{{Object: "m/1/x", User: "x", Replicas: []cluster.NodeID{"a", "b", "c"}, Want: 2, Bytes: 10}}
	moves := Choose("a", hs, map[cluster.NodeID]int64{"d": 100}, liveSet("a", "b", "c", "d"))
	want := replica.Move{Object: "m/1/x", From: []cluster.NodeID{"a", "b", "c"}, Replicas: []cluster.NodeID{"b", "c"}, Gone: []cluster.NodeID{"a"}}
	if len(moves) != 1 || !slices.Equal(moves[0].Replicas, want.Replicas) || !slices.Equal(moves[0].Gone, want.Gone) {
		t.Fatalf("moves %+v, want %+v", moves, want)
	}
	// Without a Want, no copy is taken for a surplus one: the message
	// moves whole (its three copies stay three) or stays.
	hs[0].Want = 0
	for _, mv := range Choose("a", hs, map[cluster.NodeID]int64{"d": 100}, liveSet("a", "b", "c", "d")) {
		if len(mv.Replicas) != 3 {
			t.Fatalf("a message without a Want left with %v", mv.Replicas)
		}
	}
}

// With an island table a node rebalances only its own island's users'
// messages; without one, all.
func TestConfine(t *testing.T) {
	tb, err := island.Initial([]string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[bool]int{}
	for i := range 200 {
		u := fmt.Sprintf("user%d@example.org", i)
		mine := tb.Island(cluster.Bucket(u)) == "a"
		if Confine(tb, true, "a", u) != mine {
			t.Fatalf("%s of island %s: Confine for a node of a = %v", u, tb.Island(cluster.Bucket(u)), !mine)
		}
		if !Confine(island.Table{}, false, "a", u) {
			t.Fatalf("%s: confined without a table", u)
		}
		seen[mine]++
	}
	if seen[true] == 0 || seen[false] == 0 {
		t.Fatalf("users of one island only: %v", seen)
	}
}
