package writer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
)

// The IMAP operations of the mailbox writer. Each runs at the user's
// manager under the user's writer lock, so the writer's order is the order
// every session sees.

// MailboxRequest names a user's mailbox by name or by id (UIDVALIDITY).
type MailboxRequest struct {
	User       string `json:"user"`
	Name       string `json:"name,omitempty"`
	ID         uint64 `json:"id,omitempty"`
	NewName    string `json:"new_name,omitempty"`
	SpecialUse string `json:"special_use,omitempty"`
	On         bool   `json:"on,omitempty"`
	// Usage asks Mailboxes to count what the user's mail takes when the
	// user has quota limits, UsageAll in any case (it walks every
	// message, so only quota checks and reports ask).
	Usage    bool `json:"usage,omitempty"`
	UsageAll bool `json:"usage_all,omitempty"`
}

// MailboxesReply lists mailboxes.
type MailboxesReply struct {
	Mailboxes []mailbox.Mailbox `json:"mailboxes"`
	// Subscriptions are subscribed names with no mailbox.
	Subscriptions []string `json:"subscriptions,omitempty"`
	// Usage is what the user's mail takes and may take.
	Usage mailbox.Usage `json:"usage"`
}

// MessagesReply is a mailbox view.
type MessagesReply struct {
	Mailbox  mailbox.Mailbox `json:"mailbox"`
	Messages []ViewMsg       `json:"messages"`
}

// withWriter runs fn under the user's writer lock with a copy of the
// profile.
func (m *Manager) withWriter(ctx context.Context, user string, fn func(w *userWriter, p *userdb.Profile) error) error {
	user = userdb.Normalize(user)
	w, err := m.lockWriter(ctx, user)
	if err != nil {
		return err
	}
	defer w.mu.Unlock()
	p, err := m.profileOf(user)
	if err != nil {
		return err
	}
	return fn(w, p)
}

func toMailbox(def *userdb.MailboxDef, b *boxView) mailbox.Mailbox {
	uidNext, modseq := b.shown()
	return mailbox.Mailbox{ID: uint64(def.UIDValidity), Name: def.Name, UIDValidity: def.UIDValidity,
		UIDNext: uidNext, HighestModSeq: modseq, Subscribed: def.Subscribed, SpecialUse: def.SpecialUse}
}

func findDef(p *userdb.Profile, req *MailboxRequest) (*userdb.MailboxDef, error) {
	var def *userdb.MailboxDef
	if req.ID != 0 {
		def = p.MailboxByValidity(uint32(req.ID))
	} else {
		def = p.MailboxByName(req.Name)
	}
	if def == nil {
		return nil, fmt.Errorf("user %s mailbox %q: %w", p.Address, req.Name, mailbox.ErrNoMailbox)
	}
	return def, nil
}

// openBox finds a mailbox and makes sure its view is loaded.
func (m *Manager) openBox(ctx context.Context, w *userWriter, p *userdb.Profile, req *MailboxRequest) (*userdb.MailboxDef, *boxView, error) {
	def, err := findDef(p, req)
	if err != nil {
		return nil, nil, err
	}
	b := w.counters(def)
	b.expire(m.peers.Alive())
	if err := m.load(ctx, w, p.Address, p, def, b); err != nil {
		return nil, nil, err
	}
	return def, b, nil
}

// saveMailboxes writes a profile whose mailboxes changed, and the
// mailboxes where the storage keeps them.
func (m *Manager) saveMailboxes(ctx context.Context, p *userdb.Profile) error {
	if err := m.saveProfile(ctx, p, userdb.ProfileReplicas); err != nil {
		return err
	}
	if err := m.logChanges(ctx, p.Address, profileEntry(p)); err != nil {
		return err
	}
	return m.store.SaveMailboxes(ctx, p)
}

// keepCounters records a mailbox's UIDNEXT and HIGHESTMODSEQ after a change
// that left no message carrying them; a failure is logged (the view here
// keeps them; a next writer may show a lower HIGHESTMODSEQ).
func (m *Manager) keepCounters(ctx context.Context, user string, def *userdb.MailboxDef, b *boxView) {
	if err := m.store.KeepCounters(ctx, user, def, b.used, b.usedMod); err != nil {
		m.log.Warn("could not record a mailbox's UIDNEXT and HIGHESTMODSEQ", "user", user, "mailbox", def.Name, "err", err)
	}
}

