package storemigrate

// The decisions of a migration, without I/O: how the replicas that several
// stopped nodes hold of one object merge into one state (Porcupine §4.1:
// the newest stamp wins, a tombstone included), where the copied mailbox's
// UID/MODSEQ fence must end, and which mailbox definitions a native node
// gets back from Cassandra's rows.

import (
	"slices"
	"sort"

	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// NewestProfile returns the newest of the versions several nodes hold of
// one profile (a tombstone is a version like any other: a deleted user
// whose delete one replica missed stays deleted). nil for none.
func NewestProfile(ps []*userdb.Profile) *userdb.Profile {
	var best *userdb.Profile
	for _, p := range ps {
		if p != nil && (best == nil || p.Version > best.Version) {
			best = p
		}
	}
	return best
}

// Replica is one node's record of a message: the mailbox (UIDVALIDITY) it
// lists it in, and the record with its stamp (Version).
type Replica struct {
	Node        int
	UIDValidity uint32
	Message     mailbox.Message
}

// Fate is what a message becomes once its replicas and tombstones merged.
type Fate struct {
	// Keep is false when a tombstone is newer than every record: the
	// message was expunged (or moved away by a newer update that left
	// it nowhere), and must not come back.
	Keep bool
	// UIDValidity and Message are the newest record: where the message
	// is when kept; where it was last listed when not (so the
	// destination can delete that record at Stamp).
	UIDValidity uint32
	Message     mailbox.Message
	// Stamp is the winning version: the record's, or the tombstone's.
	Stamp replica.Stamp
	// Holders are the nodes with any record of the message: its bytes,
	// immutable under its id, are on each.
	Holders []int
}

// MergeMessage decides one message (one user, one id) from every record
// and every tombstone the nodes hold of it. A record is newer than another
// by its stamp; a tombstone wins over records stamped before it. records
// must not be empty.
func MergeMessage(records []Replica, tombstones []replica.Stamp) Fate {
	var f Fate
	for i, r := range records {
		if i == 0 || f.Message.Version.Less(r.Message.Version) {
			f.UIDValidity, f.Message = r.UIDValidity, r.Message
		}
		if !slices.Contains(f.Holders, r.Node) {
			f.Holders = append(f.Holders, r.Node)
		}
	}
	sort.Ints(f.Holders)
	f.Keep, f.Stamp = true, f.Message.Version
	for _, t := range tombstones {
		if f.Stamp.Less(t) {
			f.Keep, f.Stamp = false, t
		}
	}
	return f
}

// NewestEntries merges the queue entries several nodes hold: per id the
// newest stamp wins, except that a finished or deleted entry (a tombstone
// without replicas) stays so whatever comes later, as queue.Store.Apply
// decides on a node. The result is sorted by id.
func NewestEntries(nodes [][]*queue.Entry) []*queue.Entry {
	best := map[string]*queue.Entry{}
	for _, es := range nodes {
		for _, e := range es {
			if cur := best[e.ID]; cur != nil && !entryWins(e, cur) {
				continue
			}
			best[e.ID] = e
		}
	}
	out := make([]*queue.Entry, 0, len(best))
	for _, e := range best {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// entryWins reports whether e replaces cur: a finished or deleted entry
// beats any state that is not deleted, whatever the stamps (an attempt's
// outcome written after an operator's delete must not bring it back);
// otherwise the newer stamp wins.
func entryWins(e, cur *queue.Entry) bool {
	final := func(x *queue.Entry) bool { return x.Deleted && len(x.Replicas) == 0 }
	switch {
	case final(cur) && !e.Deleted:
		return false
	case final(e) && !cur.Deleted:
		return true
	}
	return cur.Stamp.Less(e.Stamp)
}

// NewestObjects merges the clusterwide objects several nodes hold: per
// name the newest stamp wins, a tombstone included. Sorted by name.
func NewestObjects(nodes [][]clusterwide.Object) []clusterwide.Object {
	best := map[string]clusterwide.Object{}
	for _, os := range nodes {
		for _, o := range os {
			if cur, ok := best[o.Name]; ok && !cur.Stamp.Less(o.Stamp) {
				continue
			}
			best[o.Name] = o
		}
	}
	out := make([]clusterwide.Object, 0, len(best))
	for _, o := range best {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FenceEnds returns the reserved ends a mailbox's fence must have after a
// copy: past every UID and MODSEQ the copied mailbox used (a writer starts
// handing out at the UID end and after the MODSEQ end), and never below
// what the source had reserved or the destination already holds (a rerun,
// or a writer that reserved since), so no UID is handed out twice.
func FenceEnds(box mailbox.Mailbox, msgs []mailbox.Message, reserved []Ends) Ends {
	e := Ends{UID: box.UIDNext, ModSeq: box.HighestModSeq}
	for _, m := range msgs {
		e.UID = max(e.UID, m.UID+1)
		e.ModSeq = max(e.ModSeq, m.ModSeq)
	}
	for _, r := range reserved {
		e.UID, e.ModSeq = max(e.UID, r.UID), max(e.ModSeq, r.ModSeq)
	}
	return e
}

// Ends are a mailbox's reserved UID and MODSEQ ends (userdb.MailboxDef's
// UIDReserved and ModSeqReserved; cassandra.Fence's).
type Ends struct {
	UID    uint32
	ModSeq uint64
}

// Covers reports whether e reaches at least as far as o on both counts.
func (e Ends) Covers(o Ends) bool { return e.UID >= o.UID && e.ModSeq >= o.ModSeq }

// MergeBox makes the record of a mailbox from its definition in the
// profile and the records the nodes' fragments keep of it (their UIDNEXT
// and HIGHESTMODSEQ follow what each stored, expunged messages included).
// The id is the UIDVALIDITY, as the writer reports it; the creation time
// the earliest a node knows, or the profile's.
func MergeBox(p *userdb.Profile, def *userdb.MailboxDef, frags []mailbox.Mailbox, msgs []mailbox.Message) mailbox.Mailbox {
	mb := mailbox.Mailbox{ID: uint64(def.UIDValidity), Name: def.Name, UIDValidity: def.UIDValidity, UIDNext: 1,
		HighestModSeq: 1, Subscribed: def.Subscribed, SpecialUse: def.SpecialUse, Created: p.Created}
	for _, f := range frags {
		mb.UIDNext, mb.HighestModSeq = max(mb.UIDNext, f.UIDNext), max(mb.HighestModSeq, f.HighestModSeq)
		if !f.Created.IsZero() && (mb.Created.IsZero() || f.Created.Before(mb.Created)) {
			mb.Created = f.Created
		}
	}
	for _, m := range msgs {
		mb.UIDNext, mb.HighestModSeq = max(mb.UIDNext, m.UID+1), max(mb.HighestModSeq, m.ModSeq)
	}
	return mb
}

// NativeDefs returns the mailbox definitions a native profile gets from
// Cassandra's rows of its mailboxes: names, subscriptions and special use
// as the rows say (the profile may be older than a rename), every row a
// definition, and reserved ends at least the fence's. Definitions of the
// profile without a row are kept (an empty mailbox the rows missed), in
// UIDVALIDITY order.
func NativeDefs(p *userdb.Profile, boxes []mailbox.Mailbox, fences map[uint32]Ends) []userdb.MailboxDef {
	byV := map[uint32]userdb.MailboxDef{}
	for _, d := range p.Mailboxes {
		byV[d.UIDValidity] = d
	}
	for _, b := range boxes {
		d := byV[b.UIDValidity]
		d.Name, d.UIDValidity, d.Subscribed, d.SpecialUse = b.Name, b.UIDValidity, b.Subscribed, b.SpecialUse
		byV[b.UIDValidity] = d
	}
	out := make([]userdb.MailboxDef, 0, len(byV))
	for v, d := range byV {
		if f, ok := fences[v]; ok {
			d.UIDReserved, d.ModSeqReserved = max(d.UIDReserved, f.UID), max(d.ModSeqReserved, f.ModSeq)
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UIDValidity < out[j].UIDValidity })
	return out
}

// EndMark says where a mailbox written into a new native node needs a
// stand-in for the messages expunged at its end: a native fragment's
// UIDNEXT and HIGHESTMODSEQ follow what it stored, expunges included,
// and only a message applied and then expunged moves them (IMAP's UIDNEXT
// and HIGHESTMODSEQ must not go back: RFC 3501 §2.3.1.1, RFC 7162 §3.1.2).
// The stand-in takes UIDNEXT-1 when that UID is past every message, else
// any free UID below it, and the mailbox's HIGHESTMODSEQ; ok is false when
// the messages alone give both figures (or no UID is free).
func EndMark(box mailbox.Mailbox, msgs []mailbox.Message) (uid uint32, modseq uint64, ok bool) {
	var maxUID uint32
	var maxMod uint64 = 1
	used := make(map[uint32]bool, len(msgs))
	for _, m := range msgs {
		maxUID, maxMod = max(maxUID, m.UID), max(maxMod, m.ModSeq)
		used[m.UID] = true
	}
	needUID, needMod := box.UIDNext > maxUID+1, box.HighestModSeq > maxMod
	switch {
	case needUID:
		return box.UIDNext - 1, max(box.HighestModSeq, 1), true
	case needMod:
		for u := uint32(1); u < maxUID; u++ {
			if !used[u] {
				return u, box.HighestModSeq, true
			}
		}
	}
	return 0, 0, false
}

// Clash returns two messages that share a UID, if any, in msgs sorted by
// UID: what two writers cut off from each other can leave (BLUEPRINT
// invariant 5 is mended by the native writer when it loads the mailbox),
// and what neither Cassandra's index (one record per UID) nor a copy can
// hold.
func Clash(msgs []mailbox.Message) (a, b mailbox.Message, ok bool) {
	for i := 1; i < len(msgs); i++ {
		if msgs[i].UID == msgs[i-1].UID {
			return msgs[i-1], msgs[i], true
		}
	}
	return a, b, false
}
