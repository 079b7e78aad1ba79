package balance

import (
	"fmt"
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
)

type members []cluster.MemberInfo

// Eligible is the membership's rule (cluster.Eligible) without a table.
func (m members) Eligible(b uint8) ([]cluster.MemberInfo, error) {
	return cluster.Eligible(b, m, island.Table{}, false)
}

// islanded is a membership view with an island table installed.
type islanded struct {
	alive []cluster.MemberInfo
	table island.Table
}

func (m islanded) Eligible(b uint8) ([]cluster.MemberInfo, error) {
	return cluster.Eligible(b, m.alive, m.table, true)
}

func member(id cluster.NodeID, state string) cluster.MemberInfo {
	return cluster.MemberInfo{Member: cluster.Member{ID: id}, State: state}
}

// A replica set leaves out a suspect member (a store on it would wait for
// its RPC deadline) while live ones can fill it, and takes it only when
// they cannot.
func TestSetAvoidsSuspects(t *testing.T) {
	p := NewPlacer(members{member("a", "alive"), member("b", "suspect"), member("c", "alive")}, NewTracker(), 3)
	for i := 0; i < 50; i++ {
		set := p.Set(0, []cluster.NodeID{"b"}, 3, 2, nil)
		if len(set) != 2 || slices.Contains(set, "b") {
			t.Fatalf("set %v: want a and c, not the suspect b (even though it holds the user's mail)", set)
		}
	}
	set := p.Set(0, nil, 3, 3, nil)
	if len(set) != 3 || set[2] != "b" {
		t.Fatalf("set of 3 from 2 live and 1 suspect: %v, want the suspect last", set)
	}
}

// A user's mail, placed message after message with the chosen nodes added
// to its mail map as a delivery's confirmation adds them, stays on the
// cluster's spread when the user sets none (NewPlacer's, from --spread) and
// on the user's own when it does; never fewer nodes than the replicas.
func TestSetKeepsAUsersMailWithinItsSpread(t *testing.T) {
	all := members{member("a", "alive"), member("b", "alive"), member("c", "alive"), member("d", "alive"), member("e", "alive")}
	for _, tc := range []struct {
		cluster, user, r, want int
	}{
		{cluster: 1, user: 0, r: 1, want: 1},
		{cluster: 1, user: 3, r: 1, want: 3},
		{cluster: 3, user: 0, r: 2, want: 3},
		{cluster: 1, user: 0, r: 2, want: 2}, // at least R
		{cluster: 5, user: 2, r: 1, want: 2},
	} {
		p := NewPlacer(all, NewTracker(), tc.cluster)
		var mailMap []cluster.NodeID
		for i := 0; i < 200; i++ {
			for _, n := range p.Set(0, mailMap, tc.user, tc.r, nil) {
				if !slices.Contains(mailMap, n) {
					mailMap = append(mailMap, n)
				}
			}
		}
		if len(mailMap) != tc.want {
			t.Errorf("cluster spread %d, user spread %d, R=%d: mail on %v, want %d nodes", tc.cluster, tc.user, tc.r, mailMap, tc.want)
		}
	}
}

