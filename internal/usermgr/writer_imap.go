package usermgr

import (
	"context"
	"fmt"
	"strings"

	"github.com/quillmail/quill/internal/cluster"
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
}

// MailboxesReply lists mailboxes.
type MailboxesReply struct {
	Mailboxes []mailbox.Mailbox `json:"mailboxes"`
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
	w, err := m.writer(ctx, user)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p, err := m.profileOf(user)
	if err != nil {
		return err
	}
	return fn(w, p)
}

func toMailbox(def *userdb.MailboxDef, b *boxView) mailbox.Mailbox {
	return mailbox.Mailbox{ID: uint64(def.UIDValidity), Name: def.Name, UIDValidity: def.UIDValidity,
		UIDNext: max(b.used, 1), HighestModSeq: max(b.usedMod, 1), Subscribed: def.Subscribed, SpecialUse: def.SpecialUse}
}

func findDef(p *userdb.Profile, req *MailboxRequest) (*userdb.MailboxDef, error) {
	var def *userdb.MailboxDef
	if req.ID != 0 {
		def = p.MailboxByValidity(uint32(req.ID))
	} else {
		def = p.MailboxByName(req.Name)
	}
	if def == nil {
		return nil, fmt.Errorf("user %s mailbox %q: %w", p.Address, req.Name, ErrNoMailbox)
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
	if err := m.load(ctx, p.Address, p, def, b); err != nil {
		return nil, nil, err
	}
	return def, b, nil
}

// LocalMailboxes lists the user's mailboxes, sorted by name.
func (m *Manager) LocalMailboxes(ctx context.Context, req *MailboxRequest) (*MailboxesReply, error) {
	out := &MailboxesReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		for i := range p.Mailboxes {
			def := &p.Mailboxes[i]
			b := w.counters(def)
			// UIDNEXT and HIGHESTMODSEQ come from the fragments.
			if err := m.load(ctx, p.Address, p, def, b); err != nil {
				return err
			}
			out.Mailboxes = append(out.Mailboxes, toMailbox(def, b))
		}
		return nil
	})
	return out, err
}

// LocalMessages returns the visible messages of a mailbox.
func (m *Manager) LocalMessages(ctx context.Context, req *MailboxRequest) (*MessagesReply, error) {
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

// LocalCreate makes a mailbox (IMAP CREATE).
func (m *Manager) LocalCreate(ctx context.Context, req *MailboxRequest) (*mailbox.Mailbox, error) {
	if err := mailbox.ValidateName(req.Name); err != nil {
		return nil, err
	}
	var out mailbox.Mailbox
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		if p.MailboxByName(req.Name) != nil {
			return fmt.Errorf("user %s mailbox %q: %w", p.Address, req.Name, ErrMailboxExists)
		}
		name := req.Name
		if strings.EqualFold(name, mailbox.Inbox) {
			name = mailbox.Inbox
		}
		p.Mailboxes = append(p.Mailboxes, userdb.MailboxDef{Name: name, UIDValidity: m.nextValidity(p),
			Subscribed: true, SpecialUse: req.SpecialUse})
		def := &p.Mailboxes[len(p.Mailboxes)-1]
		if err := m.saveProfile(ctx, p, ProfileReplicas); err != nil {
			return err
		}
		out = toMailbox(def, w.counters(def))
		w.changed(m, p.Address, 0)
		return nil
	})
	return &out, err
}

// LocalDelete removes a mailbox and its fragments (IMAP DELETE).
func (m *Manager) LocalDelete(ctx context.Context, req *MailboxRequest) (*struct{}, error) {
	if strings.EqualFold(req.Name, mailbox.Inbox) {
		return nil, fmt.Errorf("user %s: INBOX cannot be deleted", req.User)
	}
	return &struct{}{}, m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, err := findDef(p, req)
		if err != nil {
			return err
		}
		v := def.UIDValidity
		kept := p.Mailboxes[:0]
		for _, d := range p.Mailboxes {
			if d.UIDValidity != v {
				kept = append(kept, d)
			}
		}
		p.Mailboxes = kept
		if err := m.saveProfile(ctx, p, ProfileReplicas); err != nil {
			return err
		}
		delete(w.boxes, v)
		_, mailMap, _ := m.lookupLocked(p.Address)
		for _, n := range mailMap {
			req := &mailbox.FragmentRequest{User: p.Address, UIDValidity: v}
			if err := m.onNode(ctx, n, "fragment.Drop", req, func() error { return m.boxes.DropMailbox(p.Address, v) }); err != nil {
				// The node's fragment stays until it stores into a mailbox of
				// that name again, which replaces it; it is never shown.
				m.log.Warn("could not drop a deleted mailbox's fragment", "user", p.Address, "node", n, "err", err)
			}
		}
		w.changed(m, p.Address, v)
		return nil
	})
}

