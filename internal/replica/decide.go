package replica

// The decisions of a write, apart from its I/O (in the style of etcd's raft:
// a pure step decides, the caller persists and sends). Manager.Write plans
// with planWrite, applies and logs locally, judges the local outcomes with
// judgeLocal, pushes, and feeds every push result to a tally until the
// tally says the write is decided. Each is tested on its own with seeded
// interleavings (decide_test.go), no sockets or Pebble.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/quillmail/quill/internal/cluster"
)

// writePlan is what a write decides before any I/O.
type writePlan struct {
	kind      string
	targets   []cluster.NodeID // every target, once each
	remaining []cluster.NodeID // the targets other than this node
	local     bool             // this node is a target
	content   bool             // some update carries content (a blob)
	need      int              // targets that must hold it for the policy
}

// planWrite checks that the updates of a write share kind and targets and
// works out whom it goes to and how many must hold it.
func planWrite(self cluster.NodeID, req *WriteRequest) (writePlan, error) {
	ups := req.Updates
	p := writePlan{kind: ups[0].Kind(), targets: without(ups[0].Targets)}
	set := sorted(p.targets)
	for _, u := range ups {
		if u.Kind() != p.kind || !slices.Equal(sorted(without(u.Targets)), set) {
			return writePlan{}, fmt.Errorf("update of %s: one write must share kind and targets", u.Object)
		}
		p.content = p.content || len(u.Blob) > 0
	}
	p.remaining = without(p.targets, self)
	p.local = slices.Contains(p.targets, self)
	p.need = req.Policy.Need(max(len(p.targets), req.Want))
	return p, nil
}

// sorted returns a sorted copy of a node set.
func sorted(ns []cluster.NodeID) []cluster.NodeID {
	out := slices.Clone(ns)
	slices.Sort(out)
	return out
}

// loggedHere says which updates this node keeps in its log: those it
// applied, when other targets remain to be told.
func (p writePlan) loggedHere(o Outcome) bool { return o == Applied && len(p.remaining) > 0 }

// errConflict is a local apply refused because the update's place holds
// another object.
var errConflict = errors.New("its place holds another object")

// judgeLocal decides from the outcomes of applying a write here whether the
// write goes on (this node holds every update: applied, or a newer version
// was here already) and names the objects refused for a conflict.
func judgeLocal(objects []string, outs []Outcome) (conflicts []string, err error) {
	for i, o := range outs {
		switch o {
		case Applied, Stale:
		case Conflict:
			return []string{objects[i]}, fmt.Errorf("apply update of %s here: %w", objects[i], errConflict)
		default:
			return nil, fmt.Errorf("apply update of %s here: not applied", objects[i])
		}
	}
	return nil, nil
}

// tally counts a write's acknowledgements against its policy as the push
// results come in.
type tally struct {
	need    int
	waiting int // pushes not answered yet
	acked   []cluster.NodeID
	errs    []error
}

func newTally(need int, acked []cluster.NodeID, pushes int) *tally {
	return &tally{need: need, waiting: pushes, acked: slices.Clone(acked)}
}

// step records one push result and reports whether the write is decided:
// the policy is met, or no answer left could meet it.
func (t *tally) step(n cluster.NodeID, err error) bool {
	t.waiting--
	if err == nil {
		t.acked = append(t.acked, n)
	} else {
		t.errs = append(t.errs, err)
	}
	return t.decided()
}

func (t *tally) decided() bool { return t.met() || len(t.acked)+t.waiting < t.need || t.waiting <= 0 }

func (t *tally) met() bool { return len(t.acked) >= t.need }

// verdict is the write's answer: the targets that hold it, and ErrPolicy
// (with why) if fewer than the policy asks for.
func (t *tally) verdict(object string) (*WriteReply, error) {
	rep := &WriteReply{Acked: t.acked}
	if t.met() {
		return rep, nil
	}
	if len(t.errs) == 0 {
		return rep, fmt.Errorf("update of %s: %d of %d targets: %w", object, len(t.acked), t.need, ErrPolicy)
	}
	return rep, fmt.Errorf("update of %s: %d of %d targets: %w: %w", object, len(t.acked), t.need, ErrPolicy, errors.Join(t.errs...))
}