// mailboxes lists the user's mailboxes, sorted by name.
func (m *Manager) mailboxes(ctx context.Context, req *MailboxRequest) (*MailboxesReply, error) {
	out := &MailboxesReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		for i := range p.Mailboxes {
			def := &p.Mailboxes[i]
			b := w.counters(def)
			// UIDNEXT and HIGHESTMODSEQ come from the fragments.
			if err := m.load(ctx, w, p.Address, p, def, b); err != nil {
				return err
			}
			out.Mailboxes = append(out.Mailboxes, toMailbox(def, b))
			if req.UsageAll || (req.Usage && (p.QuotaStorage > 0 || p.QuotaMessages > 0)) {
				for _, vm := range b.msgs {
					out.Usage.Messages++
					out.Usage.Storage += vm.Size
				}
			}
		}
		out.Usage.QuotaStorage, out.Usage.QuotaMessages = p.QuotaStorage, p.QuotaMessages
		out.Subscriptions = append([]string(nil), p.Subscriptions...)
		return nil
	})
	return out, err
}

// messages returns the visible messages of a mailbox.
func (m *Manager) messages(ctx context.Context, req *MailboxRequest) (*MessagesReply, error) {
	out := &MessagesReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, b, err := m.openBox(ctx, w, p, req)
		if err != nil {
			return err
		}
		out.Mailbox = toMailbox(def, b)
		out.Messages = b.visible()
		return nil
	})
	return out, err
}

// create makes a mailbox (IMAP CREATE).
func (m *Manager) create(ctx context.Context, req *MailboxRequest) (*mailbox.Mailbox, error) {
	if err := mailbox.ValidateName(req.Name); err != nil {
		return nil, err
	}
	var out mailbox.Mailbox
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		if p.MailboxByName(req.Name) != nil {
			return fmt.Errorf("user %s mailbox %q: %w", p.Address, req.Name, mailbox.ErrMailboxExists)
		}
		name := req.Name
		if strings.EqualFold(name, mailbox.Inbox) {
			name = mailbox.Inbox
		}
		// RFC 9051 §6.3.4: CREATE does not subscribe; a subscription that
		// named the mailbox before it existed now belongs to it.
		p.Mailboxes = append(p.Mailboxes, userdb.MailboxDef{Name: name, UIDValidity: m.nextValidity(p),
			Subscribed: takeSubscription(p, name), SpecialUse: req.SpecialUse})
		def := &p.Mailboxes[len(p.Mailboxes)-1]
		if err := m.saveMailboxes(ctx, p); err != nil {
			return err
		}
		out = toMailbox(def, w.counters(def))
		w.changed(m, p.Address, 0)
		return nil
	})
	return &out, err
}

// delete removes a mailbox and its fragments (IMAP DELETE).
func (m *Manager) delete(ctx context.Context, req *MailboxRequest) error {
	if strings.EqualFold(req.Name, mailbox.Inbox) {
		return fmt.Errorf("user %s: INBOX cannot be deleted", req.User)
	}
	return m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, err := findDef(p, req)
		if err != nil {
			return err
		}
		v := def.UIDValidity
		if def.Subscribed {
			// RFC 9051 §6.3.7: the subscription outlives the mailbox.
			p.Subscriptions = addName(p.Subscriptions, def.Name)
		}
		kept := p.Mailboxes[:0]
		for _, d := range p.Mailboxes {
			if d.UIDValidity != v {
				kept = append(kept, d)
			}
		}
		p.Mailboxes = kept
		if err := m.saveProfile(ctx, p, userdb.ProfileReplicas); err != nil {
			return err
		}
		if err := m.logChanges(ctx, p.Address, profileEntry(p)); err != nil {
			return err
		}
		delete(w.boxes, v)
		if err := m.store.DropMailbox(ctx, p.Address, v); err != nil {
			m.log.Warn("could not drop a deleted mailbox's messages", "user", p.Address, "mailbox", def.Name, "err", err)
		}
		m.vacateSoon(p.Address) // the mailbox's nodes may hold nothing else
		w.changed(m, p.Address, v)
		return nil
	})
}

