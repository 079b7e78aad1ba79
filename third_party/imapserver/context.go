package imapserver

// CONTEXT=SEARCH and CONTEXT=SORT (RFC 5267 §4), quill: the CONTEXT, UPDATE
// and PARTIAL return options of SEARCH and SORT, and CANCELUPDATE.
//
// PARTIAL cuts a window out of the result list (mailbox order for SEARCH,
// sort order for SORT). UPDATE keeps the command's criteria (and sort
// program) as a context of the connection: each time the session has
// brought its view of the selected mailbox up to date
// (UpdateWriter.MailboxSynced), the results are computed again and the
// difference is sent as ESEARCH ADDTO and REMOVEFROM. Contexts hold UIDs,
// so UPDATE is offered for UID SEARCH and UID SORT; with message numbers
// it is refused with NOUPDATE (§4.3.1 allows that; the numbers of
// expunged messages would have to be tracked across EXPUNGEs). Contexts
// end with the selection or CANCELUPDATE.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// Capabilities of RFC 5267 §4.
const (
	CapContextSearch imap.Cap = "CONTEXT=SEARCH"
	CapContextSort   imap.Cap = "CONTEXT=SORT"
)

// maxSearchContexts bounds the updating contexts of one connection (§4.3.1:
// at least one; each is computed again at every change of the mailbox).
const maxSearchContexts = 4

// searchReturnExt holds the return options of RFC 5267 §4 that
// imap.SearchOptions has no field for.
type searchReturnExt struct {
	update  bool
	partial *partialRange
}

// partialRange is PARTIAL's argument: nz-number ":" nz-number, either
// order (§5: 500:400 is 400:500).
type partialRange struct {
	text     string // "from:to", echoed in the answer
	from, to uint32 // from <= to
}

func parsePartialRange(s string) (*partialRange, error) {
	a, b, ok := strings.Cut(s, ":")
	x, err1 := strconv.ParseUint(a, 10, 32)
	y, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || x == 0 || y == 0 {
		return nil, newClientBugError("PARTIAL takes a range n:m of positive numbers")
	}
	// quill: the answer names the range low:high whichever way it was
	// asked (4:2 is 2:4), as Dovecot does and imaptest's search-partial
	// script expects.
	from, to := uint32(min(x, y)), uint32(max(x, y))
	return &partialRange{text: fmt.Sprintf("%d:%d", from, to), from: from, to: to}, nil
}

// window returns the results the range names (1 is the first).
func (p *partialRange) window(nums []uint32) []uint32 {
	lo, hi := p.bounds(len(nums))
	return nums[lo:hi]
}

// bounds are the indexes of the range's window in n results.
func (p *partialRange) bounds(n int) (lo, hi int) {
	if uint64(p.from) > uint64(n) {
		return n, n
	}
	return int(p.from - 1), int(min(uint64(p.to), uint64(n)))
}

// searchContext is an updating context (§4.3).
type searchContext struct {
	tag      string
	sort     []SortCriterion // nil for SEARCH
	criteria *imap.SearchCriteria
	uids     []uint32 // the results as last reported, in their order
}

// checkContextTag refuses an UPDATE whose tag names a live context
// (§4.3: BAD).
func (c *Conn) checkContextTag(tag string, ext *searchReturnExt) error {
	if ext.update && slices.ContainsFunc(c.searchContexts, func(sc *searchContext) bool { return sc.tag == tag }) {
		return newClientBugError("Tag reuse: " + tag + " names an updating search")
	}
	return nil
}

// SessionContext is a Session that computes what an updating search
// holds now: the UIDs matching criteria, in mailbox order (sort nil) or
// sorted, leaving out messages expunged but still numbered in the
// session (their EXPUNGE not sent yet), which are gone for a context.
type SessionContext interface {
	Session
	ContextResults(sort []SortCriterion, criteria *imap.SearchCriteria) ([]uint32, error)
}

// namesPositions reports whether criteria name messages by sequence
// number or by the saved result ($): their meaning moves with expunges
// and later SAVEs, so a context could not follow them.
func namesPositions(c *imap.SearchCriteria) bool {
	if len(c.SeqNum) > 0 || slices.ContainsFunc(c.UID, func(s imap.UIDSet) bool { return imap.IsSearchRes(s) }) {
		return true
	}
	for i := range c.Not {
		if namesPositions(&c.Not[i]) {
			return true
		}
	}
	for i := range c.Or {
		if namesPositions(&c.Or[i][0]) || namesPositions(&c.Or[i][1]) {
			return true
		}
	}
	return false
}

// registerContext keeps an UPDATE's context, or refuses it with an
// untagged NO [NOUPDATE "tag"] (the command's other options still hold).
func (c *Conn) registerContext(tag string, kind NumKind, sort []SortCriterion, criteria *imap.SearchCriteria, uids []uint32) error {
	why := ""
	_, computes := c.session.(SessionContext)
	switch {
	case !computes:
		why = "updates are not offered"
	case kind != NumKindUID:
		why = "updates are offered for UID SEARCH and UID SORT"
	case namesPositions(criteria):
		why = "updates are not offered for searches that name message numbers or $"
	case len(c.searchContexts) >= maxSearchContexts:
		why = fmt.Sprintf("at most %d updating searches at once (CANCELUPDATE one)", maxSearchContexts)
	}
	if why != "" {
		return c.writeStatusResp("", &imap.StatusResponse{Type: imap.StatusResponseTypeNo,
			Code: imap.ResponseCode("NOUPDATE " + strconv.Quote(tag)), Text: why})
	}
	c.searchContexts = append(c.searchContexts, &searchContext{tag: tag, sort: sort, criteria: criteria, uids: slices.Clone(uids)})
	return nil
}

