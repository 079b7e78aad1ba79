package writer

import (
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
)

func on(uid uint32, nodes ...cluster.NodeID) *ViewMsg {
	return &ViewMsg{Message: mailbox.Message{UID: uid, ID: string(rune('a' + uid)), Replicas: nodes}}
}

// A removal names as possibly emptied only the nodes of its messages'
// replica sets that no message left in the mailbox names: the usual
// expunge (other mail on the same nodes) triggers nothing.
func TestEmptiedNamesOnlyNodesNoMessageLeftNames(t *testing.T) {
	left := map[uint32]*ViewMsg{2: on(2, "a", "b"), 3: on(3, "b")}
	if got := emptied([]*ViewMsg{on(1, "a", "b")}, left); len(got) != 0 {
		t.Fatalf("emptied with a and b still named = %v, want none", got)
	}
	if got := emptied([]*ViewMsg{on(1, "a", "c"), on(4, "d")}, left); !slices.Equal(got, []cluster.NodeID{"c", "d"}) {
		t.Fatalf("emptied = %v, want c d", got)
	}
	if got := emptied([]*ViewMsg{on(1, "a", "b")}, nil); !slices.Equal(got, []cluster.NodeID{"a", "b"}) {
		t.Fatalf("emptied of an emptied mailbox = %v, want a b", got)
	}
	// A message stored before replica sets were recorded counts by the
	// nodes found holding it.
	old := &ViewMsg{Message: mailbox.Message{UID: 5, ID: "old"}, Holders: []cluster.NodeID{"c"}}
	if got := emptied([]*ViewMsg{on(1, "c")}, map[uint32]*ViewMsg{5: old}); len(got) != 0 {
		t.Fatalf("emptied with c holding an old message = %v, want none", got)
	}
}

// The vacate asks only nodes of the mail map no message of any view names,
// and nothing while an allocation is in flight (its delivery may be
// storing on any node, noted only at its confirmation) or a view lacks a
// fragment (a message there may name a node).
func TestVacateCandidates(t *testing.T) {
	inbox := &boxView{msgs: map[uint32]*ViewMsg{1: on(1, "a", "b")}, inflight: map[uint32]allocation{}}
	sent := &boxView{msgs: map[uint32]*ViewMsg{7: on(7, "c")}, inflight: map[uint32]allocation{}}
	boxes := map[uint32]*boxView{1: inbox, 2: sent}
	ask, busy := vacateCandidates(boxes, []cluster.NodeID{"a", "b", "c", "d", "e"})
	if busy || !slices.Equal(ask, []cluster.NodeID{"d", "e"}) {
		t.Fatalf("candidates = %v (busy %v), want d e", ask, busy)
	}
	sent.inflight[8] = allocation{at: time.Now()}
	if ask, busy := vacateCandidates(boxes, []cluster.NodeID{"a", "d"}); !busy || len(ask) != 0 {
		t.Fatalf("with an allocation in flight: candidates %v busy %v, want none, busy", ask, busy)
	}
	delete(sent.inflight, 8)
	inbox.partial = true
	if _, busy := vacateCandidates(boxes, []cluster.NodeID{"d"}); !busy {
		t.Fatal("a view loaded without a fragment is not busy")
	}
	inbox.partial = false
	if ask, busy := vacateCandidates(boxes, nil); busy || len(ask) != 0 {
		t.Fatalf("empty mail map: candidates %v busy %v", ask, busy)
	}
}