// rename renames a mailbox and those below it (IMAP RENAME, RFC 3501
// §6.3.5); renaming INBOX moves its messages to the new name and makes a new,
// empty INBOX. Mailboxes are named by UIDVALIDITY everywhere else, so a
// rename touches only the profile.
func (m *Manager) rename(ctx context.Context, req *MailboxRequest) error {
	if err := mailbox.ValidateName(req.NewName); err != nil {
		return err
	}
	return m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, err := findDef(p, req)
		if err != nil {
			return err
		}
		from, to := def.Name, req.NewName
		if p.MailboxByName(to) != nil {
			return fmt.Errorf("user %s mailbox %q: %w", p.Address, to, mailbox.ErrMailboxExists)
		}
		for i := range p.Mailboxes {
			d := &p.Mailboxes[i]
			switch {
			case d.Name == from:
				d.Name = to
			case from != mailbox.Inbox && strings.HasPrefix(d.Name, from+mailbox.Separator):
				nn := to + d.Name[len(from):]
				if p.MailboxByName(nn) != nil {
					return fmt.Errorf("user %s mailbox %q: %w", p.Address, nn, mailbox.ErrMailboxExists)
				}
				d.Name = nn
			default:
				continue
			}
			// A subscription to the new name, made while it had no
			// mailbox, now belongs to the mailbox there.
			if takeSubscription(p, d.Name) {
				d.Subscribed = true
			}
		}
		if from == mailbox.Inbox {
			p.Mailboxes = append(p.Mailboxes, userdb.MailboxDef{Name: mailbox.Inbox, UIDValidity: m.nextValidity(p), Subscribed: true})
		}
		if err := m.saveMailboxes(ctx, p); err != nil {
			return err
		}
		w.changed(m, p.Address, 0)
		return nil
	})
}

// subscribe changes a subscription (IMAP SUBSCRIBE/UNSUBSCRIBE).
func (m *Manager) subscribe(ctx context.Context, req *MailboxRequest) error {
	return m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		// A subscription is to a name (RFC 9051 §6.3.7): one with no
		// mailbox is kept in the profile's Subscriptions.
		if def := p.MailboxByName(req.Name); def != nil {
			def.Subscribed = req.On
			takeSubscription(p, def.Name) // one place for a name's subscription
		} else if err := mailbox.ValidateName(req.Name); err != nil {
			return err
		} else if req.On {
			if len(p.Subscriptions) >= maxSubscriptions && !slices.Contains(p.Subscriptions, req.Name) {
				return fmt.Errorf("user %s: %w: %d subscriptions to names with no mailbox", p.Address, ErrTooManySubscriptions, maxSubscriptions)
			}
			p.Subscriptions = addName(p.Subscriptions, req.Name)
		} else if !takeSubscription(p, req.Name) {
			return nil // RFC 9051 §6.3.8: not subscribed is not an error
		}
		if err := m.saveMailboxes(ctx, p); err != nil {
			return err
		}
		w.changed(m, p.Address, 0)
		return nil
	})
}

// FlagsRequest is IMAP STORE on a set of UIDs.
type FlagsRequest struct {
	User           string         `json:"user"`
	ID             uint64         `json:"id"`
	UIDs           []uint32       `json:"uids"`
	Op             mailbox.FlagOp `json:"op"`
	Flags          []string       `json:"flags"`
	UnchangedSince uint64         `json:"unchanged_since,omitempty"`
	OnlyDeleted    bool           `json:"only_deleted,omitempty"` // for expunge
}

// FlagsReply is the result of STORE.
type FlagsReply struct {
	Updated []mailbox.Message `json:"updated"`
	Failed  []uint32          `json:"failed"`
}

// storeFlags decides flag changes, gives each a new MODSEQ and applies
// them on the fragments (CONDSTORE's UNCHANGEDSINCE checked here, RFC 7162
// §3.1.3).
func (m *Manager) storeFlags(ctx context.Context, req *FlagsRequest) (*FlagsReply, error) {
	out := &FlagsReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, b, err := m.openBox(ctx, w, p, &MailboxRequest{ID: req.ID})
		if err != nil {
			return err
		}
		if err := m.reserve(ctx, w, p, def, b, 0, len(req.UIDs)); err != nil {
			return err
		}
		var changes []*Change
		var changed []*ViewMsg
		for _, uid := range req.UIDs {
			vm := b.msgs[uid]
			if vm == nil {
				continue
			}
			if req.UnchangedSince > 0 && vm.ModSeq > req.UnchangedSince {
				out.Failed = append(out.Failed, uid)
				continue
			}
			nf := mailbox.ApplyFlags(vm.Flags, req.Op, req.Flags)
			if mailbox.SameFlags(nf, vm.Flags) {
				out.Updated = append(out.Updated, vm.Message)
				continue
			}
			b.modseq++
			nv := *vm
			nv.Flags, nv.ModSeq = nf, b.modseq
			changes = append(changes, &Change{Obj: mailbox.ObjectFrom(p.Address, def.Name, def.UIDValidity, &nv.Message), Holders: vm.Holders, FlagsOnly: true})
			changed = append(changed, &nv)
		}
		m.store.Write(ctx, changes)
		// Logged before the client hears OK (redo.go); the view shows
		// what reached a replica either way.
		firstErr := m.logChanges(ctx, p.Address, updateEntry(changes))
		for i, nv := range changed {
			if err := changes[i].Err; err != nil {
				// The view stays as it was for this message; the session
				// gets an error.
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			nv.Replicas, nv.Version = changes[i].Obj.Replicas, changes[i].Stamp
			b.msgs[nv.UID] = nv
			b.markUsed(0, nv.ModSeq)
			out.Updated = append(out.Updated, nv.Message)
		}
		if firstErr != nil {
			w.changed(m, p.Address, def.UIDValidity)
			return firstErr
		}
		if len(changed) > 0 {
			w.changed(m, p.Address, def.UIDValidity)
		}
		return nil
	})
	return out, err
}

