package writer

// The writer's REDO log (Neptune §3–4, issue 17 items 3–4): the decisions.
// The I/O (the store, the secondary, the recovery's rounds) is in
// redolog.go.
//
// A bucket's primary is its manager. Every ordered change its writers make
// (a reservation of UIDs and MODSEQs, a flag change, an expunge, a copy or
// move, a mailbox or subscription change) is an Entry with a log sequence
// number, appended to the primary's store and to the bucket's secondary
// (the next-ranked live node, which takes the bucket over if the primary
// dies) before the client hears OK. A change reaches the message replicas
// through one of them (a write policy of ONE); the log is what makes it
// survive the loss of that replica together with the writer.
//
// A node that starts managing a bucket recovers it in three phases before
// its writers serve: it finds the highest LSN among the live nodes' logs of
// the bucket, replays (fetches the entries it lacks, writes the logged
// message versions to their replicas again, and raises the profile's
// reserved ends and mailbox list to what was logged), then accepts writes.
// A session meanwhile waits, or is told to try again (UNAVAILABLE); it never
// sees an older state.

import (
	"slices"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// LSN is a log sequence number: the term of the primary that wrote the
// entry (a new primary's term is above every term it found and above its
// clock, so its entries order after the old primary's) and a sequence
// within the term.
type LSN struct {
	Term uint64 `json:"term"`
	Seq  uint64 `json:"seq"`
}

// Less orders LSNs by term, then sequence.
func (a LSN) Less(b LSN) bool {
	return a.Term < b.Term || (a.Term == b.Term && a.Seq < b.Seq)
}

// IsZero says no entry has this LSN (an empty log's head).
func (a LSN) IsZero() bool { return a == LSN{} }

// Entry is one change of a bucket's log. Exactly one of Reserve, Updates
// and Profile is set. Entries are small: a message's bytes never travel in
// them (replica.Update's Blob is left out).
type Entry struct {
	LSN LSN `json:"lsn"`
	// Node is the primary that wrote it: two nodes that both believed
	// themselves primary for a moment never overwrite each other's entry.
	Node cluster.NodeID `json:"node"`
	User string         `json:"user"`
	At   time.Time      `json:"at"`
	// Reserve is the new reserved ends of a mailbox's UID and MODSEQ
	// blocks (also written when a clean shutdown gives the rest back).
	Reserve *ReserveEnds `json:"reserve,omitempty"`
	// Updates are the new versions of message objects a STORE, EXPUNGE,
	// COPY or MOVE wrote, with their stamps.
	Updates []*replica.Update `json:"updates,omitempty"`
	// Profile is the user's profile after a mailbox or subscription
	// change.
	Profile *userdb.Profile `json:"profile,omitempty"`
}

// ReserveEnds are a mailbox's reserved ends.
type ReserveEnds struct {
	UIDValidity uint32 `json:"v"`
	UID         uint32 `json:"uid"`
	ModSeq      uint64 `json:"modseq"`
}

// entryLess orders entries by LSN, then by writing node.
func entryLess(a, b *Entry) bool {
	if a.LSN != b.LSN {
		return a.LSN.Less(b.LSN)
	}
	return a.Node < b.Node
}

// mergeEntries returns the union of logs, each entry once, in LSN order.
func mergeEntries(logs ...[]*Entry) []*Entry {
	type key struct {
		lsn  LSN
		node cluster.NodeID
	}
	seen := map[key]bool{}
	var out []*Entry
	for _, l := range logs {
		for _, e := range l {
			k := key{e.LSN, e.Node}
			if !seen[k] {
				seen[k] = true
				out = append(out, e)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b *Entry) int {
		switch {
		case entryLess(a, b):
			return -1
		case entryLess(b, a):
			return 1
		}
		return 0
	})
	return out
}

// Head is what one live node holds of a bucket's log.
type Head struct {
	Node  cluster.NodeID
	LSN   LSN
	Count int
	// Busy says the node still writes the bucket: it manages it in its own
	// view, or drains its writers.
	Busy bool
}

// chooseSource returns the node whose log of the bucket has the highest
// LSN, the highest-ranked of them on a tie (ranked lists the live nodes by
// rank for the bucket), and false if every log is empty: Neptune's first
// phase.
func chooseSource(heads []Head, ranked []cluster.NodeID) (Head, bool) {
	rank := func(n cluster.NodeID) int {
		if i := slices.Index(ranked, n); i >= 0 {
			return i
		}
		return len(ranked)
	}
	var best Head
	found := false
	for _, h := range heads {
		if h.Count == 0 {
			continue
		}
		if !found || best.LSN.Less(h.LSN) || (h.LSN == best.LSN && rank(h.Node) < rank(best.Node)) {
			best, found = h, true
		}
	}
	return best, found
}

// toFetch returns the nodes whose log of the bucket may hold entries this
// node lacks: every other node with a non-empty log whose head differs
// from the local one (Neptune's second phase catches up from them).
func toFetch(self cluster.NodeID, heads []Head) []cluster.NodeID {
	var local LSN
	for _, h := range heads {
		if h.Node == self {
			local = h.LSN
		}
	}
	var out []cluster.NodeID
	for _, h := range heads {
		if h.Node != self && h.Count > 0 && h.LSN != local {
			out = append(out, h.Node)
		}
	}
	return out
}

// writing returns the other nodes that still write the bucket and hold a
// log of it: the recovery waits for them (a handoff's drain) so that it
// reads their last entries.
func writing(self cluster.NodeID, heads []Head) []cluster.NodeID {
	var out []cluster.NodeID
	for _, h := range heads {
		if h.Node != self && h.Busy && h.Count > 0 {
			out = append(out, h.Node)
		}
	}
	return out
}

// newTerm is the term of a new primary: above every term it found, and
// above its clock (now), so that it orders after an old primary whose log
// it could not read.
func newTerm(highest LSN, now uint64) uint64 { return max(highest.Term+1, now) }

// secondaries returns, in rank order, the live nodes other than self that
// may hold a bucket's log: the first is the secondary, the next ones take
// its place when it does not answer. eligible are the live members that
// may hold the bucket's state, in rank order (cluster.Eligible: with
// islands, the bucket's island's, so the log stays in the island and its
// secondary is the island's next manager).
func secondaries(self cluster.NodeID, eligible []cluster.MemberInfo) []cluster.NodeID {
	var out []cluster.NodeID
	for _, m := range eligible {
		if m.ID != self {
			out = append(out, m.ID)
		}
	}
	return out
}

// replayPlan is what a new primary re-applies of a bucket's log.
type replayPlan struct {
	// Users are the users with a profile or a reservation to re-apply.
	Users map[string]*userReplay
	// Updates are the newest logged version of each message object, in
	// LSN order: an older one is superseded by the newer.
	Updates []*replica.Update
}

// userReplay is one user's part of a replay.
type userReplay struct {
	// Profile is the newest logged profile (nil: none logged).
	Profile *userdb.Profile
	// Reserve is the last logged ends of each mailbox, by UIDVALIDITY: a
	// clean shutdown's release is the last word, so it is not raised back.
	Reserve map[uint32]ReserveEnds
}

// planReplay decides what to re-apply of a log (in LSN order).
func planReplay(log []*Entry) replayPlan {
	p := replayPlan{Users: map[string]*userReplay{}}
	user := func(u string) *userReplay {
		ur := p.Users[u]
		if ur == nil {
			ur = &userReplay{Reserve: map[uint32]ReserveEnds{}}
			p.Users[u] = ur
		}
		return ur
	}
	newest := map[string]int{} // object -> index in p.Updates
	for _, e := range log {
		switch {
		case e.Reserve != nil:
			user(e.User).Reserve[e.Reserve.UIDValidity] = *e.Reserve
		case e.Profile != nil:
			ur := user(e.User)
			if ur.Profile == nil || ur.Profile.Version <= e.Profile.Version {
				ur.Profile = e.Profile
			}
		}
		for _, u := range e.Updates {
			if i, ok := newest[u.Object]; ok {
				if u.Stamp.Less(p.Updates[i].Stamp) {
					continue
				}
				p.Updates[i] = nil
			}
			newest[u.Object] = len(p.Updates)
			p.Updates = append(p.Updates, u)
		}
	}
	p.Updates = slices.DeleteFunc(p.Updates, func(u *replica.Update) bool { return u == nil })
	return p
}

// replayProfile returns the profile a replay must write for a user, or nil
// if the current one (cur, nil if none is known) already holds everything
// logged: the logged profile if it is newer, with every mailbox's reserved
// ends raised to the last logged ones.
func replayProfile(cur *userdb.Profile, ur *userReplay) *userdb.Profile {
	var p *userdb.Profile
	changed := false
	switch {
	case ur.Profile != nil && (cur == nil || cur.Version < ur.Profile.Version):
		p, changed = ur.Profile.Clone(), true
	case cur != nil:
		p = cur.Clone()
	default:
		return nil
	}
	if p.Deleted {
		return nil
	}
	for v, re := range ur.Reserve {
		def := p.MailboxByValidity(v)
		if def == nil {
			continue
		}
		if re.UID > def.UIDReserved {
			def.UIDReserved, changed = re.UID, true
		}
		if re.ModSeq > def.ModSeqReserved {
			def.ModSeqReserved, changed = re.ModSeq, true
		}
	}
	if !changed {
		return nil
	}
	return p
}

// expired reports whether an entry may leave the log: once it is older
// than keep, every change it carries has long reached the message
// replicas' update logs and the profile's replicas.
func expired(e *Entry, now time.Time, keep time.Duration) bool {
	return now.Sub(e.At) > keep
}
