package imap

import (
	"errors"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// selected is a session's view of its selected mailbox: msgs[i] is message
// sequence number i+1 as the client knows it.
type selected struct {
	id          uint64
	name        string
	uidValidity uint32
	readOnly    bool

	msgs    []*msgState
	uidHigh uint32 // highest UID ever announced
	uidNext uint32 // the mailbox's UIDNEXT when last synced
	modSeq  uint64 // the mailbox's HIGHESTMODSEQ when last synced
	// viewGen counts the syncs that took in a change; contextModSeq and
	// contextGen are modSeq and viewGen when updating searches were last
	// computed again (imapserver's context.go).
	viewGen, contextGen uint64
	contextModSeq       uint64
	// ghosts counts messages expunged elsewhere but still numbered here,
	// because the EXPUNGE could not yet be sent.
	ghosts int
	// flagsSent is the set of flags the last FLAGS response listed (as
	// flagSetKey makes it); a keyword that comes or goes sends FLAGS again.
	flagsSent string
	// searchRes is the saved SEARCH result, as UIDs (RFC 5182).
	searchRes []uint32
	// sortCache keeps the sort keys of messages SORT or THREAD read, by
	// message id (sort.go).
	sortCache map[string]*sortInfo
	// emailIDs keeps the EMAILIDs made for messages, by message id
	// (objectid.go).
	emailIDs map[string]string
}

// msgState is what the session knows of one message.
type msgState struct {
	uid    uint32
	id     string
	size   int64
	date   time.Time
	flags  []string
	modSeq uint64
	recent bool
	gone   bool // expunged elsewhere, EXPUNGE not yet sent
	// skipKey is mailbox.SkipOf(uid, id), made at the first search that
	// asks the text index (0: not yet; a UID is never 0).
	skipKey mailbox.TextSkip
}

// skip returns how the text index names the message.
func (m *msgState) skip() mailbox.TextSkip {
	if m.skipKey == 0 {
		m.skipKey = mailbox.SkipOf(m.uid, m.id)
	}
	return m.skipKey
}

func newMsgState(m *mailbox.Message) *msgState {
	return &msgState{uid: m.UID, id: m.ID, size: m.Size, date: m.Date, flags: m.Flags, modSeq: m.ModSeq}
}

func (m *msgState) has(flag string) bool {
	if strings.EqualFold(flag, `\Recent`) {
		return m.recent
	}
	for _, f := range m.flags {
		if strings.EqualFold(f, flag) {
			return true
		}
	}
	return false
}

// imapFlags returns the message's flags for a FETCH response, with \Recent
// when this session holds it, unless the client enabled IMAP4rev2, which has
// no \Recent (RFC 9051 Appendix E).
func (m *msgState) imapFlags(rev2 bool) []imap.Flag {
	out := make([]imap.Flag, 0, len(m.flags)+1)
	for _, f := range m.flags {
		out = append(out, imap.Flag(f))
	}
	if m.recent && !rev2 {
		out = append(out, flagRecent)
	}
	return out
}

// flagRecent is the session flag of RFC 3501 §2.3.2 (the library keeps its
// constant internal).
const flagRecent imap.Flag = `\Recent`

var systemFlags = []imap.Flag{imap.FlagAnswered, imap.FlagFlagged, imap.FlagDeleted, imap.FlagSeen, imap.FlagDraft}

// mailboxFlags is the FLAGS response: the system flags and every keyword in
// use in the mailbox.
func (sel *selected) mailboxFlags() []imap.Flag {
	out := append([]imap.Flag{}, systemFlags...)
	seen := map[string]bool{}
	for _, f := range systemFlags {
		seen[strings.ToLower(string(f))] = true
	}
	for _, m := range sel.msgs {
		for _, f := range m.flags {
			if k := strings.ToLower(f); !seen[k] {
				seen[k] = true
				out = append(out, imap.Flag(f))
			}
		}
	}
	return out
}

func (sel *selected) view() []uint32 {
	v := make([]uint32, len(sel.msgs))
	for i, m := range sel.msgs {
		v[i] = m.uid
	}
	return v
}

// resolve turns a message set of the client into view indexes.
func (s *session) resolve(set imap.NumSet, lenient bool) ([]int, error) {
	sel := s.sel
	if imap.IsSearchRes(set) {
		return resolveUIDs(sel.searchRes, sel.view()), nil
	}
	switch set := set.(type) {
	case imap.SeqSet:
		idx, err := resolveSeqSet(set, uint32(len(sel.msgs)), lenient)
		if err != nil {
			return nil, bad("%v", err)
		}
		return idx, nil
	case imap.UIDSet:
		return resolveUIDSet(set, sel.view()), nil
	}
	return nil, bad("unknown message set type %T", set)
}

// Poll reports what changed in the selected mailbox since the session last
// looked (RFC 9051 §7.5.1). EXPUNGE only when allowExpunge; otherwise the
// expunged messages stay numbered until a later poll. A writer that cannot
// be reached for now (its node dying, the bucket moving) leaves the report
// to the next command's poll: the command itself is done, and an error
// here would end the session (the library closes the connection).
func (s *session) Poll(w *imapserver.UpdateWriter, allowExpunge bool) error {
	if s.sel == nil {
		w.CondStoreJustEnabled() // nothing selected: nothing to report
		return nil
	}
	if err := s.sync(w, allowExpunge); errorCode(err) == imap.ResponseCodeUnavailable {
		s.srv.cfg.Logger.Info("imap: changes not polled for now", "user", s.user, "err", err)
	} else if err != nil {
		return err
	}
	// RFC 7162 §3.1: the command that enabled CONDSTORE implicitly
	// (FETCH MODSEQ, SEARCH MODSEQ, STORE UNCHANGEDSINCE, STATUS
	// HIGHESTMODSEQ) is answered with the mailbox's HIGHESTMODSEQ.
	if w.CondStoreJustEnabled() && s.sel != nil {
		return w.WriteHighestModSeq(s.sel.modSeq)
	}
	return nil
}

func (s *session) sync(w *imapserver.UpdateWriter, allowExpunge bool) error {
	if err := s.syncView(w, allowExpunge); err != nil {
		return err
	}
	// Updating searches (RFC 5267 §4.3) are computed again after any
	// change: one this sync took in (viewGen: new messages, flags,
	// expunges seen or announced, the mailbox deleted) or the session's
	// own, which the view already holds (ownChanges moves modSeq).
	if sel := s.sel; sel != nil && (sel.modSeq != sel.contextModSeq || sel.viewGen != sel.contextGen) {
		sel.contextModSeq, sel.contextGen = sel.modSeq, sel.viewGen
		return w.MailboxSynced()
	}
	return nil
}

// ContextResults implements imapserver.SessionContext: the UIDs an
// updating search holds now, without the messages expunged but still
// numbered here (gone for the client's context as soon as seen).
func (s *session) ContextResults(program []imapserver.SortCriterion, criteria *imap.SearchCriteria) ([]uint32, error) {
	if s.sel == nil {
		return nil, nil
	}
	var uids []uint32
	if program == nil {
		data, err := s.Search(imapserver.NumKindUID, criteria, &imap.SearchOptions{})
		if err != nil {
			return nil, err
		}
		set, _ := data.All.(imap.UIDSet)
		all, _ := set.Nums()
		for _, u := range all {
			uids = append(uids, uint32(u))
		}
	} else {
		var err error
		if uids, _, err = s.Sort(imapserver.NumKindUID, program, criteria); err != nil {
			return nil, err
		}
	}
	if s.sel.ghosts == 0 {
		return uids, nil
	}
	gone := map[uint32]bool{}
	for _, m := range s.sel.msgs {
		if m.gone {
			gone[m.uid] = true
		}
	}
	return slices.DeleteFunc(uids, func(u uint32) bool { return gone[u] }), nil
}

// syncView brings the session's view of the selected mailbox up to date
// and tells the client what changed, as far as allowed.
func (s *session) syncView(w *imapserver.UpdateWriter, allowExpunge bool) error {
	sel := s.sel
	var fresh []mailbox.Message
	mb, err := s.srv.store.MailboxByID(s.ctx(), s.user, sel.id)
	switch {
	case errors.Is(err, mailbox.ErrNoMailbox):
		// Deleted by another session: every message is gone.
		sel.viewGen++
	case err != nil:
		return err
	case mb.HighestModSeq == sel.modSeq && !(allowExpunge && sel.ghosts > 0):
		return nil
	default:
		sel.viewGen++
		if fresh, err = s.srv.store.Messages(s.ctx(), s.user, sel.id); err != nil {
			return err
		}
		sel.modSeq = mb.HighestModSeq
		sel.uidNext = max(sel.uidNext, mb.UIDNext)
	}
	condStore := s.condStore()

	// Merge the view with the fresh list; both are in UID order.
	var kept []*msgState
	var flagChanged []*msgState
	j := 0
	for _, m := range sel.msgs {
		for j < len(fresh) && fresh[j].UID < m.uid {
			j++ // a UID below the view's that we never saw: cannot happen
		}
		if j < len(fresh) && fresh[j].UID == m.uid {
			f := &fresh[j]
			if f.ModSeq != m.modSeq || !mailbox.SameFlags(f.Flags, m.flags) {
				m.flags, m.modSeq = f.Flags, f.ModSeq
				flagChanged = append(flagChanged, m)
			}
			j++
		} else if !m.gone {
			m.gone = true
			sel.ghosts++
		}
		kept = append(kept, m)
	}
	var added []*msgState
	for ; j < len(fresh); j++ {
		if fresh[j].UID > sel.uidHigh {
			added = append(added, newMsgState(&fresh[j]))
		}
	}

	// EXPUNGE, highest sequence number first, so each number is the
	// message's current one.
	if allowExpunge && sel.ghosts > 0 {
		var idx []int
		for i := len(sel.msgs) - 1; i >= 0; i-- {
			if sel.msgs[i].gone {
				idx = append(idx, i)
			}
		}
		if err := sel.writeExpunged(w, idx); err != nil {
			return err
		}
		kept = kept[:0]
		for _, m := range sel.msgs {
			if !m.gone {
				kept = append(kept, m)
			}
		}
		sel.ghosts = 0
	}
	sel.msgs = kept

	// A keyword another session brought is announced before a FETCH
	// shows it (new messages' keywords are checked again below).
	if flags, changed := sel.flagsChanged(); changed {
		if err := w.WriteMailboxFlagsPermanent(flags, sel.permanentFlags(flags)); err != nil {
			return err
		}
	}

	// FETCH FLAGS for messages changed elsewhere.
	if len(flagChanged) > 0 {
		pos := make(map[*msgState]int, len(sel.msgs))
		for i, m := range sel.msgs {
			pos[m] = i + 1
		}
		for _, m := range flagChanged {
			if m.gone {
				continue
			}
			var ms uint64
			if condStore {
				ms = m.modSeq
			}
			if err := w.WriteMessageFlagsModSeq(uint32(pos[m]), imap.UID(m.uid), m.imapFlags(s.rev2()), ms); err != nil {
				return err
			}
		}
	}

	// EXISTS and RECENT for new messages.
	if len(added) > 0 {
		last := added[len(added)-1].uid
		first := s.srv.recent.claim(s.user, sel.id, last, sel.readOnly)
		nRecent := uint32(0)
		for _, m := range added {
			m.recent = m.uid >= first
			sel.msgs = append(sel.msgs, m)
		}
		for _, m := range sel.msgs {
			if m.recent {
				nRecent++
			}
		}
		sel.uidHigh = last
		if err := w.WriteNumMessages(uint32(len(sel.msgs))); err != nil {
			return err
		}
		if err := w.WriteNumRecent(nRecent); err != nil {
			return err
		}
	}
	if flags, changed := sel.flagsChanged(); changed {
		if err := w.WriteMailboxFlagsPermanent(flags, sel.permanentFlags(flags)); err != nil {
			return err
		}
	}
	return nil
}

// ownChanges notes MODSEQs this session's own change took (each one what
// its STORE made of the message's flags as the session knew them). When
// they are exactly the ones after the last sync, nothing else changed the
// mailbox meanwhile (every new message, flag change and expunge takes a
// MODSEQ, one after the other per mailbox), the session's view is already
// the mailbox's, and the next poll need not read the whole mailbox again:
// on a large mailbox that read cost more than the STORE.
func (sel *selected) ownChanges(modSeqs []uint64) {
	if len(modSeqs) == 0 {
		return
	}
	slices.Sort(modSeqs)
	for i, ms := range modSeqs {
		if ms != sel.modSeq+uint64(i)+1 {
			return
		}
	}
	sel.modSeq = modSeqs[len(modSeqs)-1]
}

// flagsChanged returns the mailbox's flags when they differ from what the
// session was last told (a keyword came or went), and notes them as told.
func (sel *selected) flagsChanged() ([]imap.Flag, bool) {
	flags := sel.mailboxFlags()
	key := flagSetKey(flags)
	if key == sel.flagsSent {
		return nil, false
	}
	sel.flagsSent = key
	return flags, true
}

// flagSetKey names a set of flags whatever their order or case: a STORE
// that swaps one keyword for another keeps the count but not the set.
func flagSetKey(flags []imap.Flag) string {
	l := make([]string, len(flags))
	for i, f := range flags {
		l[i] = strings.ToLower(string(f))
	}
	sort.Strings(l)
	return strings.Join(l, " ")
}

// permanentFlags is the PERMANENTFLAGS of a mailbox with these flags: all
// of them and \* (any keyword may be made), none when read-only.
func (sel *selected) permanentFlags(flags []imap.Flag) []imap.Flag {
	if sel.readOnly {
		return []imap.Flag{}
	}
	return append(append([]imap.Flag{}, flags...), imap.FlagWildcard)
}

// Idle waits for changes to the user's mail and reports those of the
// selected mailbox as they happen (RFC 2177). A delivery is seen within the
// time of one store commit plus one poll: the mailbox manager publishes a
// change as soon as its batch is durable.
func (s *session) Idle(w *imapserver.UpdateWriter, stop <-chan struct{}) error {
	if s.sel != nil {
		if err := s.sync(w, true); err != nil {
			return err
		}
	}
	tick := time.NewTicker(s.srv.cfg.IdlePoll)
	defer tick.Stop()
	// With NOTIFY on, its goroutine takes the changes (notify.go); IDLE
	// reports what it says, and the selected mailbox as always.
	changes := s.changes
	var notified <-chan struct{}
	if s.notify != nil {
		changes, notified = nil, s.notify.ready
	}
	for {
		select {
		case <-stop:
			return nil
		case <-notified:
			if err := s.NotifyFlush(w); err != nil {
				return err
			}
			if s.sel != nil {
				if err := s.sync(w, true); err != nil {
					return err
				}
			}
		case c, ok := <-changes:
			if !ok {
				<-stop
				return nil
			}
			if s.sel != nil && (c.Mailbox == s.sel.id || c.Mailbox == 0) {
				if err := s.sync(w, true); err != nil {
					return err
				}
			}
		case <-tick.C:
			if s.sel != nil {
				if err := s.sync(w, true); err != nil {
					return err
				}
			}
		}
	}
}

// --- selected-state commands that change things

func (s *session) checkWritable(cmd string) error {
	if s.sel.readOnly {
		return no(codeReadOnly, "%s: mailbox %q is selected read-only (EXAMINE)", cmd, s.sel.name)
	}
	return nil
}

func (s *session) Expunge(w *imapserver.ExpungeWriter, uids *imap.UIDSet) error {
	sel := s.sel
	if sel.readOnly {
		if w.Silent() { // CLOSE of an EXAMINEd mailbox expunges nothing
			return nil
		}
		return s.checkWritable("EXPUNGE")
	}
	// The store removes those of the session's messages that carry
	// \Deleted when it commits, whoever set the flag.
	var target []uint32
	for _, m := range sel.msgs {
		if m.gone {
			continue
		}
		if uids != nil && !uids.Contains(imap.UID(m.uid)) {
			continue
		}
		target = append(target, m.uid)
	}
	if len(target) == 0 {
		return nil
	}
	gone, err := s.srv.store.ExpungeDeleted(s.ctx(), s.user, sel.id, target)
	if err != nil {
		return storeErr("EXPUNGE", err)
	}
	goneSet := map[uint32]bool{}
	for _, u := range gone {
		goneSet[u] = true
	}
	var idx []int
	for i := len(sel.msgs) - 1; i >= 0; i-- {
		if goneSet[sel.msgs[i].uid] {
			idx = append(idx, i)
		}
	}
	if err := sel.writeExpunged(w, idx); err != nil {
		return err
	}
	for _, i := range idx {
		sel.msgs = append(sel.msgs[:i], sel.msgs[i+1:]...)
	}
	return nil
}

func (s *session) Store(w *imapserver.FetchWriter, numSet imap.NumSet, flags *imap.StoreFlags, options *imap.StoreOptions) error {
	sel := s.sel
	if err := s.checkWritable("STORE"); err != nil {
		return err
	}
	idx, err := s.resolve(numSet, false)
	if err != nil {
		return err
	}
	if len(flags.Flags) > maxFlags {
		return bad("STORE: more than %d flags", maxFlags)
	}
	names := make([]string, 0, len(flags.Flags))
	for _, f := range flags.Flags {
		names = append(names, string(f))
	}
	op := mailbox.FlagsSet
	switch flags.Op {
	case imap.StoreFlagsAdd:
		op = mailbox.FlagsAdd
	case imap.StoreFlagsDel:
		op = mailbox.FlagsRemove
	}
	byUID := map[uint32]int{}
	var uids []uint32
	var failed []uint32
	for _, i := range idx {
		m := sel.msgs[i]
		if options.UnchangedSince == imapserver.UnchangedSinceZero {
			failed = append(failed, m.uid) // RFC 7162 §3.1.3: 0 fails for all
			continue
		}
		byUID[m.uid] = i
		uids = append(uids, m.uid)
	}
	var updated []mailbox.Message
	if len(uids) > 0 {
		var f2 []uint32
		updated, f2, err = s.srv.store.StoreFlags(s.ctx(), s.user, sel.id, uids, op, names, options.UnchangedSince)
		if err != nil {
			return storeErr("STORE", err)
		}
		failed = append(failed, f2...)
	}
	condStore := s.condStore() || options.UnchangedSince != 0
	_, isUID := numSet.(imap.UIDSet)
	var own []uint64
	explained := true
	for k := range updated {
		m := sel.msgs[byUID[updated[k].UID]]
		if updated[k].ModSeq > sel.modSeq {
			own = append(own, updated[k].ModSeq)
			explained = explained && mailbox.SameFlags(updated[k].Flags, mailbox.ApplyFlags(m.flags, op, names))
		}
		m.flags, m.modSeq = updated[k].Flags, updated[k].ModSeq
	}
	if explained {
		sel.ownChanges(own)
	}
	// A keyword new to the session is announced before a FETCH shows it.
	if all, changed := sel.flagsChanged(); changed {
		if err := w.WriteMailboxFlags(all, sel.permanentFlags(all)); err != nil {
			return err
		}
	}
	for k := range updated {
		i := byUID[updated[k].UID]
		m := sel.msgs[i]
		if flags.Silent && !condStore {
			continue
		}
		// RFC 7162 §3.1.3: with CONDSTORE even .SILENT reports MODSEQ;
		// §3.1: and every FETCH response of a flag change carries the
		// UID as well.
		rw := w.CreateMessage(uint32(i + 1))
		if isUID || condStore {
			rw.WriteUID(imap.UID(m.uid))
		}
		if !flags.Silent {
			rw.WriteFlags(m.imapFlags(s.rev2()))
		}
		if condStore {
			rw.WriteModSeq(m.modSeq)
		}
		if err := rw.Close(); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		if isUID {
			var set imap.UIDSet
			for _, u := range failed {
				set.AddNum(imap.UID(u))
			}
			w.SetModified(set)
		} else {
			var set imap.SeqSet
			for _, u := range failed {
				for i, m := range sel.msgs {
					if m.uid == u {
						set.AddNum(uint32(i + 1))
					}
				}
			}
			w.SetModified(set)
		}
	}
	return nil
}

func (s *session) copyUIDs(numSet imap.NumSet) ([]uint32, error) {
	idx, err := s.resolve(numSet, false)
	if err != nil {
		return nil, err
	}
	uids := make([]uint32, 0, len(idx))
	for _, i := range idx {
		uids = append(uids, s.sel.msgs[i].uid)
	}
	sort.Slice(uids, func(a, b int) bool { return uids[a] < uids[b] })
	return uids, nil
}

func copyData(res *mailbox.CopyResult) *imap.CopyData {
	if res == nil || len(res.SrcUIDs) == 0 {
		return nil
	}
	var src, dst imap.UIDSet
	for i := range res.SrcUIDs {
		src.AddNum(imap.UID(res.SrcUIDs[i]))
		dst.AddNum(imap.UID(res.DstUIDs[i]))
	}
	return &imap.CopyData{UIDValidity: res.Dest.UIDValidity, SourceUIDs: src, DestUIDs: dst}
}

func (s *session) Copy(numSet imap.NumSet, dest string) (*imap.CopyData, error) {
	what := "COPY to " + quoteName(dest)
	uids, err := s.copyUIDs(numSet)
	if err != nil {
		return nil, err
	}
	_, usage, err := s.srv.store.MailboxUsage(s.ctx(), s.user, dest)
	if errors.Is(err, mailbox.ErrNoMailbox) {
		return nil, no(imap.ResponseCodeTryCreate, "%s: no such mailbox", what)
	}
	if err != nil {
		return nil, storeErr(what, err)
	}
	if len(uids) == 0 {
		return nil, nil
	}
	var size int64
	for _, i := range resolveUIDs(uids, s.sel.view()) {
		size += s.sel.msgs[i].size
	}
	if err := checkQuota(what, usage, int64(len(uids)), size); err != nil {
		return nil, err
	}
	if err := s.checkDomainQuota(what, int64(len(uids)), size); err != nil {
		return nil, err
	}
	res, err := s.srv.store.Copy(s.ctx(), s.user, s.sel.id, uids, dest, false)
	if err != nil {
		return nil, storeErr(what, err)
	}
	return copyData(res), nil
}

// Move implements RFC 6851: copy, then expunge, atomically in the store;
// the COPYUID comes first, then the EXPUNGEs.
func (s *session) Move(w *imapserver.MoveWriter, numSet imap.NumSet, dest string) error {
	what := "MOVE to " + quoteName(dest)
	if err := s.checkWritable("MOVE"); err != nil {
		return err
	}
	uids, err := s.copyUIDs(numSet)
	if err != nil {
		return err
	}
	if _, err := s.srv.store.Mailbox(s.ctx(), s.user, dest); errors.Is(err, mailbox.ErrNoMailbox) {
		return no(imap.ResponseCodeTryCreate, "%s: no such mailbox", what)
	}
	if len(uids) == 0 {
		return nil
	}
	res, err := s.srv.store.Copy(s.ctx(), s.user, s.sel.id, uids, dest, true)
	if err != nil {
		return storeErr(what, err)
	}
	if data := copyData(res); data != nil {
		if err := w.WriteCopyData(data); err != nil {
			return err
		}
	}
	moved := map[uint32]bool{}
	for _, u := range res.SrcUIDs {
		moved[u] = true
	}
	sel := s.sel
	var idx []int
	for i := len(sel.msgs) - 1; i >= 0; i-- {
		if moved[sel.msgs[i].uid] {
			idx = append(idx, i)
		}
	}
	if err := sel.writeExpunged(w, idx); err != nil {
		return err
	}
	for _, i := range idx {
		if sel.msgs[i].gone {
			sel.ghosts--
		}
		sel.msgs = append(sel.msgs[:i], sel.msgs[i+1:]...)
	}
	return nil
}

func quoteName(s string) string { return `"` + s + `"` }
