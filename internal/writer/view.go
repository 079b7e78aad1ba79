package writer

// The writer's decisions apart from its I/O (in the style of etcd's raft:
// pure steps decide, the caller reads, writes and replicates): how a
// mailbox view is made from the fragments that answered (merge), and how
// UID and MODSEQ counters move and when a reservation must be written
// (counters). view_test.go drives them with seeded interleavings, without
// sockets or Pebble.

import (
	"slices"
	"sort"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// fragment is one node's part of a mailbox, as read.
type fragment struct {
	node cluster.NodeID
	d    *mailbox.FragmentDigest
}

// Contents are a mailbox's messages as a Storage read them (from the
// fragments that answered, merged, for the native store).
type Contents struct {
	Msgs map[uint32]*ViewMsg
	// Clash are messages that claimed one UID with another message: all of
	// them get new UIDs, so a UID never names two messages (BLUEPRINT
	// invariant 5).
	Clash []*ViewMsg
	// UIDNext and ModSeq are past everything the storage shows used; Used
	// and UsedMod are UIDNEXT and HIGHESTMODSEQ as it shows them.
	UIDNext uint32
	ModSeq  uint64
	Used    uint32
	UsedMod uint64
	// Partial says the view must be read again soon: some of the mailbox
	// could not be read (a fragment's node did not answer), or may still
	// change below the writer's counters (another writer's deliveries in
	// flight, after a takeover).
	Partial bool
}

// merge makes a view from the fragments that answered. Replicas of one
// message (one id) merge whatever UID each holds it under: the newest
// version wins and every node listing it is a holder (a renumbered message
// still listed under its old UID by a replica that has not caught up is one
// message, not two). Messages removed is true for (removed by this writer,
// not yet applied by a replica) are left out. Then messages that claim one
// UID with different ids all go to clash.
func merge(frags []fragment, removed func(id string, v replica.Stamp) bool) Contents {
	out := Contents{Msgs: map[uint32]*ViewMsg{}}
	byID := map[string]*ViewMsg{}
	var order []string
	var lastReplicas []cluster.NodeID
	for _, f := range frags {
		d := f.d
		// One slice of holders serves every message first found in this
		// fragment, and one of replicas every run of messages with the
		// same set (a view of 100,000 messages would otherwise hold
		// 200,000 small slices); both are clipped, so an append copies.
		holders := []cluster.NodeID{f.node}
		out.UIDNext = max(out.UIDNext, d.UIDNext)
		out.ModSeq = max(out.ModSeq, d.HighestModSeq)
		if d.UIDNext > 0 {
			out.Used = max(out.Used, d.UIDNext)
		}
		out.UsedMod = max(out.UsedMod, d.HighestModSeq)
		for _, msg := range d.Messages {
			if removed != nil && removed(msg.ID, msg.Version) {
				continue
			}
			msg.Replicas = reuse(&lastReplicas, msg.Replicas)
			vm := byID[msg.ID]
			if vm == nil {
				byID[msg.ID] = &ViewMsg{Message: msg, Holders: holders}
				order = append(order, msg.ID)
				continue
			}
			vm.Holders = cluster.NodeSet(append(vm.Holders, f.node))
			if vm.Version.Less(msg.Version) {
				vm.Message = msg
			}
		}
	}
	byUID := map[uint32][]*ViewMsg{}
	var uids []uint32
	for _, id := range order {
		vm := byID[id]
		if len(byUID[vm.UID]) == 0 {
			uids = append(uids, vm.UID)
		}
		byUID[vm.UID] = append(byUID[vm.UID], vm)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	for _, uid := range uids {
		vms := byUID[uid]
		if len(vms) == 1 {
			out.Msgs[uid] = vms[0]
			continue
		}
		sort.Slice(vms, func(i, j int) bool { return vms[i].ID < vms[j].ID })
		out.Clash = append(out.Clash, vms...)
	}
	return out
}

// counters are a mailbox writer's UID and MODSEQ state: the next UID to
// hand out, the highest MODSEQ handed out, and the reserved ends this
// writer wrote into the profile itself (or started from).
type counters struct {
	uidNext uint32
	modseq  uint64
	mineUID uint32
	mineMod uint64
}

// startCounters are the counters of a writer that starts from the profile
// alone: past every UID and MODSEQ the last reservation covered.
func startCounters(def *userdb.MailboxDef) counters {
	return counters{uidNext: max(def.UIDReserved, 1), modseq: max(def.ModSeqReserved, 1),
		mineUID: def.UIDReserved, mineMod: def.ModSeqReserved}
}

// absorb moves the counters past reserved ends in the profile that this
// writer did not write: another writer may have handed out anything below
// them.
func (c *counters) absorb(def *userdb.MailboxDef) {
	if def.UIDReserved != c.mineUID && def.UIDReserved > c.uidNext {
		c.uidNext = def.UIDReserved
	}
	if def.ModSeqReserved != c.mineMod && def.ModSeqReserved > c.modseq {
		c.modseq = def.ModSeqReserved
	}
}

// planReserve says whether uids more UIDs and modseqs more MODSEQs are
// covered by the profile's reservation; if not it returns the new ends to
// write into the profile (a block past what is needed) and whether the
// UIDs would run out.
func (c *counters) planReserve(def *userdb.MailboxDef, uids, modseqs int) (write bool, uidEnd uint32, modEnd uint64, exhausted bool) {
	c.absorb(def)
	needUID := uint64(c.uidNext)+uint64(uids) > uint64(def.UIDReserved)
	needMod := c.modseq+uint64(modseqs) >= def.ModSeqReserved
	if !needUID && !needMod {
		return false, 0, 0, false
	}
	if uint64(c.uidNext)+uint64(uids)+reserveBlock >= 1<<32 {
		return false, 0, 0, true
	}
	return true, c.uidNext + uint32(uids) + reserveBlock, c.modseq + uint64(modseqs) + reserveBlock, false
}

// take hands out the next UID and MODSEQ (covered by a reservation).
func (c *counters) take() (uint32, uint64) {
	uid := c.uidNext
	c.uidNext++
	c.modseq++
	return uid, c.modseq
}

// continueFrom takes over a previous writer's counters (a bucket handoff):
// past everything it handed out, and its reservation as this writer's own
// if this writer has reserved nothing yet, so absorb jumps past a block
// only if the profile shows another writer's reservation since.
func (c *counters) continueFrom(prev counters) {
	c.uidNext = max(c.uidNext, prev.uidNext)
	c.modseq = max(c.modseq, prev.modseq)
	if c.mineUID == 0 && c.mineMod == 0 {
		c.mineUID, c.mineMod = prev.mineUID, prev.mineMod
	}
}

// follow moves the counters past a UID and MODSEQ used elsewhere (a
// fragment's, or another writer's confirmed allocation).
func (c *counters) follow(uid uint32, modseq uint64) {
	c.uidNext = max(c.uidNext, uid)
	c.modseq = max(c.modseq, modseq)
}

// reuse returns *last if ns holds the same nodes, else makes ns the last
// one: runs of messages with the same node set then share one slice
// instead of a slice each. It is clipped, so an append to one message's
// set copies rather than changes the others'.
func reuse(last *[]cluster.NodeID, ns []cluster.NodeID) []cluster.NodeID {
	if slices.Equal(ns, *last) {
		return *last
	}
	*last = slices.Clip(ns)
	return *last
}
