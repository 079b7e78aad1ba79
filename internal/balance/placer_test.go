package balance

import (
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
)

type members []cluster.MemberInfo

func (m members) Alive() []cluster.MemberInfo { return m }

func member(id cluster.NodeID, state string) cluster.MemberInfo {
	return cluster.MemberInfo{Member: cluster.Member{ID: id}, State: state}
}

// A replica set leaves out a suspect member (a store on it would wait for
// its RPC deadline) while live ones can fill it, and takes it only when
// they cannot.
func TestSetAvoidsSuspects(t *testing.T) {
	p := NewPlacer(members{member("a", "alive"), member("b", "suspect"), member("c", "alive")}, NewTracker(), 3)
	for i := 0; i < 50; i++ {
		set := p.Set([]cluster.NodeID{"b"}, 3, 2, nil)
		if len(set) != 2 || slices.Contains(set, "b") {
			t.Fatalf("set %v: want a and c, not the suspect b (even though it holds the user's mail)", set)
		}
	}
	set := p.Set(nil, 3, 3, nil)
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
			for _, n := range p.Set(mailMap, tc.user, tc.r, nil) {
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