// handleCancelUpdate is CANCELUPDATE "tag" *(SP "tag") (§4.3.5).
func (c *Conn) handleCancelUpdate(dec *imapwire.Decoder) error {
	var tags []string
	for dec.SP() {
		var tag string
		if !dec.ExpectString(&tag) {
			return dec.Err()
		}
		tags = append(tags, tag)
	}
	if len(tags) == 0 {
		return newClientBugError("CANCELUPDATE takes the tags of updating searches")
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}
	c.searchContexts = slices.DeleteFunc(c.searchContexts, func(sc *searchContext) bool { return slices.Contains(tags, sc.tag) })
	return nil
}

// MailboxSynced tells the connection that the session's view of the
// selected mailbox was brought up to date and something changed: the
// updating contexts are computed again and their changes reported.
func (w *UpdateWriter) MailboxSynced() error {
	return w.conn.updateContexts()
}

// updateContexts computes each context again and reports the changes. A
// context that cannot be computed now (a message unreadable for a moment)
// keeps its results and is tried at the next change; it does not fail
// the command or the connection.
func (c *Conn) updateContexts() error {
	cs, ok := c.session.(SessionContext)
	if !ok {
		return nil
	}
	for _, sc := range c.searchContexts {
		now, err := cs.ContextResults(sc.sort, sc.criteria)
		if err != nil {
			c.server.logger().Printf("updating search %q not computed again: %v", sc.tag, err)
			continue
		}
		removed, added := contextDiff(sc.uids, now, sc.sort == nil)
		sc.uids = now
		if len(removed) == 0 && len(added) == 0 {
			continue
		}
		if err := c.writeContextUpdate(sc.tag, removed, added); err != nil {
			return err
		}
	}
	return nil
}

// contextChange is one ADDTO or REMOVEFROM pair: a position (0 for
// SEARCH, whose results are in mailbox order) and UIDs in result order.
type contextChange struct {
	pos  uint32
	uids []uint32
}

// contextDiff says how to turn the old results into the new: removals,
// then additions, each applied in turn (§4.3.2). Results that stay keep
// their relative order (sort keys do not change), so removing the gone
// ones and inserting the new ones at their final positions is exact.
func contextDiff(old, now []uint32, unordered bool) (removed, added []contextChange) {
	inNow := make(map[uint32]bool, len(now))
	for _, u := range now {
		inNow[u] = true
	}
	inOld := make(map[uint32]bool, len(old))
	for _, u := range old {
		inOld[u] = true
	}
	// Positions of removals are taken in the list as it shrinks.
	pos := uint32(0)
	for _, u := range old {
		if inNow[u] {
			pos++
			continue
		}
		at := pos + 1
		if unordered {
			at = 0
		}
		if n := len(removed); n > 0 && removed[n-1].pos == at {
			removed[n-1].uids = append(removed[n-1].uids, u)
		} else {
			removed = append(removed, contextChange{pos: at, uids: []uint32{u}})
		}
	}
	for i, u := range now {
		if inOld[u] {
			continue
		}
		at := uint32(i + 1)
		if unordered {
			at = 0
		}
		if n := len(added); n > 0 && !unordered && added[n-1].pos+uint32(len(added[n-1].uids)) == at {
			added[n-1].uids = append(added[n-1].uids, u)
		} else if n > 0 && unordered {
			added[n-1].uids = append(added[n-1].uids, u)
		} else {
			added = append(added, contextChange{pos: at, uids: []uint32{u}})
		}
	}
	return removed, added
}

func (c *Conn) writeContextUpdate(tag string, removed, added []contextChange) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("ESEARCH").SP().Special('(').Atom("TAG").SP().String(tag).Special(')').SP().Atom("UID")
	for _, ch := range removed {
		enc.SP().Atom("REMOVEFROM").SP().Special('(').Number(ch.pos).SP().Atom(contextSet(ch.uids, ch.pos == 0)).Special(')')
	}
	for _, ch := range added {
		enc.SP().Atom("ADDTO").SP().Special('(').Number(ch.pos).SP().Atom(contextSet(ch.uids, ch.pos == 0)).Special(')')
	}
	return enc.CRLF()
}

// contextSet writes UIDs: in mailbox order as a compact set, or in result
// order (OrderedSet).
func contextSet(uids []uint32, mailboxOrder bool) string {
	if !mailboxOrder {
		return OrderedSet(uids)
	}
	var set imap.UIDSet
	for _, u := range uids {
		set.AddNum(imap.UID(u))
	}
	return set.String()
}

// numsOf lists a result set's numbers in ascending order.
func numsOf(set imap.NumSet) []uint32 {
	switch s := set.(type) {
	case imap.UIDSet:
		uids, _ := s.Nums()
		out := make([]uint32, len(uids))
		for i, u := range uids {
			out[i] = uint32(u)
		}
		return out
	case imap.SeqSet:
		nums, _ := s.Nums()
		return nums
	}
	return nil
}

// partialData is the PARTIAL return data: the range as asked and the
// results in it, or NIL.
func partialData(p *partialRange, nums []uint32, ordered bool) string {
	w := p.window(nums)
	if len(w) == 0 {
		return "(" + p.text + " NIL)"
	}
	if ordered {
		return "(" + p.text + " " + OrderedSet(w) + ")"
	}
	var set imap.SeqSet
	for _, n := range w {
		set.AddNum(n)
	}
	return "(" + p.text + " " + set.String() + ")"
}
