package writer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

func stamp(c uint64) replica.Stamp { return replica.Stamp{Clock: hlc.Timestamp(c), Node: "n"} }

func msg(id string, uid uint32, version uint64) mailbox.Message {
	return mailbox.Message{ID: id, UID: uid, ModSeq: version, Version: stamp(version)}
}

func frag(node string, msgs ...mailbox.Message) fragment {
	d := &mailbox.FragmentDigest{Messages: msgs}
	for _, m := range msgs {
		d.UIDNext = max(d.UIDNext, m.UID+1)
		d.HighestModSeq = max(d.HighestModSeq, m.ModSeq)
	}
	return fragment{node: cluster.NodeID(node), d: d}
}

func ids(vms []*ViewMsg) []string {
	var out []string
	for _, vm := range vms {
		out = append(out, vm.ID)
	}
	sort.Strings(out)
	return out
}

// Three messages that claim one UID (three writers for a moment) are all
// renumbered: none of them keeps the UID, so a session that saw one of them
// under it never sees another there.
func TestMergeRenumbersEveryMessageOfAThreeWayClash(t *testing.T) {
	mv := merge([]fragment{
		frag("a", msg("x", 7, 1)),
		frag("b", msg("y", 7, 2)),
		frag("c", msg("z", 7, 3), msg("w", 6, 3)),
	}, nil)
	if got := ids(mv.Clash); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("clash = %v, want x y z", got)
	}
	if _, ok := mv.Msgs[7]; ok {
		t.Fatalf("UID 7 still names %s", mv.Msgs[7].ID)
	}
	if mv.Msgs[6] == nil || mv.Msgs[6].ID != "w" {
		t.Fatalf("UID 6 = %v, want w", mv.Msgs[6])
	}
}

// A message renumbered after a clash, still listed under its old UID by a
// replica that has not caught up, is one message under its new UID, and the
// message that kept the old UID is not taken for a clash.
func TestMergeLaggingReplicaOfARenumberedMessage(t *testing.T) {
	mv := merge([]fragment{
		frag("a", msg("x", 9, 5), msg("y", 3, 1)),
		frag("b", msg("x", 3, 1), msg("y", 3, 1)), // has not heard of x's new UID
	}, nil)
	if len(mv.Clash) != 0 {
		t.Fatalf("clash = %v, want none", ids(mv.Clash))
	}
	if len(mv.Msgs) != 2 || mv.Msgs[9].ID != "x" || mv.Msgs[3].ID != "y" {
		t.Fatalf("view = %v, want x at 9 and y at 3", mv.Msgs)
	}
	if !slices.Equal(mv.Msgs[9].Holders, []cluster.NodeID{"a", "b"}) {
		t.Fatalf("x holders = %v, want a b (b holds an older version)", mv.Msgs[9].Holders)
	}
}

// merge, on fragments made from random histories (messages added,
// renumbered, flagged, removed; replicas that lag; writers that clashed):
// every message listed anywhere (and not removed) is in the view exactly
// once, in its newest version, held by every node that lists it; a UID
// names at most one message; messages whose newest versions share a UID are
// all renumbered.
func TestMergeSeeded(t *testing.T) {
	for seed := uint64(1); seed <= 500; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { mergeSeed(t, seed) })
	}
}