// LocalRename renames a mailbox and those below it (IMAP RENAME, RFC 3501
// §6.3.5); renaming INBOX moves its messages to the new name and makes a new,
// empty INBOX. Mailboxes are named by UIDVALIDITY everywhere else, so a
// rename touches only the profile.
func (m *Manager) LocalRename(ctx context.Context, req *MailboxRequest) (*struct{}, error) {
	if err := mailbox.ValidateName(req.NewName); err != nil {
		return nil, err
	}
	return &struct{}{}, m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, err := findDef(p, req)
		if err != nil {
			return err
		}
		from, to := def.Name, req.NewName
		if p.MailboxByName(to) != nil {
			return fmt.Errorf("user %s mailbox %q: %w", p.Address, to, ErrMailboxExists)
		}
		for i := range p.Mailboxes {
			d := &p.Mailboxes[i]
			switch {
			case d.Name == from:
				d.Name = to
			case from != mailbox.Inbox && strings.HasPrefix(d.Name, from+mailbox.Separator):
				nn := to + d.Name[len(from):]
				if p.MailboxByName(nn) != nil {
					return fmt.Errorf("user %s mailbox %q: %w", p.Address, nn, ErrMailboxExists)
				}
				d.Name = nn
			}
		}
		if from == mailbox.Inbox {
			p.Mailboxes = append(p.Mailboxes, userdb.MailboxDef{Name: mailbox.Inbox, UIDValidity: m.nextValidity(p), Subscribed: true})
		}
		if err := m.saveProfile(ctx, p, ProfileReplicas); err != nil {
			return err
		}
		w.changed(m, p.Address, 0)
		return nil
	})
}

