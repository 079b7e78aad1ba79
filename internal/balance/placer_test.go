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
