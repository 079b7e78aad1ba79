package imap

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"
	gomessage "github.com/emersion/go-message"
	"github.com/emersion/go-message/mail"
	"github.com/emersion/go-message/textproto"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// Search answers SEARCH and UID SEARCH (RFC 9051 §6.4.4, RFC 4731 ESEARCH,
// RFC 5182 SEARCHRES, RFC 7162 §3.1.5 MODSEQ). Matching is ours: strings
// match as case-insensitive substrings of the decoded (RFC 2047 headers,
// transfer-encoded and charset-converted bodies) and of the raw text.
func (s *session) Search(kind imapserver.NumKind, criteria *imap.SearchCriteria, options *imap.SearchOptions) (*imap.SearchData, error) {
	sel := s.sel
	ev := newEvaluator(sel)
	ev.prefilter(s, criteria)
	data := &imap.SearchData{}
	var seqs imap.SeqSet
	var uids imap.UIDSet
	var matched []uint32
	var minModSeq, maxModSeq uint64 // of the messages MIN and MAX name
	for i, m := range sel.msgs {
		if ev.excluded(m) {
			continue
		}
		sm := &searchMsg{s: s, m: m, seq: uint32(i + 1)}
		if !ev.match(criteria, sm) {
			continue
		}
		matched = append(matched, m.uid)
		num := uint32(i + 1)
		if kind == imapserver.NumKindUID {
			num = m.uid
			uids.AddNum(imap.UID(m.uid))
		} else {
			seqs.AddNum(num)
		}
		if data.Min == 0 || num < data.Min {
			data.Min, minModSeq = num, m.modSeq
		}
		if num > data.Max {
			data.Max, maxModSeq = num, m.modSeq
		}
		data.Count++
		if hasModSeq(criteria) && m.modSeq > data.ModSeq {
			data.ModSeq = m.modSeq
		}
	}
	if hasModSeq(criteria) && !options.ReturnAll && !options.ReturnCount && (options.ReturnMin || options.ReturnMax) {
		// RFC 7162 §3.1.5: with only MIN and/or MAX returned, MODSEQ is
		// the highest of the messages returned, not of every match.
		data.ModSeq = 0
		if options.ReturnMin {
			data.ModSeq = minModSeq
		}
		if options.ReturnMax {
			data.ModSeq = max(data.ModSeq, maxModSeq)
		}
	}
	if kind == imapserver.NumKindUID {
		data.All = uids
	} else {
		data.All = seqs
	}
	if options.ReturnSave {
		// RFC 5182 §2.1: with MIN or MAX alone only those are saved.
		switch {
		case options.ReturnAll || options.ReturnCount || (options.ReturnMin && options.ReturnMax) || len(matched) == 0:
			sel.searchRes = matched
		case options.ReturnMin:
			sel.searchRes = matched[:1]
		case options.ReturnMax:
			sel.searchRes = matched[len(matched)-1:]
		default:
			sel.searchRes = matched
		}
	}
	return data, nil
}

func hasModSeq(c *imap.SearchCriteria) bool {
	if c.ModSeq != nil {
		return true
	}
	for i := range c.Not {
		if hasModSeq(&c.Not[i]) {
			return true
		}
	}
	for i := range c.Or {
		if hasModSeq(&c.Or[i][0]) || hasModSeq(&c.Or[i][1]) {
			return true
		}
	}
	return false
}

func newEvaluator(sel *selected) *evaluator {
	ev := &evaluator{n: uint32(len(sel.msgs)), saved: map[uint32]bool{}}
	if view := sel.view(); len(view) > 0 {
		ev.maxUID = view[len(view)-1]
	}
	for _, u := range sel.searchRes {
		ev.saved[u] = true
	}
	return ev
}

type evaluator struct {
	n      uint32 // messages in the view, for "*" in sequence sets
	maxUID uint32 // for "*" in UID sets
	saved  map[uint32]bool
	// skip holds, ascending, the messages the text index says cannot
	// match the criteria's string keys (prefilter).
	skip []mailbox.TextSkip
	// sure holds, by header key (lower-case) and value, ascending, the
	// messages the text index says certainly match that key.
	sure map[[2]string][]mailbox.TextSkip
}

// TextIndex is a Store whose nodes keep a text index of the messages they
// hold (proxy.IMAPStore over mailbox/textindex.go).
type TextIndex interface {
	// TextExcluded returns, ascending, messages of the mailbox with
	// UIDVALIDITY v that cannot match every query, and for each query
	// messages that certainly match it; it may leave out any of either.
	TextExcluded(ctx context.Context, user string, v uint64, queries []fts.Query) (*mailbox.TextAnswer, error)
}