// LocalSubscribe changes a subscription (IMAP SUBSCRIBE/UNSUBSCRIBE).
func (m *Manager) LocalSubscribe(ctx context.Context, req *MailboxRequest) (*struct{}, error) {
	return &struct{}{}, m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, err := findDef(p, req)
		if err != nil {
			return err
		}
		def.Subscribed = req.On
		if err := m.saveProfile(ctx, p, ProfileReplicas); err != nil {
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

// LocalStoreFlags decides flag changes, gives each a new MODSEQ and applies
// them on the fragments (CONDSTORE's UNCHANGEDSINCE checked here, RFC 7162
// §3.1.3).
func (m *Manager) LocalStoreFlags(ctx context.Context, req *FlagsRequest) (*FlagsReply, error) {
	out := &FlagsReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, b, err := m.openBox(ctx, w, p, &MailboxRequest{ID: req.ID})
		if err != nil {
			return err
		}
		if err := m.reserve(ctx, p, def, b, 0, len(req.UIDs)); err != nil {
			return err
		}
		byNode := map[cluster.NodeID][]mailbox.FlagChange{}
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
			byNode[vm.Node] = append(byNode[vm.Node], mailbox.FlagChange{UID: uid, Flags: nf, ModSeq: b.modseq})
			changed = append(changed, &nv)
		}
		for n, chs := range byNode {
			req := &mailbox.SetFlagsRequest{User: p.Address, UIDValidity: def.UIDValidity, Changes: chs}
			if err := m.onNode(ctx, n, "fragment.SetFlags", req, func() error {
				return m.boxes.SetFlagsAt(p.Address, def.UIDValidity, chs)
			}); err != nil {
				// The writer's view stays as it was for that node's
				// messages; the session gets an error.
				return fmt.Errorf("user %s: flags on %s: %w", p.Address, n, err)
			}
		}
		for _, nv := range changed {
			b.msgs[nv.UID] = nv
			b.markUsed(0, nv.ModSeq)
			out.Updated = append(out.Updated, nv.Message)
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

// LocalExpunge removes messages (with OnlyDeleted, only those flagged
// \Deleted at this moment: IMAP EXPUNGE).
func (m *Manager) LocalExpunge(ctx context.Context, req *FlagsRequest) (*UIDsReply, error) {
	out := &UIDsReply{}
	err := m.withWriter(ctx, req.User, func(w *userWriter, p *userdb.Profile) error {
		def, b, err := m.openBox(ctx, w, p, &MailboxRequest{ID: req.ID})
		if err != nil {
			return err
		}
		byNode := map[cluster.NodeID][]uint32{}
		for _, uid := range req.UIDs {
			vm := b.msgs[uid]
			if vm == nil || (req.OnlyDeleted && !vm.HasFlag(`\Deleted`)) {
				continue
			}
			byNode[vm.Node] = append(byNode[vm.Node], uid)
		}
		if len(byNode) == 0 {
			return nil
		}
		if err := m.reserve(ctx, p, def, b, 0, 1); err != nil {
			return err
		}
		for n, uids := range byNode {
			r := &mailbox.UIDsRequest{User: p.Address, UIDValidity: def.UIDValidity, UIDs: uids}
			if err := m.onNode(ctx, n, "fragment.Expunge", r, func() error {
				_, err := m.boxes.ExpungeAt(p.Address, def.UIDValidity, uids)
				return err
			}); err != nil {
				m.log.Warn("expunge on a fragment failed", "user", p.Address, "node", n, "err", err)
				continue
			}
			for _, uid := range uids {
				delete(b.msgs, uid)
				out.UIDs = append(out.UIDs, uid)
			}
		}
		b.modseq++
		b.markUsed(0, b.modseq)
		w.changed(m, p.Address, def.UIDValidity)
		return nil
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

// LocalCopy copies or moves messages between mailboxes. Each message stays
// on its node: the node copies it into its fragment of the destination
// under the UID the writer allocated.
func (m *Manager) LocalCopy(ctx context.Context, req *CopyRequest) (*CopyReply, error) {
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
		if err := m.reserve(ctx, p, dst, db, len(req.UIDs), len(req.UIDs)); err != nil {
			return err
		}
		if req.Move {
			if err := m.reserve(ctx, p, src, sb, 0, 1); err != nil {
				return err
			}
		}
		type batch struct {
			uids []uint32
			dest []mailbox.Placed
			msgs []*ViewMsg
		}
		byNode := map[cluster.NodeID]*batch{}
		var order []cluster.NodeID
		for _, uid := range req.UIDs {
			vm := sb.msgs[uid]
			if vm == nil {
				continue
			}
			db.modseq++
			pl := mailbox.Placed{User: p.Address, Mailbox: dst.Name, UIDValidity: dst.UIDValidity, UID: db.uidNext, ModSeq: db.modseq}
			if !req.Move {
				pl.ID = m.boxes.NewMessageID()
			}
			db.uidNext++
			bt := byNode[vm.Node]
			if bt == nil {
				bt = &batch{}
				byNode[vm.Node] = bt
				order = append(order, vm.Node)
			}
			bt.uids, bt.dest, bt.msgs = append(bt.uids, uid), append(bt.dest, pl), append(bt.msgs, vm)
		}
		for _, n := range order {
			bt := byNode[n]
			r := &mailbox.CopyAtRequest{User: p.Address, UIDValidity: src.UIDValidity, UIDs: bt.uids, Dest: bt.dest, Move: req.Move}
			if err := m.onNode(ctx, n, "fragment.Copy", r, func() error {
				return m.boxes.CopyAt(p.Address, src.UIDValidity, bt.uids, bt.dest, req.Move)
			}); err != nil {
				return fmt.Errorf("user %s: copy on %s: %w", p.Address, n, err)
			}
			for i, vm := range bt.msgs {
				nv := *vm
				nv.UID, nv.ModSeq = bt.dest[i].UID, bt.dest[i].ModSeq
				if bt.dest[i].ID != "" {
					nv.ID = bt.dest[i].ID
				}
				db.msgs[nv.UID] = &nv
				db.markUsed(nv.UID, nv.ModSeq)
				if req.Move {
					delete(sb.msgs, vm.UID)
				}
				out.SrcUIDs = append(out.SrcUIDs, vm.UID)
				out.DstUIDs = append(out.DstUIDs, nv.UID)
			}
		}
		if req.Move {
			sb.modseq++
			sb.markUsed(0, sb.modseq)
		}
		out.Dest = toMailbox(dst, db)
		w.changed(m, p.Address, dst.UIDValidity)
		w.changed(m, p.Address, src.UIDValidity)
		return nil
	})
	return out, err
}

// VersionReply is a counter that changes whenever the writer changes
// anything of the user's; sessions on other nodes poll it.
type VersionReply struct {
	Version uint64 `json:"version"`
}

// LocalVersion returns the user's change counter.
func (m *Manager) LocalVersion(ctx context.Context, req *MailboxRequest) (*VersionReply, error) {
	w, err := m.writer(ctx, userdb.Normalize(req.User))
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return &VersionReply{Version: w.version}, nil
}

func (m *Manager) registerWriter(s *rpc.Server) {
	s.Handle("writer.Alloc", rpc.Method(m.LocalAlloc))
	s.Handle("writer.Confirm", rpc.Method(m.LocalConfirm))
	s.Handle("writer.Apply", rpc.Method(m.LocalApply))
	s.Handle("writer.Mailboxes", rpc.Method(m.LocalMailboxes))
	s.Handle("writer.Messages", rpc.Method(m.LocalMessages))
	s.Handle("writer.Create", rpc.Method(m.LocalCreate))
	s.Handle("writer.Delete", rpc.Method(m.LocalDelete))
	s.Handle("writer.Rename", rpc.Method(m.LocalRename))
	s.Handle("writer.Subscribe", rpc.Method(m.LocalSubscribe))
	s.Handle("writer.StoreFlags", rpc.Method(m.LocalStoreFlags))
	s.Handle("writer.Expunge", rpc.Method(m.LocalExpunge))
	s.Handle("writer.Copy", rpc.Method(m.LocalCopy))
	s.Handle("writer.Version", rpc.Method(m.LocalVersion))
}

// --- any node's side

// Writer calls method on the user's writer (this node or the manager).
func Writer[Req, Resp any](ctx context.Context, m *Manager, user, method string, req *Req,
	local func(context.Context, *Req) (*Resp, error)) (*Resp, error) {
	return callManager(ctx, m, userdb.Normalize(user), method, req, local)
}