func mergeSeed(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0))
	nodes := []string{"a", "b", "c"}
	var clock uint64
	next := func() uint64 { clock++; return clock }
	// history[id] is every version of a message, oldest first.
	history := map[string][]mailbox.Message{}
	var uid uint32
	nIDs := 1 + r.IntN(25)
	for i := 0; i < nIDs; i++ {
		id := fmt.Sprintf("m%02d", i)
		if i > 0 && r.IntN(6) == 0 {
			// A second writer handed out a UID already used.
			other := history[fmt.Sprintf("m%02d", r.IntN(i))]
			history[id] = []mailbox.Message{msg(id, other[len(other)-1].UID, next())}
		} else {
			uid++
			history[id] = []mailbox.Message{msg(id, uid, next())}
		}
		for r.IntN(3) == 0 {
			last := history[id][len(history[id])-1]
			nm := msg(id, last.UID, next())
			if r.IntN(2) == 0 {
				uid++
				nm.UID = uid // renumbered
			}
			history[id] = append(history[id], nm)
		}
	}
	// removed: some messages were taken out at some version.
	gone := map[string]replica.Stamp{}
	for id, h := range history {
		if r.IntN(8) == 0 {
			gone[id] = h[r.IntN(len(h))].Version
		}
	}
	removed := func(id string, v replica.Stamp) bool {
		g, ok := gone[id]
		return ok && !g.Less(v)
	}
	// Each node lists some version of some messages.
	var frags []fragment
	listed := map[string][]mailbox.Message{} // id: the copies not removed
	holders := map[string][]cluster.NodeID{}
	for _, n := range nodes {
		var ms []mailbox.Message
		for id, h := range history {
			if r.IntN(4) == 0 {
				continue
			}
			m := h[len(h)-1]
			if r.IntN(3) == 0 {
				m = h[r.IntN(len(h))] // lagging
			}
			ms = append(ms, m)
			if !removed(id, m.Version) {
				listed[id] = append(listed[id], m)
				holders[id] = append(holders[id], cluster.NodeID(n))
			}
		}
		r.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		frags = append(frags, frag(n, ms...))
	}
	r.Shuffle(len(frags), func(i, j int) { frags[i], frags[j] = frags[j], frags[i] })

	mv := merge(frags, removed)

	seen := map[string]*ViewMsg{}
	for u, vm := range mv.Msgs {
		if vm.UID != u {
			t.Fatalf("UID %d holds %s with UID %d", u, vm.ID, vm.UID)
		}
		if seen[vm.ID] != nil {
			t.Fatalf("%s twice in the view", vm.ID)
		}
		seen[vm.ID] = vm
	}
	clashed := map[string]bool{}
	for _, vm := range mv.Clash {
		if seen[vm.ID] != nil || clashed[vm.ID] {
			t.Fatalf("%s twice (view and clash)", vm.ID)
		}
		clashed[vm.ID] = true
	}
	// newest[id] is the newest copy listed; byUID who claims each UID.
	byUID := map[uint32][]string{}
	for id, copies := range listed {
		newest := copies[0]
		for _, c := range copies[1:] {
			if newest.Version.Less(c.Version) {
				newest = c
			}
		}
		byUID[newest.UID] = append(byUID[newest.UID], id)
		vm := seen[id]
		if vm == nil {
			for _, c := range mv.Clash {
				if c.ID == id {
					vm = c
				}
			}
		}
		if vm == nil {
			t.Fatalf("%s listed by %v but not in the view", id, holders[id])
		}
		if vm.Version != newest.Version || vm.UID != newest.UID {
			t.Fatalf("%s in the view at version %v UID %d, newest listed is %v UID %d", id, vm.Version, vm.UID, newest.Version, newest.UID)
		}
		if want := cluster.NodeSet(holders[id]); !slices.Equal(vm.Holders, want) {
			t.Fatalf("%s holders %v, want %v", id, vm.Holders, want)
		}
	}
	if len(seen)+len(clashed) != len(listed) {
		t.Fatalf("view has %d messages and %d clashing, %d listed", len(seen), len(clashed), len(listed))
	}
	for u, claim := range byUID {
		if len(claim) > 1 {
			if _, ok := mv.Msgs[u]; ok {
				t.Fatalf("UID %d claimed by %v still names %s", u, claim, mv.Msgs[u].ID)
			}
			for _, id := range claim {
				if !clashed[id] {
					t.Fatalf("UID %d claimed by %v: %s not renumbered", u, claim, id)
				}
			}
		}
	}
	for _, f := range frags {
		if mv.UIDNext < f.d.UIDNext || mv.ModSeq < f.d.HighestModSeq {
			t.Fatalf("counters %d/%d behind fragment %s's %d/%d", mv.UIDNext, mv.ModSeq, f.node, f.d.UIDNext, f.d.HighestModSeq)
		}
	}
}

// counterSim plays a mailbox's writers one after another over a shared
// profile and the stored messages: allocations (stored or lost), kill -9
// (the next writer starts from the profile and the fragments), bucket
// handoffs (the next writer continues from the previous one's counters),
// clean releases (the unused block given back) and, if lose is set,
// reservations lost with the profile replica that had them.
type counterSim struct {
	r       *rand.Rand
	def     userdb.MailboxDef
	prevDef userdb.MailboxDef // the profile before the last reservation
	w       counters
	loaded  bool
	stored  map[uint32]bool
	maxUID  uint32 // highest UID stored
	maxMod  uint64 // highest MODSEQ stored
	handed  map[uint32]bool
	lastMod uint64
	log     []string
}

func (s *counterSim) fragment() (uint32, uint64) {
	if s.maxUID == 0 {
		return 0, s.maxMod
	}
	return s.maxUID + 1, s.maxMod
}

