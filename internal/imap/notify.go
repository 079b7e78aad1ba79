package imap

// NOTIFY (RFC 5465): the session keeps what the client asked for and the
// changes to the user's mail since it last reported. The changes come from
// the store's subscription (any node's deliveries, flag changes, expunges
// and mailbox changes, as IDLE hears them); a goroutine takes them while
// NOTIFY is on and signals the connection, which lets NotifyFlush write,
// between commands or during IDLE:
//   - for the selected mailbox, when a SELECTED or SELECTED-DELAYED group
//     asks: EXISTS, FETCH of changed flags and (SELECTED only) EXPUNGE,
//     then MessageNew's fetch attributes for the new messages;
//   - for other mailboxes a group with MessageNew covers: STATUS (MESSAGES
//     UIDNEXT UIDVALIDITY, and HIGHESTMODSEQ with FlagChange) when one of
//     those changed;
//   - MailboxName: LIST for a mailbox made (`()`), gone (`\NonExistent`)
//     or renamed (the new name, with OLDNAME);
//     SubscriptionChange: LIST with or without `\Subscribed`.
// Without a group for the selected mailbox, it is reported as without
// NOTIFY: at the end of commands.

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// notifyState is a NOTIFY SET in force.
type notifyState struct {
	set   *imapserver.NotifySet
	ready chan struct{} // one pending signal at most
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	changed map[uint64]bool // mailboxes changed since the last flush
	// any: a change without a mailbox (mailboxes made, gone or renamed,
	// or a change through another node's writer, which says only that
	// something changed): every watched mailbox is looked at.
	any bool

	// What was last reported, to say only what changed: per mailbox
	// name, its STATUS items and whether it is subscribed, and the
	// HIGHESTMODSEQ it was looked at (a mailbox whose HIGHESTMODSEQ
	// stayed is not read again).
	status map[string]notifyStatus
	boxes  map[string]bool
	seenAt map[string]uint64
	// ids are the mailboxes' ids by name: a rename keeps the id, which is
	// how a name gone and a name made are told as one RENAME.
	ids map[string]uint64
}

type notifyStatus struct {
	messages, uidNext, uidValidity uint32
	modSeq                         uint64
}

// SetNotify implements imapserver.SessionNotify.
func (s *session) SetNotify(w *imapserver.UpdateWriter, set *imapserver.NotifySet) error {
	if set == nil {
		s.stopNotify()
		return nil
	}
	n := &notifyState{set: set, ready: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		changed: map[uint64]bool{}, status: map[string]notifyStatus{}, boxes: map[string]bool{}, seenAt: map[string]uint64{}, ids: map[string]uint64{}}
	// The state the changes are told against; with STATUS, told at once
	// (RFC 5465 §3.1).
	// A NOTIFY SET that fails leaves the one before in force.
	boxes, err := s.srv.store.Mailboxes(s.ctx(), s.user)
	if err != nil {
		return storeErr("NOTIFY", err)
	}
	var statuses []*imap.StatusData
	for _, mb := range boxes {
		n.boxes[mb.Name] = mb.Subscribed
		n.seenAt[mb.Name] = mb.HighestModSeq
		n.ids[mb.Name] = mb.ID
		g := n.groupFor(mb.Name, mb.Subscribed)
		if g == nil || !g.Has(imapserver.NotifyMessageNew) || s.isSelected(mb.ID) {
			continue
		}
		st, data, err := s.notifyStatus(&mb, g)
		if err != nil {
			return storeErr("NOTIFY", err)
		}
		n.status[mb.Name] = st
		statuses = append(statuses, data)
	}
	s.stopNotify()
	s.notify = n
	go s.takeChanges(n)
	if set.Status {
		for _, data := range statuses {
			if err := w.WriteStatus(data); err != nil {
				return err
			}
		}
	}
	return nil
}

// stopNotify ends NOTIFY (NOTIFY NONE, a new NOTIFY SET, the end of the
// session).
func (s *session) stopNotify() {
	if s.notify == nil {
		return
	}
	close(s.notify.stop)
	<-s.notify.done
	s.notify = nil
}

// takeChanges records the user's changes while NOTIFY is on.
func (s *session) takeChanges(n *notifyState) {
	defer close(n.done)
	for {
		select {
		case <-n.stop:
			return
		case c, ok := <-s.changes:
			if !ok {
				return
			}
			n.mu.Lock()
			if c.Mailbox == 0 {
				n.any = true
			} else {
				n.changed[c.Mailbox] = true
			}
			n.mu.Unlock()
			select {
			case n.ready <- struct{}{}:
			default:
			}
		}
	}
}

