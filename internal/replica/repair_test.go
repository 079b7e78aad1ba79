package replica

import (
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
)

// judgeRepair's cases, islands "a" and "b" named by the nodes' first
// letter: the object's user belongs to island a.
func TestJudgeRepair(t *testing.T) {
	in := func(n cluster.NodeID) bool { return n[0] == 'a' }
	any := func(cluster.NodeID) bool { return true }
	replaced := func(n cluster.NodeID) bool { return n != "a9" } // a9 was away only briefly
	alive := map[cluster.NodeID]bool{"a1": true, "a2": true, "a3": true, "b1": true, "b2": true}
	ids := func(ns ...cluster.NodeID) []cluster.NodeID { return ns }
	for _, tc := range []struct {
		name      string
		self      cluster.NodeID
		replicas  []cluster.NodeID
		in        func(cluster.NodeID) bool
		act       bool
		keep      []cluster.NodeID
		add       int
		gone      []cluster.NodeID
		copyFirst bool
		misplaced bool
	}{
		{name: "in place and enough", self: "a1", replicas: ids("a1", "a2"), in: in},
		{name: "without islands nothing is misplaced", self: "a1", replicas: ids("a1", "b1"), in: any},
		{name: "a lost replica, replaced", self: "a1", replicas: ids("a1", "a8"), in: in,
			act: true, keep: ids("a1"), add: 1, gone: ids("a8")},
		{name: "a lost replica that may come back", self: "a1", replicas: ids("a1", "a9"), in: in},
		{name: "another replica plans", self: "a2", replicas: ids("a1", "a2", "b1"), in: in, misplaced: true},
		{name: "moved island: copy in the island first, then drop", self: "b1", replicas: ids("b1", "b2"), in: in,
			act: true, add: 2, gone: ids("b1", "b2"), copyFirst: true, misplaced: true},
		{name: "half moved", self: "a1", replicas: ids("a1", "b1"), in: in,
			act: true, keep: ids("a1"), add: 1, gone: ids("b1"), copyFirst: true, misplaced: true},
		{name: "enough in place: the misplaced copy only goes", self: "a1", replicas: ids("a1", "a2", "b1"), in: in,
			act: true, keep: ids("a1", "a2"), gone: ids("b1"), misplaced: true},
		{name: "misplaced and a lost replica: add first, keep the misplaced", self: "a1", replicas: ids("a1", "b1", "a8"), in: in,
			act: true, keep: ids("a1", "b1"), add: 1, gone: ids("a8"), misplaced: true},
	} {
		j := judgeRepair(tc.self, Held{Object: "m/x", User: "u@x", Replicas: tc.replicas, Want: 2}, alive, tc.in, replaced, 5)
		if j.act != tc.act || j.add != tc.add || j.copyFirst != tc.copyFirst || j.misplaced != tc.misplaced ||
			!slices.Equal(j.keep, tc.keep) || !slices.Equal(j.gone, tc.gone) {
			t.Errorf("%s: got %+v", tc.name, j)
		}
	}
}
