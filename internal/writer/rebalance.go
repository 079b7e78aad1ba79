package writer

import (
	"slices"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
)

// The rebalancer's moves through the writer (internal/rebalance, issue 17
// item 6). A repair's move leaves nodes that are gone: the live replicas
// it keeps hold the message meanwhile. A rebalancing move leaves a live
// node that holds one of the R copies, and one write to the new set would
// let that node drop its copy (when it coordinates, at once) before the
// new replica has the message: a moment with R-1 copies, and none at all
// of the bytes to fill the new replica from if the coordinator was the
// leaving node. So a move planned on a set (Move.From) is two writes under
// the user's writer lock: the set with the new replicas added, which every
// target must hold durably (replica.All: each applies it in an fsync'd
// batch before it acknowledges); then the new set, which the leaving node
// drops. A message expunged in between cannot come back: the expunge
// takes the same lock, and the second write is skipped for a change whose
// first failed.

// moveChange is the first (or only) change of a move of message o.
func moveChange(o *mailbox.Object, vm *ViewMsg, mv replica.Move) *Change {
	if len(mv.From) == 0 {
		o.Replicas = mv.Replicas
		return &Change{Obj: o, Holders: vm.Holders, Leaving: mv.Gone}
	}
	o.Replicas = cluster.NodeSet(append(slices.Clone(mv.From), mv.Replicas...))
	return &Change{Obj: o, Holders: vm.Holders, Policy: replica.All}
}

// leaveChanges returns the second writes of the two-write moves whose
// first write succeeded: the message with its new set, told to the
// leaving nodes too so they drop their copies.
func leaveChanges(first []*Change, views []*ViewMsg, moves []replica.Move) ([]*Change, []*ViewMsg) {
	var out []*Change
	var outViews []*ViewMsg
	for i, c := range first {
		mv := moves[i]
		if c.Err != nil || len(mv.From) == 0 {
			continue
		}
		o := *c.Obj
		o.Replicas = mv.Replicas
		out = append(out, &Change{Obj: &o, Holders: views[i].Holders, Leaving: mv.Gone})
		outViews = append(outViews, views[i])
	}
	return out, outViews
}