// textIndexMin is the smallest mailbox whose search asks the text index:
// a smaller one is read faster than the index is asked.
const textIndexMin = 64

// prefilter asks the text index which messages cannot match the string
// keys that every match must satisfy (those at the top of the criteria,
// ANDed; OR and NOT are matched as before). If the index cannot answer,
// every message is read, as without one.
func (ev *evaluator) prefilter(s *session, c *imap.SearchCriteria) {
	ti, ok := s.srv.store.(TextIndex)
	if !ok || len(s.sel.msgs) < textIndexMin {
		return
	}
	var qs []fts.Query
	var keys [][2]string // the header key and value of qs[i], if any
	add := func(q fts.Query, ok bool, key [2]string) {
		if ok {
			qs = append(qs, q)
			keys = append(keys, key)
		}
	}
	for _, hf := range c.Header {
		if hf.Key != imapserver.SearchKeyEmailID && hf.Key != imapserver.SearchKeyThreadID {
			q, ok := fts.QueryHeader(hf.Key, hf.Value)
			add(q, ok, [2]string{strings.ToLower(hf.Key), hf.Value})
		}
	}
	for _, b := range c.Body {
		q, ok := fts.QueryBody(b)
		add(q, ok, [2]string{})
	}
	for _, t := range c.Text {
		q, ok := fts.QueryText(t)
		add(q, ok, [2]string{})
	}
	if len(qs) == 0 {
		return
	}
	a, err := ti.TextExcluded(s.ctx(), s.user, uint64(s.sel.uidValidity), qs)
	if err != nil {
		return
	}
	ev.skip = a.Skip
	for i, sure := range a.Sure {
		if i < len(keys) && keys[i][0] != "" && len(sure) > 0 {
			if ev.sure == nil {
				ev.sure = map[[2]string][]mailbox.TextSkip{}
			}
			ev.sure[keys[i]] = sure
		}
	}
}

// excluded reports whether the text index ruled the message out.
func (ev *evaluator) excluded(m *msgState) bool {
	if len(ev.skip) == 0 {
		return false
	}
	_, found := slices.BinarySearch(ev.skip, m.skip())
	return found
}

// proven reports whether the text index proved that the message matches
// header key with value (a key and value the same wherever they stand in
// the criteria).
func (ev *evaluator) proven(m *msgState, key, value string) bool {
	sure := ev.sure[[2]string{strings.ToLower(key), value}]
	if len(sure) == 0 || m.gone {
		// A message expunged elsewhere matches no string key (its bytes
		// are not read), whatever a lagging replica's index still says.
		return false
	}
	_, found := slices.BinarySearch(sure, m.skip())
	return found
}

// searchMsg loads a message's bytes, header and text at most once, and only
// when a criterion needs them.
type searchMsg struct {
	s   *session
	m   *msgState
	seq uint32

	loaded bool
	raw    []byte
	err    error // why raw could not be read
	hdr    *textproto.Header
	body   string // lower-cased fts.BodyText
	bodyOK bool
}

func (sm *searchMsg) load() []byte {
	if !sm.loaded {
		sm.loaded = true
		if !sm.m.gone {
			sm.raw, sm.err = sm.s.srv.store.Body(sm.s.ctx(), sm.s.user, sm.m.id)
		}
	}
	return sm.raw
}

func (sm *searchMsg) header() *textproto.Header {
	if sm.hdr == nil {
		h := readHeader(sm.load())
		sm.hdr = &h
	}
	return sm.hdr
}

func (sm *searchMsg) bodyText() string {
	if !sm.bodyOK {
		sm.bodyOK = true
		sm.body = fts.BodyText(sm.load())
	}
	return sm.body
}

func contains(hay, needle string) bool {
	return strings.Contains(hay, strings.ToLower(needle))
}

func (sm *searchMsg) headerMatch(key, value string) bool {
	h := sm.header()
	vals := h.Values(key)
	if len(vals) == 0 {
		return false
	}
	if value == "" {
		return true // RFC 9051 §6.4.4: HEADER with "" matches every message with the field
	}
	for _, v := range vals {
		v = unfold(v)
		if contains(strings.ToLower(v), value) {
			return true
		}
		if d, err := fts.DecodeHeader(v); err == nil && contains(strings.ToLower(d), value) {
			return true
		}
		// An address written with comments or folding inside it
		// ("<user (c)@ (c) example.org>") is matched as it reads once
		// parsed, as ENVELOPE shows it.
		if fts.AddressField(strings.ToLower(key)) {
			for _, a := range parseAddressList(v) {
				if contains(strings.ToLower(a.Mailbox+"@"+a.Host), value) || contains(strings.ToLower(a.Name), value) {
					return true
				}
			}
		}
	}
	return false
}