// UIDsReply lists UIDs.
type UIDsReply struct {
	UIDs []uint32 `json:"uids"`
}

// expunge removes messages (with OnlyDeleted, only those flagged
// \Deleted at this moment: IMAP EXPUNGE).
func (m *Manager) expunge(ctx context.Context, req *FlagsRequest) (*UIDsReply, error) {
	out := &UIDsReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, b, err := m.openBox(ctx, w, p, &MailboxRequest{ID: req.ID})
		if err != nil {
			return err
		}
		var gone []*ViewMsg
		for _, uid := range req.UIDs {
			vm := b.msgs[uid]
			if vm == nil || (req.OnlyDeleted && !vm.HasFlag(`\Deleted`)) {
				continue
			}
			gone = append(gone, vm)
		}
		if len(gone) == 0 {
			return nil
		}
		if err := m.reserve(ctx, w, p, def, b, 0, 1); err != nil {
			return err
		}
		changes := make([]*Change, len(gone))
		for i, vm := range gone {
			o := mailbox.ObjectFrom(p.Address, def.Name, def.UIDValidity, &vm.Message)
			o.Deleted, o.ModSeq = true, b.modseq+1
			changes[i] = &Change{Obj: o, Holders: vm.Holders}
		}
		m.store.Write(ctx, changes)
		logErr := m.logChanges(ctx, p.Address, updateEntry(changes))
		var removed []*ViewMsg
		for i, vm := range gone {
			if err := changes[i].Err; err != nil {
				m.log.Warn("expunge not replicated", "user", p.Address, "uid", vm.UID, "err", err)
				continue
			}
			b.remove(vm, changes[i].Stamp)
			removed = append(removed, vm)
			out.UIDs = append(out.UIDs, vm.UID)
		}
		if len(emptied(removed, b.msgs)) > 0 {
			m.vacateSoon(p.Address) // a node's fragment may be empty now
		}
		b.modseq++
		b.markUsed(0, b.modseq)
		m.keepCounters(ctx, p.Address, def, b)
		w.changed(m, p.Address, def.UIDValidity)
		return logErr
	})
	return out, err
}

// CopyRequest is IMAP COPY or MOVE.
type CopyRequest struct {
	User string   `json:"user"`
	ID   uint64   `json:"id"`
	UIDs []uint32 `json:"uids"`
	Dest string   `json:"dest"`
	Move bool     `json:"move"`
}

// CopyReply pairs source and destination UIDs (RFC 4315 COPYUID).
type CopyReply struct {
	Dest    mailbox.Mailbox `json:"dest"`
	SrcUIDs []uint32        `json:"src_uids"`
	DstUIDs []uint32        `json:"dst_uids"`
}

