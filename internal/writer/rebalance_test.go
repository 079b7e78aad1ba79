package writer

import (
	"errors"
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
)

// A rebalancing move is two versions: the new replica added, under policy
// all, then the set without the leaving node, told to it; a repair's move
// is one version, and a move whose first version failed has no second.
func TestRebalanceMoveIsTwoVersions(t *testing.T) {
	ids := func(s ...string) []cluster.NodeID {
		out := make([]cluster.NodeID, len(s))
		for i, x := range s {
			out[i] = cluster.NodeID(x)
		}
		return out
	}
	vm := &ViewMsg{Message: mailbox.Message{ID: "m1", Replicas: ids("a", "b")}, Holders: ids("a", "b")}
	move := replica.Move{Object: "m/m1/u", From: ids("a", "b"), Replicas: ids("b", "d"), Gone: ids("a")}
	first := moveChange(&mailbox.Object{ID: "m1"}, vm, move)
	if first.Policy != replica.All || !slices.Equal(first.Obj.Replicas, ids("a", "b", "d")) || len(first.Leaving) != 0 {
		t.Fatalf("first version: policy %q, replicas %v, leaving %v; want all, [a b d], none", first.Policy, first.Obj.Replicas, first.Leaving)
	}
	second, _ := leaveChanges([]*Change{first}, []*ViewMsg{vm}, []replica.Move{move})
	if len(second) != 1 || second[0].Policy != "" || !slices.Equal(second[0].Obj.Replicas, ids("b", "d")) || !slices.Equal(second[0].Leaving, ids("a")) {
		t.Fatalf("second version: %+v", second)
	}
	if !slices.Equal(first.Obj.Replicas, ids("a", "b", "d")) {
		t.Fatalf("the second version changed the first's object: %v", first.Obj.Replicas)
	}
	first.Err = errors.New("a target did not answer")
	if second, _ := leaveChanges([]*Change{first}, []*ViewMsg{vm}, []replica.Move{move}); len(second) != 0 {
		t.Fatalf("a second version after a failed first: %+v", second)
	}
	repair := replica.Move{Object: "m/m1/u", Replicas: ids("b", "d"), Gone: ids("a")}
	one := moveChange(&mailbox.Object{ID: "m1"}, vm, repair)
	if one.Policy != "" || !slices.Equal(one.Obj.Replicas, ids("b", "d")) || !slices.Equal(one.Leaving, ids("a")) {
		t.Fatalf("repair's move: %+v", one)
	}
	if second, _ := leaveChanges([]*Change{one}, []*ViewMsg{vm}, []replica.Move{repair}); len(second) != 0 {
		t.Fatalf("repair's move got a second version: %+v", second)
	}
}
