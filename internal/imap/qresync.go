package imap

import (
	"sort"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver"
)

// QRESYNC (RFC 7162 §3.2). A client that had a mailbox before says what it
// knew (UIDVALIDITY, HIGHESTMODSEQ, the UIDs it holds); the session answers
// with the UIDs that are gone (VANISHED (EARLIER)) and the messages changed
// since (FETCH UID FLAGS MODSEQ), and once QRESYNC is enabled reports
// expunges as VANISHED with UIDs instead of EXPUNGE with message numbers.
//
// Which UIDs are gone is computed, not looked up: every UID the client
// names up to the mailbox's UIDNEXT-1 that no message holds. That is the
// set §3.2.5.2 allows a server without per-expunge mod-sequences to send
// (Dovecot falls back to the same when its log no longer reaches back),
// and it is exact where it matters: a UID removed since the client's
// mod-sequence is always in it, through whichever node removed it, since
// the mailbox list comes from the user's writer. What it adds are UIDs
// removed before that mod-sequence, which the client already dropped, and
// UIDs never used (a writer that restarted skips the rest of its
// reservation); a client removes nothing for them. It needs no tombstone
// kept per mailbox, so nothing grows with the number of expunges.

// QResync implements imapserver.SessionQResync: after SELECT or EXAMINE
// with QRESYNC parameters, VANISHED (EARLIER) and FETCH for what changed.
func (s *session) QResync(w *imapserver.FetchWriter, p *imapserver.QResyncParams) error {
	sel := s.sel
	if sel == nil || p.UIDValidity != sel.uidValidity {
		return nil // another mailbox: the client starts over
	}
	known := p.KnownUIDs
	if known == nil {
		known = imap.UIDSet{imap.UIDRange{Start: 1, Stop: 0}} // 1:*
	}
	if gone := vanishedUIDs(known, sel.view(), sel.lastUID()); len(gone) > 0 {
		if err := w.WriteVanishedEarlier(gone); err != nil {
			return err
		}
	}
	for i, m := range sel.msgs {
		if m.modSeq <= p.ModSeq || !uidContains(known, m.uid, sel.lastUID()) {
			continue
		}
		rw := w.CreateMessage(uint32(i + 1))
		rw.WriteUID(imap.UID(m.uid))
		rw.WriteFlags(m.imapFlags(s.rev2()))
		rw.WriteModSeq(m.modSeq)
		if err := rw.Close(); err != nil {
			return err
		}
	}
	return nil
}

// HighestModSeq implements imapserver.SessionQResync: the selected
// mailbox's HIGHESTMODSEQ as last synced (after the poll that ends the
// command).
func (s *session) HighestModSeq() uint64 {
	if s.sel == nil {
		return 0
	}
	return s.sel.modSeq
}

// lastUID is the highest UID the mailbox has given out as far as the
// session knows: what a "*" in a client's UID set stands for when the
// question is which of its UIDs are gone.
func (sel *selected) lastUID() uint32 {
	return max(sel.uidHigh, sel.uidNext-min(sel.uidNext, 1))
}

// vanishedUIDs returns the UIDs of set, up to last ("*" is last), that are
// not in have (ascending): the messages a client holds that are gone. It
// walks the ranges and have, so a set of 1:4294967295 costs what the
// mailbox holds, not what the range spans.
func vanishedUIDs(set imap.UIDSet, have []uint32, last uint32) imap.UIDSet {
	var ranges [][2]uint32
	for _, r := range set {
		lo, hi := uidRange(r, last)
		hi = min(hi, last)
		if lo == 0 {
			lo = 1
		}
		if lo > hi {
			continue
		}
		ranges = append(ranges, [2]uint32{lo, hi})
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i][0] < ranges[j][0] })
	var out imap.UIDSet
	add := func(lo, hi uint32) {
		if n := len(out); n > 0 && uint32(out[n-1].Stop)+1 >= lo {
			out[n-1].Stop = imap.UID(max(uint32(out[n-1].Stop), hi))
			return
		}
		out = append(out, imap.UIDRange{Start: imap.UID(lo), Stop: imap.UID(hi)})
	}
	for _, r := range ranges {
		lo, hi := r[0], r[1]
		// The first held UID at or above lo, then each gap up to hi.
		i := sort.Search(len(have), func(i int) bool { return have[i] >= lo })
		for lo <= hi {
			if i >= len(have) || have[i] > hi {
				add(lo, hi)
				break
			}
			if have[i] > lo {
				add(lo, have[i]-1)
			}
			if have[i] == hi {
				break
			}
			lo = have[i] + 1
			i++
		}
	}
	return out
}

// expungeWriter is what the writers that report expunges share (updates,
// EXPUNGE, MOVE).
type expungeWriter interface {
	WriteExpunge(seqNum uint32) error
	QResync() bool
	WriteVanished(uids imap.UIDSet) error
}

// writeExpunged reports the removal of the view's messages at indexes idx
// (descending, so each EXPUNGE's number is the message's current one), or
// one VANISHED with their UIDs once QRESYNC is enabled (RFC 7162 §3.2.7).
func (sel *selected) writeExpunged(w expungeWriter, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	if w.QResync() {
		var uids imap.UIDSet
		for _, i := range idx {
			uids.AddNum(imap.UID(sel.msgs[i].uid))
		}
		return w.WriteVanished(uids)
	}
	for _, i := range idx {
		if err := w.WriteExpunge(uint32(i + 1)); err != nil {
			return err
		}
	}
	return nil
}