// NotifyReady implements imapserver.SessionNotify.
func (s *session) NotifyReady() <-chan struct{} {
	if s.notify == nil {
		return nil
	}
	return s.notify.ready
}

func (s *session) isSelected(id uint64) bool { return s.sel != nil && s.sel.id == id }

// groupFor returns the first group that covers a mailbox other than the
// selected one.
func (n *notifyState) groupFor(name string, subscribed bool) *imapserver.NotifyGroup {
	for i := range n.set.Groups {
		g := &n.set.Groups[i]
		match := false
		switch g.Filter {
		case imapserver.NotifyInboxes:
			match = strings.EqualFold(name, mailbox.Inbox)
		case imapserver.NotifyPersonal:
			match = true
		case imapserver.NotifySubscribed:
			match = subscribed
		case imapserver.NotifyMailboxes:
			match = slices.ContainsFunc(g.Mailboxes, func(m string) bool { return sameBox(m, name) })
		case imapserver.NotifySubtree:
			match = slices.ContainsFunc(g.Mailboxes, func(m string) bool {
				return sameBox(m, name) || strings.HasPrefix(name, m+mailbox.Separator)
			})
		}
		if match {
			return g
		}
	}
	return nil
}

// selectedGroup returns the group for the selected mailbox, if any.
func (n *notifyState) selectedGroup() *imapserver.NotifyGroup {
	for i := range n.set.Groups {
		if f := n.set.Groups[i].Filter; f == imapserver.NotifySelected || f == imapserver.NotifySelectedDelayed {
			return &n.set.Groups[i]
		}
	}
	return nil
}

func sameBox(a, b string) bool {
	if strings.EqualFold(a, mailbox.Inbox) {
		return strings.EqualFold(b, mailbox.Inbox)
	}
	return a == b
}

// notifyStatus is the STATUS NOTIFY reports of a mailbox.
func (s *session) notifyStatus(mb *mailbox.Mailbox, g *imapserver.NotifyGroup) (notifyStatus, *imap.StatusData, error) {
	opts := &imap.StatusOptions{NumMessages: true, UIDNext: true, UIDValidity: true,
		HighestModSeq: g.Has(imapserver.NotifyFlagChange)}
	data, err := s.status(mb, opts)
	if err != nil {
		return notifyStatus{}, nil, err
	}
	st := notifyStatus{uidNext: uint32(data.UIDNext), uidValidity: data.UIDValidity}
	if data.NumMessages != nil {
		st.messages = *data.NumMessages
	}
	out := &imap.StatusData{Mailbox: data.Mailbox, NumMessages: &st.messages, UIDNext: data.UIDNext, UIDValidity: data.UIDValidity}
	if opts.HighestModSeq {
		st.modSeq = data.HighestModSeq
		out.HighestModSeq = max(st.modSeq, 1)
	}
	return st, out, nil
}

// notifyRetry is how soon a report that could not be made (the store did
// not answer) is tried again.
const notifyRetry = 2 * time.Second

// NotifyFlush implements imapserver.SessionNotify. A report the store
// cannot make now is kept and tried again after notifyRetry; only a
// response that cannot be written is an error.
func (s *session) NotifyFlush(w *imapserver.UpdateWriter) error {
	n := s.notify
	if n == nil {
		return nil
	}
	n.mu.Lock()
	changed, anyBox := n.changed, n.any
	n.changed, n.any = map[uint64]bool{}, false
	n.mu.Unlock()
	var wrote writeErr
	err := s.notifyReport(&writeTracker{w, &wrote}, n, changed, anyBox)
	if err != nil && wrote.err == nil {
		// Not made: keep the changes, and look again in a while.
		s.srv.cfg.Logger.Warn("NOTIFY: report not made, tried again", "user", s.user, "err", err)
		n.mu.Lock()
		for id := range changed {
			n.changed[id] = true
		}
		n.any = n.any || anyBox
		n.mu.Unlock()
		time.AfterFunc(notifyRetry, func() {
			select {
			case n.ready <- struct{}{}:
			default:
			}
		})
		return nil
	}
	return wrote.err
}

// writeErr remembers the first error writing a response.
type writeErr struct{ err error }

// writeTracker is the UpdateWriter calls NOTIFY makes, remembering a
// failed write apart from a store error.
type writeTracker struct {
	w   *imapserver.UpdateWriter
	bad *writeErr
}

