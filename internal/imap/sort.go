package imap

import (
	"cmp"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// SORT and THREAD (RFC 5256), SORT=DISPLAY (RFC 5957) and ESORT (RFC 5267
// §3). They are written here by hand: no Go IMAP server library on the
// module proxy has them (go-imap v2 has neither; go-imap-sortthread and
// mox's are not reachable from here). The sort keys of a message are read
// from its header once per selection (sortCache), since a message's bytes
// never change.

// maxSortCache bounds the messages whose sort keys a selection keeps.
const maxSortCache = 200_000

// sortInfo is what SORT and THREAD read of one message.
type sortInfo struct {
	sent      time.Time // Date:, or the internal date when it has none
	subject   string    // base subject (RFC 5256 §2.1), ASCII-lower-cased
	replyFwd  bool      // the subject said Re:, Fwd: or (fwd)
	from, to  string    // first address's mailbox, for FROM and TO
	cc        string
	dispFrom  string // display name or address, for DISPLAYFROM (RFC 5957)
	dispTo    string
	messageID string
	refs      []string // References, or else the first In-Reply-To id
}

// sortMsg is a message that matched, with its sequence number.
type sortMsg struct {
	seq  uint32
	m    *msgState
	info *sortInfo
}

// matching returns the selected messages that match criteria, in mailbox
// order, with their sort keys if keys is set (ARRIVAL and SIZE need none,
// and then no message is read for them). A message whose bytes cannot be
// read now (a replica away) fails the command rather than sort as if it
// had no header; one expunged meanwhile sorts with empty keys.
func (s *session) matching(cmd string, criteria *imap.SearchCriteria, keys bool) ([]sortMsg, error) {
	sel := s.sel
	ev := newEvaluator(sel)
	ev.prefilter(s, criteria)
	if sel.sortCache == nil || len(sel.sortCache) > maxSortCache {
		sel.sortCache = map[string]*sortInfo{}
	}
	var out []sortMsg
	for i, m := range sel.msgs {
		if ev.excluded(m) {
			continue
		}
		sm := &searchMsg{s: s, m: m, seq: uint32(i + 1)}
		if !ev.match(criteria, sm) {
			continue
		}
		if !keys {
			out = append(out, sortMsg{seq: uint32(i + 1), m: m})
			continue
		}
		info := sel.sortCache[m.id]
		if info == nil {
			info = readSortInfo(sm)
			if sm.err != nil && !errors.Is(sm.err, mailbox.ErrNoMessage) {
				return nil, storeErr(cmd, sm.err)
			}
			if !m.gone && sm.err == nil {
				sel.sortCache[m.id] = info
			}
		}
		out = append(out, sortMsg{seq: uint32(i + 1), m: m, info: info})
	}
	return out, nil
}

func readSortInfo(sm *searchMsg) *sortInfo {
	info := &sortInfo{sent: sm.m.date}
	if sm.load() == nil {
		return info
	}
	h := sm.header()
	info.sent = sm.sentDate()
	subj := h.Get("Subject")
	if d, err := fts.DecodeHeader(unfold(subj)); err == nil {
		subj = d
	}
	info.subject, info.replyFwd = baseSubject(subj)
	info.subject = asciiLower(info.subject)
	first := func(field string) (mailbox, display string) {
		l := parseAddressList(h.Get(field))
		for _, a := range l {
			if a.Host == "" && a.Name == "" {
				continue // a group's end marker
			}
			if a.Host == "" {
				continue // a group's start: its members follow
			}
			name := a.Name
			if d, err := fts.DecodeHeader(name); err == nil {
				name = d
			}
			display = name
			if display == "" {
				display = a.Mailbox + "@" + a.Host
			}
			return asciiLower(a.Mailbox), asciiLower(display)
		}
		return "", ""
	}
	info.from, info.dispFrom = first("From")
	info.to, info.dispTo = first("To")
	info.cc, _ = first("Cc")
	info.messageID = firstMsgID(h.Get("Message-Id"))
	if refs := msgIDList(h.Get("References")); len(refs) > 0 {
		info.refs = refs
	} else if irt := firstMsgID(h.Get("In-Reply-To")); irt != "" {
		info.refs = []string{irt}
	}
	return info
}

// maxRefs bounds the References one message contributes to threading, and
// maxMsgID the length of one id (RFC 5322's line limit): a mailbox of
// hostile messages must not make THREAD's tables grow without bound.
const (
	maxRefs  = 200
	maxMsgID = 998
)

// msgIDList returns the message ids of a References or In-Reply-To
// field: what lies between < and >, without folding or spaces.
func msgIDList(v string) []string {
	var out []string
	for len(out) < maxRefs {
		i := strings.IndexByte(v, '<')
		if i < 0 {
			break
		}
		j := strings.IndexByte(v[i:], '>')
		if j < 0 {
			break
		}
		id := strings.Map(func(r rune) rune {
			if r == ' ' || r == '\t' || r == '\r' || r == '\n' {
				return -1
			}
			return r
		}, v[i+1:i+j])
		if id != "" && len(id) <= maxMsgID {
			out = append(out, id)
		}
		v = v[i+j+1:]
	}
	return out
}

// firstMsgID returns the first message id of a field, or "".
func firstMsgID(v string) string {
	if l := msgIDList(v); len(l) > 0 {
		return l[0]
	}
	return ""
}

func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}