func day(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

func (sm *searchMsg) sentDate() time.Time {
	h := mail.Header{Header: gomessage.Header{Header: *sm.header()}}
	if t, err := h.Date(); err == nil && !t.IsZero() {
		return t
	}
	return sm.m.date // no usable Date: use the internal date, as Dovecot does
}

func (ev *evaluator) match(c *imap.SearchCriteria, sm *searchMsg) bool {
	m := sm.m
	for _, set := range c.SeqNum {
		if !seqContains(set, sm.seq, ev.n) {
			return false
		}
	}
	for _, set := range c.UID {
		if imap.IsSearchRes(set) {
			if !ev.saved[m.uid] {
				return false
			}
			continue
		}
		if !uidContains(set, m.uid, ev.maxUID) {
			return false
		}
	}
	for _, f := range c.Flag {
		if !m.has(string(f)) {
			return false
		}
	}
	for _, f := range c.NotFlag {
		if m.has(string(f)) {
			return false
		}
	}
	if c.Larger > 0 && m.size <= c.Larger {
		return false
	}
	if c.Smaller > 0 && m.size >= c.Smaller {
		return false
	}
	if c.ModSeq != nil && m.modSeq < c.ModSeq.ModSeq {
		return false
	}
	if !c.Since.IsZero() && day(m.date).Before(day(c.Since)) {
		return false
	}
	if !c.Before.IsZero() && !day(m.date).Before(day(c.Before)) {
		return false
	}
	if !c.SentSince.IsZero() || !c.SentBefore.IsZero() {
		if sm.load() == nil {
			return false
		}
		d := day(sm.sentDate())
		if !c.SentSince.IsZero() && d.Before(day(c.SentSince)) {
			return false
		}
		if !c.SentBefore.IsZero() && !d.Before(day(c.SentBefore)) {
			return false
		}
	}
	for _, hf := range c.Header {
		switch hf.Key {
		case imapserver.SearchKeyEmailID:
			if sm.load() == nil {
				return false
			}
			if id, err := sm.s.emailID(m, sm.raw); err != nil || id != hf.Value {
				return false
			}
			continue
		case imapserver.SearchKeyThreadID:
			return false // no thread ids (objectid.go)
		}
		if ev.proven(m, hf.Key, hf.Value) {
			continue
		}
		if sm.load() == nil || !sm.headerMatch(hf.Key, hf.Value) {
			return false
		}
	}
	for _, b := range c.Body {
		if sm.load() == nil || !contains(sm.bodyText(), b) {
			return false
		}
	}
	for _, t := range c.Text {
		raw := sm.load()
		if raw == nil {
			return false
		}
		if !contains(strings.ToLower(string(raw[:headerLen(raw)])), t) && !ev.anyHeaderDecoded(sm, t) && !contains(sm.bodyText(), t) {
			return false
		}
	}
	for i := range c.Not {
		if ev.match(&c.Not[i], sm) {
			return false
		}
	}
	for i := range c.Or {
		if !ev.match(&c.Or[i][0], sm) && !ev.match(&c.Or[i][1], sm) {
			return false
		}
	}
	return true
}

func (ev *evaluator) anyHeaderDecoded(sm *searchMsg, t string) bool {
	for f := sm.header().Fields(); f.Next(); {
		if d, err := fts.DecodeHeader(unfold(f.Value())); err == nil && contains(strings.ToLower(d), t) {
			return true
		}
	}
	return false
}

// seqContains reports whether sequence number seq is in set, "*" being n.
// Numbers past n simply match nothing (SEARCH is lenient).
func seqContains(set imap.SeqSet, seq, n uint32) bool {
	for _, r := range set {
		a, b := r.Start, r.Stop
		if a == 0 {
			a = n
		}
		if b == 0 {
			b = n
		}
		if a > b {
			a, b = b, a
		}
		if seq >= a && seq <= b {
			return true
		}
	}
	return false
}

// uidContains reports whether uid is in set, "*" being the highest UID in
// the mailbox (so "n:*" always includes it, RFC 9051 §6.4.9).
func uidContains(set imap.UIDSet, uid, maxUID uint32) bool {
	for _, r := range set {
		if a, b := uidRange(r, maxUID); uid >= a && uid <= b {
			return true
		}
	}
	return false
}
