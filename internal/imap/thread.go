package imap

import (
	"slices"
	"strings"

	"github.com/quillmail/quill/third_party/imapserver"
)

// Threading and base subjects (RFC 5256 §2.1, §3): pure functions over
// the sort keys of the matched messages, so they are tested without a
// session.

// threadMsg is a message to thread: its number in the answer, its
// sequence number (the tie-break) and its keys.
type threadMsg struct {
	num  uint32
	seq  uint32
	info *sortInfo
}

// baseSubject returns a subject's base subject (RFC 5256 §2.1) and
// whether it was a reply or a forward (it lost Re:, Fwd:, (fwd) or a
// [fwd: ...] wrapper on the way). The subject is already decoded.
func baseSubject(s string) (string, bool) {
	s = collapseWSP(s)
	replyFwd := false
	for {
		// (2) Trailing "(fwd)" and white space.
		for {
			t := strings.TrimRight(s, " ")
			if len(t) >= 5 && strings.EqualFold(t[len(t)-5:], "(fwd)") {
				t = t[:len(t)-5]
				replyFwd = true
			}
			if t == s {
				break
			}
			s = t
		}
		// (3)-(5) Leaders (Re:, Fwd:, with blobs before them) and blobs.
		for {
			if n, reply := subjLeader(s); n > 0 {
				s = s[n:]
				replyFwd = replyFwd || reply
				continue
			}
			if n := subjBlob(s); n > 0 && strings.TrimLeft(s[n:], " ") != "" {
				s = s[n:]
				continue
			}
			break
		}
		// (6) A "[fwd: ...]" wrapper: unwrap and start again.
		if len(s) >= 6 && strings.EqualFold(s[:5], "[fwd:") && s[len(s)-1] == ']' {
			s = s[5 : len(s)-1]
			replyFwd = true
			continue
		}
		return s, replyFwd
	}
}

// collapseWSP turns tabs and line breaks into spaces and runs of spaces
// into one.
func collapseWSP(s string) string {
	var b strings.Builder
	space := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\t' || c == '\r' || c == '\n' || c == ' ' {
			if !space {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		space = false
		b.WriteByte(c)
	}
	return b.String()
}

// subjBlob returns the length of a subj-blob ("[" *BLOBCHAR "]" *WSP) at
// the start of s, or 0.
func subjBlob(s string) int {
	if s == "" || s[0] != '[' {
		return 0
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '[':
			return 0
		case ']':
			i++
			for i < len(s) && s[i] == ' ' {
				i++
			}
			return i
		}
	}
	return 0
}

// subjRefwd returns the length of a subj-refwd ("re" or "fw" or "fwd",
// spaces, an optional blob, ":") at the start of s, or 0.
func subjRefwd(s string) int {
	i := 0
	switch {
	case len(s) >= 3 && strings.EqualFold(s[:3], "fwd"):
		i = 3
	case len(s) >= 2 && (strings.EqualFold(s[:2], "re") || strings.EqualFold(s[:2], "fw")):
		i = 2
	default:
		return 0
	}
	for i < len(s) && s[i] == ' ' {
		i++
	}
	i += subjBlob(s[i:])
	if i < len(s) && s[i] == ':' {
		return i + 1
	}
	return 0
}

// subjLeader returns the length of a subj-leader at the start of s (blobs
// then a subj-refwd, or one space) and whether it was a reply or forward.
func subjLeader(s string) (int, bool) {
	if strings.HasPrefix(s, " ") {
		return 1, false
	}
	i := 0
	for {
		if n := subjRefwd(s[i:]); n > 0 {
			return i + n, true
		}
		n := subjBlob(s[i:])
		if n == 0 {
			return 0, false
		}
		i += n
	}
}

// sentBefore orders messages by sent date, then by sequence number.
func sentBefore(a, b *threadMsg) int {
	if c := a.info.sent.Compare(b.info.sent); c != 0 {
		return c
	}
	return int(a.seq) - int(b.seq)
}

// orderedSubject threads by base subject (RFC 5256 §3, ORDEREDSUBJECT):
// messages of one base subject form a thread whose first (by sent date)
// is the parent of the others; threads go by their first message's date.
func orderedSubject(msgs []threadMsg) []imapserver.Thread {
	sorted := slices.Clone(msgs)
	slices.SortFunc(sorted, func(a, b threadMsg) int {
		if c := strings.Compare(a.info.subject, b.info.subject); c != 0 {
			return c
		}
		return sentBefore(&a, &b)
	})
	type group struct {
		first threadMsg
		rest  []imapserver.Thread
	}
	var groups []group
	for i, m := range sorted {
		if i > 0 && m.info.subject == sorted[i-1].info.subject {
			g := &groups[len(groups)-1]
			g.rest = append(g.rest, imapserver.Thread{Num: m.num})
			continue
		}
		groups = append(groups, group{first: m})
	}
	slices.SortStableFunc(groups, func(a, b group) int { return sentBefore(&a.first, &b.first) })
	out := make([]imapserver.Thread, len(groups))
	for i, g := range groups {
		out[i] = imapserver.Thread{Num: g.first.num, Children: g.rest}
	}
	return out
}

// container is a node of REFERENCES threading: a message, or a dummy
// (msg nil) standing for one that is referred to but not here.
type container struct {
	msg      *threadMsg
	parent   *container
	children []*container
}

func (c *container) isAncestorOf(d *container) bool {
	if len(c.children) == 0 {
		return c == d // no one's ancestor: no walk (a new message's case)
	}
	for p := d; p != nil; p = p.parent {
		if p == c {
			return true
		}
	}
	return false
}

