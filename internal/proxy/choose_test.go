package proxy

import (
	"context"
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
)

type members []cluster.MemberInfo

func (m members) Alive() []cluster.MemberInfo { return m }
func (m members) Degraded() bool              { return false }

// Call answers a body read with the name of the node asked.
func (m members) Call(ctx context.Context, node cluster.NodeID, method string, req, resp any) error {
	if r, ok := resp.(*BodyReply); ok {
		r.Raw = []byte(node)
	}
	return nil
}

func member(id cluster.NodeID, state string) cluster.MemberInfo {
	return cluster.MemberInfo{Member: cluster.Member{ID: id}, State: state}
}

// A replica set leaves out a suspect member (a store on it would wait for
// its RPC deadline) while live ones can fill it, and takes it only when
// they cannot.
func TestChooseSetAvoidsSuspects(t *testing.T) {
	p := &Proxy{Self: "a", Loads: balance.NewTracker(), Spread: 3,
		Peers: members{member("a", "alive"), member("b", "suspect"), member("c", "alive")}}
	for i := 0; i < 50; i++ {
		set := p.chooseSet([]cluster.NodeID{"b"}, 3, 2, nil)
		if len(set) != 2 || slices.Contains(set, "b") {
			t.Fatalf("set %v: want a and c, not the suspect b (even though it holds the user's mail)", set)
		}
	}
	set := p.chooseSet(nil, 3, 3, nil)
	if len(set) != 3 || set[2] != "b" {
		t.Fatalf("set of 3 from 2 live and 1 suspect: %v, want the suspect last", set)
	}
}

// A body is read from a live holder before a suspect one, whatever their
// loads.
func TestBodyAsksSuspectHoldersLast(t *testing.T) {
	loads := balance.NewTracker()
	loads.Observe("c", balance.Load{Pending: 50})
	p := &Proxy{Self: "a", Loads: loads, Peers: members{member("a", "alive"), member("b", "suspect"), member("c", "alive")}}
	b, err := p.body(context.Background(), []cluster.NodeID{"b", "c"}, "u@example.org", "m1")
	if err != nil || string(b) != "c" {
		t.Fatalf("read from %q (%v), want the live holder c, not the suspect b", b, err)
	}
}