// alloc is the writer's alloc: load at the first use (absorb the profile,
// follow the fragments), reserve, take.
func (s *counterSim) alloc(t *testing.T, strict bool) {
	if !s.loaded {
		s.w.absorb(&s.def)
		s.w.follow(s.fragment())
		s.loaded = true
	}
	write, uidEnd, modEnd, exhausted := s.w.planReserve(&s.def, 1, 1)
	if exhausted {
		t.Fatalf("UIDs exhausted at %d\n%v", s.w.uidNext, s.log)
	}
	if write {
		s.prevDef = s.def
		s.def.UIDReserved, s.def.ModSeqReserved = uidEnd, modEnd
		s.w.mineUID, s.w.mineMod = uidEnd, modEnd
	}
	uid, mod := s.w.take()
	s.log = append(s.log, fmt.Sprintf("alloc %d/%d", uid, mod))
	if uid >= s.def.UIDReserved || mod >= s.def.ModSeqReserved {
		t.Fatalf("handed %d/%d outside the reservation %d/%d\n%v", uid, mod, s.def.UIDReserved, s.def.ModSeqReserved, s.log)
	}
	if s.stored[uid] {
		t.Fatalf("handed UID %d of a stored message again\n%v", uid, s.log)
	}
	if mod <= s.maxMod {
		t.Fatalf("handed MODSEQ %d, not past the stored %d\n%v", mod, s.maxMod, s.log)
	}
	if strict {
		if s.handed[uid] {
			t.Fatalf("handed UID %d twice\n%v", uid, s.log)
		}
		if mod <= s.lastMod {
			t.Fatalf("handed MODSEQ %d after %d\n%v", mod, s.lastMod, s.log)
		}
	}
	s.handed[uid], s.lastMod = true, mod
	if s.r.IntN(5) > 0 { // stored; else the delivery failed and cancelled
		s.stored[uid] = true
		s.maxUID, s.maxMod = max(s.maxUID, uid), max(s.maxMod, mod)
	}
}

func (s *counterSim) step(t *testing.T, lose bool) {
	switch k := s.r.IntN(20); {
	case k < 14:
		s.alloc(t, !lose)
	case k < 16: // kill -9
		s.log = append(s.log, "kill")
		s.w, s.loaded = startCounters(&s.def), false
	case k < 18: // handoff: a new manager takes the writer's state
		s.log = append(s.log, "handoff")
		var nw counters
		nw.continueFrom(s.w)
		s.w, s.loaded = nw, false
	case k < 19: // clean shutdown: Release gives back the unused block
		s.log = append(s.log, "release")
		if s.def.UIDReserved == s.w.mineUID && s.def.ModSeqReserved == s.w.mineMod {
			s.def.UIDReserved, s.def.ModSeqReserved = s.w.uidNext, s.w.modseq
		}
		s.w, s.loaded = startCounters(&s.def), false
	default:
		if lose && s.r.IntN(2) == 0 {
			// The profile replica with the newest reservation died with
			// the writer: the next writer sees the one before.
			s.log = append(s.log, "kill, reservation lost")
			s.def = s.prevDef
			s.w, s.loaded = startCounters(&s.def), false
		} else {
			s.alloc(t, !lose)
		}
	}
}

func runCounters(t *testing.T, seed uint64, lose bool) {
	s := &counterSim{r: rand.New(rand.NewPCG(seed, 1)), stored: map[uint32]bool{}, handed: map[uint32]bool{}}
	s.w = startCounters(&s.def)
	for i := 0; i < 3000; i++ {
		s.step(t, lose)
	}
	if len(s.stored) == 0 {
		t.Fatal("nothing stored")
	}
}

// No UID is handed out twice and MODSEQs only grow, through any sequence of
// crashes, handoffs and clean restarts of a mailbox's writer.
func TestCountersNeverHandAUIDTwice(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runCounters(t, seed, false) })
	}
}

// When the newest reservation is lost with a profile replica, the next
// writer may hand out again a UID that was never stored, but never one that
// was (it follows the fragments), and its MODSEQs are past every stored one.
func TestCountersAfterALostReservation(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runCounters(t, seed, true) })
	}
}

// A handoff to a writer that then sees, in the profile, a reservation it did
// not write (another writer's, after a partition) jumps past it.
func TestCountersAbsorbAnotherWritersReservation(t *testing.T) {
	def := userdb.MailboxDef{UIDReserved: 100, ModSeqReserved: 100}
	c := startCounters(&def)
	c.uidNext, c.modseq = 40, 40
	def.UIDReserved, def.ModSeqReserved = 600, 700 // written elsewhere
	c.absorb(&def)
	if c.uidNext != 600 || c.modseq != 700 {
		t.Fatalf("counters %d/%d, want 600/700", c.uidNext, c.modseq)
	}
	// Its own reservation is not jumped past.
	own := userdb.MailboxDef{UIDReserved: 100, ModSeqReserved: 100}
	c = startCounters(&own)
	c.uidNext, c.modseq = 40, 40
	c.absorb(&own)
	if c.uidNext != 40 {
		t.Fatalf("jumped past its own reservation to %d", c.uidNext)
	}
}