// With an island table, a new message's replicas and a repair's new
// replicas are only ever nodes of the user's island, whatever the loads
// and the holders (a holder outside it, from before the table, is not
// chosen again); a bucket whose island is down gets no set at all rather
// than nodes of another island.
func TestSetStaysInTheUsersIsland(t *testing.T) {
	in := func(id cluster.NodeID, isl string) cluster.MemberInfo {
		m := member(id, "alive")
		m.Island = isl
		return m
	}
	table, err := island.Initial([]string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	view := islanded{alive: []cluster.MemberInfo{in("a1", "a"), in("a2", "a"), in("b1", "b"), in("b2", "b"), in("b3", "b")}, table: table}
	p := NewPlacer(view, NewTracker(), 5)
	for b := 0; b < cluster.Buckets; b++ {
		want := table.Island(uint8(b))
		for _, set := range [][]cluster.NodeID{p.Set(uint8(b), []cluster.NodeID{"a1", "b1"}, 0, 2, nil), p.Replicas(uint8(b), nil, 2)} {
			if len(set) != 2 {
				t.Fatalf("bucket %d: set %v, want 2 nodes of island %s", b, set, want)
			}
			for _, n := range set {
				if string(n[0]) != want {
					t.Fatalf("bucket %d of island %s: set %v has %s", b, want, set, n)
				}
			}
		}
	}
	down := islanded{alive: view.alive[2:], table: table}
	p = NewPlacer(down, NewTracker(), 5)
	for b := 0; b < cluster.Buckets; b++ {
		set := p.Set(uint8(b), nil, 0, 2, nil)
		if table.Island(uint8(b)) == "a" && len(set) != 0 {
			t.Fatalf("bucket %d of island a, which is down: set %v, want none", b, set)
		}
	}
}

// The Random policy picks among the same candidates as Dynamic but blind to
// load: a node with a long disk queue still gets about its share, where
// Dynamic never picks it while another candidate is idle.
func TestRandomPolicyIsBlindToLoad(t *testing.T) {
	all := members{member("a", "alive"), member("b", "alive")}
	loads := NewTracker()
	loads.Observe("a", Load{Pending: 50})
	p := NewPlacer(all, loads, 2)
	for range 50 {
		if set := p.Place("u@x", nil, 2, 1, nil); set[0] != "b" {
			t.Fatalf("dynamic placed on %v, the busy node", set)
		}
	}
	p.SetPolicy(Random)
	onA := 0
	for range 400 {
		if p.Place("u@x", nil, 2, 1, nil)[0] == "a" {
			onA++
		}
	}
	if onA < 120 || onA > 280 {
		t.Fatalf("random placed %d of 400 on the busy node, want about half", onA)
	}
}

// The Static policy gives a user the same nodes whatever their load and
// mail map, spreads users over the cluster, and moves only the users of a
// node that leaves.
func TestStaticPolicyKeepsAUsersNodes(t *testing.T) {
	all := members{member("a", "alive"), member("b", "alive"), member("c", "alive"), member("d", "alive")}
	loads := NewTracker()
	p := NewPlacer(all, loads, 2)
	p.SetPolicy(Static)
	first := map[string]cluster.NodeID{}
	count := map[cluster.NodeID]int{}
	for i := range 400 {
		u := fmt.Sprintf("user%d@x", i)
		set := p.Place(u, []cluster.NodeID{"d"}, 1, 1, nil)
		loads.Observe(set[0], Load{Pending: i}) // load changes nothing
		if again := p.Place(u, nil, 1, 1, nil); len(set) != 1 || again[0] != set[0] {
			t.Fatalf("%s: placed on %v, then %v", u, set, again)
		}
		first[u] = set[0]
		count[set[0]]++
	}
	for _, n := range []cluster.NodeID{"a", "b", "c", "d"} {
		if count[n] < 60 {
			t.Fatalf("node %s holds %d of 400 users, want about 100: %v", n, count[n], count)
		}
	}
	// d leaves: its users move, no other user does.
	p = NewPlacer(all[:3], NewTracker(), 2)
	p.SetPolicy(Static)
	for u, n := range first {
		if got := p.Place(u, nil, 1, 1, nil)[0]; n != "d" && got != n {
			t.Fatalf("%s moved from %s to %s when d left", u, n, got)
		}
	}
	// Two replicas within a spread of 2: always the same two nodes.
	set := p.Place("user1@x", nil, 2, 2, nil)
	for range 20 {
		again := p.Place("user1@x", nil, 2, 2, nil)
		slices.Sort(again)
		s := slices.Clone(set)
		slices.Sort(s)
		if len(again) != 2 || !slices.Equal(again, s) {
			t.Fatalf("replica sets %v and %v", set, again)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{"": Dynamic, "dynamic": Dynamic, "random": Random, "static": Static} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParsePolicy("roundrobin"); err == nil {
		t.Error("ParsePolicy(roundrobin): no error")
	}
}