// copy copies or moves messages between mailboxes. Each message stays
// on its node: the node copies it into its fragment of the destination
// under the UID the writer allocated.
func (m *Manager) copy(ctx context.Context, req *CopyRequest) (*CopyReply, error) {
	out := &CopyReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		src, sb, err := m.openBox(ctx, w, p, &MailboxRequest{ID: req.ID})
		if err != nil {
			return err
		}
		dst, db, err := m.openBox(ctx, w, p, &MailboxRequest{Name: req.Dest})
		if err != nil {
			return err
		}
		if req.Move && src.UIDValidity != dst.UIDValidity {
			// A replica raises the HIGHESTMODSEQ of the mailbox a
			// message leaves to the message's new MODSEQ, and nothing
			// else tells the source's fragments of the MOVE: the two
			// counters start level, so the last moved message carries
			// the source's new HIGHESTMODSEQ, and a view loaded from the
			// fragments (a new writer's) never shows it lower than this
			// one did.
			top := max(sb.modseq, db.modseq)
			sb.follow(0, top)
			db.follow(0, top)
		}
		if err := m.reserve(ctx, w, p, dst, db, len(req.UIDs), len(req.UIDs)); err != nil {
			return err
		}
		if req.Move {
			if err := m.reserve(ctx, w, p, src, sb, 0, len(req.UIDs)+1); err != nil {
				return err
			}
		}
		var changes []*Change
		var srcs []*ViewMsg
		for _, uid := range req.UIDs {
			vm := sb.msgs[uid]
			if vm == nil {
				continue
			}
			db.modseq++
			nv := *vm
			nv.UID, nv.ModSeq = db.uidNext, db.modseq
			db.uidNext++
			o := mailbox.ObjectFrom(p.Address, dst.Name, dst.UIDValidity, &nv.Message)
			c := &Change{Obj: o, Holders: vm.Holders}
			if req.Move {
				c.Was = &Place{UIDValidity: src.UIDValidity, UID: vm.UID}
			} else {
				// A copy is a new object whose bytes are the source's,
				// on the same replicas.
				o.ID, o.BodyFrom = m.store.NewMessageID(), vm.ID
			}
			changes = append(changes, c)
			srcs = append(srcs, vm)
		}
		m.store.Write(ctx, changes)
		logErr := m.logChanges(ctx, p.Address, updateEntry(changes))
		var firstErr error
		for i, vm := range srcs {
			c := changes[i]
			if c.Err != nil {
				if firstErr == nil {
					firstErr = c.Err
				}
				continue
			}
			nv := *vm
			nv.UID, nv.ModSeq, nv.ID, nv.Replicas, nv.Version = c.Obj.UID, c.Obj.ModSeq, c.Obj.ID, c.Obj.Replicas, c.Stamp
			db.msgs[nv.UID] = &nv
			db.markUsed(nv.UID, nv.ModSeq)
			if req.Move {
				sb.remove(vm, c.Stamp)
			}
			out.SrcUIDs = append(out.SrcUIDs, vm.UID)
			out.DstUIDs = append(out.DstUIDs, nv.UID)
		}
		if firstErr != nil && len(out.SrcUIDs) == 0 {
			return firstErr
		}
		if req.Move {
			sb.modseq = max(sb.modseq+1, db.modseq)
			sb.markUsed(0, sb.modseq)
			m.keepCounters(ctx, p.Address, src, sb)
		}
		out.Dest = toMailbox(dst, db)
		w.changed(m, p.Address, dst.UIDValidity)
		w.changed(m, p.Address, src.UIDValidity)
		return logErr
	})
	return out, err
}

// VersionReply is a counter that changes whenever the writer changes
// anything of the user's; sessions on other nodes poll it.
type VersionReply struct {
	Version uint64 `json:"version"`
}

// version returns the user's change counter.
func (m *Manager) version(ctx context.Context, req *MailboxRequest) (*VersionReply, error) {
	w, err := m.lockWriter(ctx, userdb.Normalize(req.User))
	if err != nil {
		return nil, err
	}
	defer w.mu.Unlock()
	return &VersionReply{Version: w.version}, nil
}

// maxSubscriptions bounds the names with no mailbox a user may subscribe
// to: the list lives in the profile, read on every login.
const maxSubscriptions = 1000

// ErrTooManySubscriptions: a SUBSCRIBE past maxSubscriptions.
var ErrTooManySubscriptions = errors.New("too many subscriptions")

func init() { rpc.Known(ErrTooManySubscriptions) }

// addName adds name to a list of subscribed names once. A DELETE past the
// limit still keeps its subscription (it is refused nowhere else).
func addName(l []string, name string) []string {
	if slices.Contains(l, name) {
		return l
	}
	return append(l, name)
}

// takeSubscription removes name from the profile's subscriptions without a
// mailbox and reports whether it was there.
func takeSubscription(p *userdb.Profile, name string) bool {
	i := slices.Index(p.Subscriptions, name)
	if i < 0 {
		return false
	}
	p.Subscriptions = slices.Delete(p.Subscriptions, i, i+1)
	return true
}