// Sort answers SORT and UID SORT (RFC 5256 §3): messages that tie on
// every key stay in mailbox order.
func (s *session) Sort(kind imapserver.NumKind, program []imapserver.SortCriterion, criteria *imap.SearchCriteria) ([]uint32, []uint64, error) {
	keys := slices.ContainsFunc(program, func(c imapserver.SortCriterion) bool {
		return c.Key != imapserver.SortArrival && c.Key != imapserver.SortSize
	})
	msgs, err := s.matching("SORT", criteria, keys)
	if err != nil {
		return nil, nil, err
	}
	slices.SortStableFunc(msgs, func(a, b sortMsg) int {
		for _, c := range program {
			r := compareKey(c.Key, &a, &b)
			if c.Reverse {
				r = -r
			}
			if r != 0 {
				return r
			}
		}
		return 0
	})
	out := make([]uint32, len(msgs))
	var modSeqs []uint64
	if hasModSeq(criteria) {
		modSeqs = make([]uint64, len(msgs))
	}
	for i, m := range msgs {
		out[i] = m.seq
		if kind == imapserver.NumKindUID {
			out[i] = m.m.uid
		}
		if modSeqs != nil {
			modSeqs[i] = m.m.modSeq
		}
	}
	return out, modSeqs, nil
}

// stringKeys are the sort keys that compare a string of the header.
var stringKeys = map[imapserver.SortKey]func(*sortInfo) string{
	imapserver.SortSubject:     func(i *sortInfo) string { return i.subject },
	imapserver.SortFrom:        func(i *sortInfo) string { return i.from },
	imapserver.SortTo:          func(i *sortInfo) string { return i.to },
	imapserver.SortCc:          func(i *sortInfo) string { return i.cc },
	imapserver.SortDisplayFrom: func(i *sortInfo) string { return i.dispFrom },
	imapserver.SortDisplayTo:   func(i *sortInfo) string { return i.dispTo },
}

func compareKey(k imapserver.SortKey, a, b *sortMsg) int {
	switch k {
	case imapserver.SortArrival:
		return a.m.date.Compare(b.m.date)
	case imapserver.SortDate:
		return a.info.sent.Compare(b.info.sent)
	case imapserver.SortSize:
		return cmp.Compare(a.m.size, b.m.size)
	}
	if get := stringKeys[k]; get != nil {
		return strings.Compare(get(a.info), get(b.info))
	}
	return 0
}

// Thread answers THREAD and UID THREAD (RFC 5256 §3).
func (s *session) Thread(kind imapserver.NumKind, algorithm imapserver.ThreadAlgorithm, criteria *imap.SearchCriteria) ([]imapserver.Thread, error) {
	msgs, err := s.matching("THREAD", criteria, true)
	if err != nil {
		return nil, err
	}
	nodes := make([]threadMsg, len(msgs))
	for i, m := range msgs {
		num := m.seq
		if kind == imapserver.NumKindUID {
			num = m.m.uid
		}
		nodes[i] = threadMsg{num: num, seq: m.seq, info: m.info}
	}
	if algorithm == imapserver.ThreadOrderedSubject {
		return orderedSubject(nodes), nil
	}
	return references(nodes), nil
}