func (t *writeTracker) note(err error) error {
	if err != nil && t.bad.err == nil {
		t.bad.err = err
	}
	return err
}

func (t *writeTracker) WriteStatus(d *imap.StatusData) error { return t.note(t.w.WriteStatus(d)) }
func (t *writeTracker) WriteList(d *imap.ListData) error     { return t.note(t.w.WriteList(d)) }

// notifyReport writes what the changes call for.
func (s *session) notifyReport(t *writeTracker, n *notifyState, changed map[uint64]bool, anyBox bool) error {
	if g := n.selectedGroup(); g != nil && s.sel != nil && g.Has(imapserver.NotifyMessageNew) && (changed[s.sel.id] || anyBox) {
		high := s.sel.uidHigh
		if err := s.sync(t.w, g.Filter == imapserver.NotifySelected); err != nil {
			return err
		}
		if g.Fetch != nil && s.sel != nil && s.sel.uidHigh > high {
			// MessageNew's fetch attributes, for the messages new since
			// (by UID: the client may not rely on sequence numbers).
			var set imap.UIDSet
			set.AddRange(imap.UID(high+1), imap.UID(s.sel.uidHigh))
			if err := t.w.FetchNew(set, g); err != nil {
				return err
			}
		}
	}
	if len(changed) == 0 && !anyBox {
		return nil
	}
	boxes, err := s.srv.store.Mailboxes(s.ctx(), s.user)
	if err != nil {
		return err
	}
	w := t
	seen := map[string]bool{}
	for _, mb := range boxes {
		seen[mb.Name] = true
	}
	// Names gone, by id: one whose id comes back under a new name was
	// renamed (RFC 5465 §5.4: LIST of the new name with OLDNAME).
	goneByID := map[uint64]string{}
	for name := range n.boxes {
		if !seen[name] {
			goneByID[n.ids[name]] = name
		}
	}
	renamed := map[string]bool{}
	for _, mb := range boxes {
		was, known := n.boxes[mb.Name]
		// A mailbox that was subscribed and is no more still matches
		// SUBSCRIBED for telling so.
		g := n.groupFor(mb.Name, mb.Subscribed || was)
		n.boxes[mb.Name] = mb.Subscribed
		n.ids[mb.Name] = mb.ID
		old, isRename := goneByID[mb.ID]
		if !known && isRename {
			renamed[old] = true
			delete(goneByID, mb.ID)
			n.status[mb.Name], n.seenAt[mb.Name] = n.status[old], n.seenAt[old]
		}
		if g == nil {
			continue
		}
		if !known && g.Has(imapserver.NotifyMailboxName) {
			l := s.notifyList(mb.Name, nil, mb.Subscribed)
			if isRename {
				l.OldName = old
			}
			if err := w.WriteList(l); err != nil {
				return err
			}
		} else if known && was != mb.Subscribed && g.Has(imapserver.NotifySubscriptionChange) {
			if err := w.WriteList(s.notifyList(mb.Name, nil, mb.Subscribed)); err != nil {
				return err
			}
		}
		at, looked := n.seenAt[mb.Name]
		n.seenAt[mb.Name] = mb.HighestModSeq
		if !g.Has(imapserver.NotifyMessageNew) || s.isSelected(mb.ID) || (looked && at == mb.HighestModSeq && !changed[mb.ID]) {
			continue
		}
		st, data, err := s.notifyStatus(&mb, g)
		if err != nil {
			return err
		}
		if old, ok := n.status[mb.Name]; ok && old == st {
			continue
		}
		n.status[mb.Name] = st
		if err := w.WriteStatus(data); err != nil {
			return err
		}
	}
	for name, sub := range n.boxes {
		if seen[name] {
			continue
		}
		delete(n.boxes, name)
		delete(n.status, name)
		delete(n.seenAt, name)
		delete(n.ids, name)
		if renamed[name] {
			continue
		}
		if g := n.groupFor(name, sub); g != nil && g.Has(imapserver.NotifyMailboxName) {
			if err := w.WriteList(s.notifyList(name, []imap.MailboxAttr{imap.MailboxAttrNonExistent}, false)); err != nil {
				return err
			}
		}
	}
	return nil
}

// notifyList is the LIST response NOTIFY sends for a mailbox.
func (s *session) notifyList(name string, attrs []imap.MailboxAttr, subscribed bool) *imap.ListData {
	if subscribed {
		attrs = append(attrs, imap.MailboxAttrSubscribed)
	}
	return &imap.ListData{Attrs: attrs, Delim: rune(mailbox.Separator[0]), Mailbox: name}
}