// link makes child a child of parent unless that would make a loop.
func (c *container) link(child *container) {
	if child.isAncestorOf(c) {
		return
	}
	if child.parent != nil {
		child.parent.unlink(child)
	}
	child.parent = c
	c.children = append(c.children, child)
}

func (c *container) unlink(child *container) {
	if i := slices.Index(c.children, child); i >= 0 {
		c.children = slices.Delete(c.children, i, i+1)
	}
	child.parent = nil
}

// first is the message a container's date and subject come from: its
// own, or a dummy's first child's (children sorted).
func (c *container) first() *threadMsg {
	for c.msg == nil && len(c.children) > 0 {
		c = c.children[0]
	}
	return c.msg
}

// references threads by Message-ID, References and In-Reply-To, then
// joins threads by base subject (RFC 5256 §3, REFERENCES, steps 1-7).
func references(msgs []threadMsg) []imapserver.Thread {
	// (1) Link messages and the ones they refer to.
	byID := map[string]*container{}
	get := func(id string) *container {
		c := byID[id]
		if c == nil {
			c = &container{}
			byID[id] = c
		}
		return c
	}
	var all []*container
	for i := range msgs {
		m := &msgs[i]
		var c *container
		if id := m.info.messageID; id != "" && (byID[id] == nil || byID[id].msg == nil) {
			c = get(id)
		} else {
			c = &container{} // no Message-ID, or a duplicate: unique
		}
		c.msg = m
		all = append(all, c)
		refs := m.info.refs
		// (1A) Each reference is the parent of the next, unless one
		// already has a parent or a link would make a loop.
		for j := 0; j+1 < len(refs); j++ {
			p, ch := get(refs[j]), get(refs[j+1])
			if ch.parent == nil && p != ch {
				p.link(ch)
			}
		}
		// (1B) The last reference, or none, is this message's parent:
		// any parent it had (from a truncated References elsewhere) goes
		// first, and a link that would make a loop is not made.
		if c.parent != nil {
			c.parent.unlink(c)
		}
		if len(refs) > 0 {
			if p := get(refs[len(refs)-1]); p != c {
				p.link(c)
			}
		}
	}
	// (2) The root set; dummies created for references are in byID.
	var roots []*container
	seen := map[*container]bool{}
	for _, c := range all {
		seen[c] = true
		if c.parent == nil {
			roots = append(roots, c)
		}
	}
	for _, c := range byID {
		if !seen[c] && c.parent == nil {
			roots = append(roots, c)
		}
	}
	// (3) The id table is not needed any more. (4) Prune dummies.
	roots = prune(roots, true)
	// (5) Sort the roots by date, a dummy by its first child's.
	sortSiblings(roots, false)
	// (6) Join threads whose subjects share a base subject.
	roots = joinBySubject(roots)
	// (7) Sort every set of siblings by date.
	sortSiblings(roots, true)
	return toThreads(roots)
}

// prune drops dummies without children and puts the children of the
// others in their place, except a dummy at the root with several
// children (RFC 5256 step 4).
func prune(list []*container, root bool) []*container {
	var out []*container
	for _, c := range list {
		c.children = prune(c.children, false)
		for _, ch := range c.children {
			ch.parent = c
		}
		switch {
		case c.msg != nil:
			out = append(out, c)
		case len(c.children) == 0:
		case root && len(c.children) > 1:
			out = append(out, c)
		default:
			for _, ch := range c.children {
				ch.parent = c.parent
			}
			out = append(out, c.children...)
		}
	}
	return out
}

// sortSiblings sorts a list by date (a dummy by its first child's, its
// children sorted first); deep sorts every level below too.
func sortSiblings(list []*container, deep bool) {
	for _, c := range list {
		if deep || c.msg == nil {
			sortSiblings(c.children, deep)
		}
	}
	slices.SortStableFunc(list, func(a, b *container) int {
		return sentBefore(a.first(), b.first())
	})
}

func joinBySubject(roots []*container) []*container {
	subjectOf := func(c *container) (string, bool) {
		m := c.first()
		return m.info.subject, m.info.replyFwd
	}
	table := map[string]*container{}
	for _, c := range roots {
		subj, reply := subjectOf(c)
		if subj == "" {
			continue
		}
		t := table[subj]
		if t == nil {
			table[subj] = c
			continue
		}
		_, tReply := subjectOf(t)
		if t.msg != nil && (c.msg == nil || (tReply && !reply)) {
			table[subj] = c
		}
	}
	removed := map[*container]bool{}
	var added []*container
	for _, c := range roots {
		subj, reply := subjectOf(c)
		if subj == "" || removed[c] {
			continue
		}
		t := table[subj]
		if t == c {
			continue
		}
		_, tReply := subjectOf(t)
		switch {
		case t.msg == nil && c.msg == nil:
			for _, ch := range c.children {
				ch.parent = t
			}
			t.children = append(t.children, c.children...)
			c.children = nil
			removed[c] = true
		case t.msg == nil || (reply && !tReply):
			t.children = append(t.children, c)
			c.parent = t
			removed[c] = true
		default:
			d := &container{children: []*container{t, c}}
			t.parent, c.parent = d, d
			removed[t], removed[c] = true, true
			table[subj] = d
			added = append(added, d)
		}
	}
	var out []*container
	for _, c := range append(roots, added...) {
		if !removed[c] {
			out = append(out, c)
		}
	}
	return out
}

func toThreads(list []*container) []imapserver.Thread {
	out := make([]imapserver.Thread, len(list))
	for i, c := range list {
		if c.msg != nil {
			out[i].Num = c.msg.num
		}
		out[i].Children = toThreads(c.children)
	}
	return out
}
