package writer

// The writer's service on the wire (proto/quill/v1/writer.proto). Callers
// reach a user's writer through For(user), which calls this node's writer
// directly when it manages the user's bucket and the manager's by RPC
// otherwise, retrying while the nodes' user maps briefly disagree; no
// caller names a method as a string, and the compiler checks both ends.

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
	"google.golang.org/grpc"
)

// Service is a user's writer as any node reaches it.
type Service interface {
	// Alloc hands out the next UID and MODSEQ of a mailbox, with what the
	// delivering proxy needs to place the message.
	Alloc(ctx context.Context, req *AllocRequest) (*AllocReply, error)
	// Confirm records a stored message (or a cancelled allocation).
	Confirm(ctx context.Context, req *ConfirmRequest) error
	// Apply changes the user's profile (add, passwd, replication, delete).
	Apply(ctx context.Context, req *ApplyRequest) (*userdb.Profile, error)
	Mailboxes(ctx context.Context, req *MailboxRequest) (*MailboxesReply, error)
	Messages(ctx context.Context, req *MailboxRequest) (*MessagesReply, error)
	Create(ctx context.Context, req *MailboxRequest) (*mailbox.Mailbox, error)
	Delete(ctx context.Context, req *MailboxRequest) error
	Rename(ctx context.Context, req *MailboxRequest) error
	Subscribe(ctx context.Context, req *MailboxRequest) error
	StoreFlags(ctx context.Context, req *FlagsRequest) (*FlagsReply, error)
	Expunge(ctx context.Context, req *FlagsRequest) (*UIDsReply, error)
	Copy(ctx context.Context, req *CopyRequest) (*CopyReply, error)
	Version(ctx context.Context, req *MailboxRequest) (*VersionReply, error)
	// Rehome gives messages new replica sets (repair).
	Rehome(ctx context.Context, req *RehomeRequest) error
	// Reload loads the user's views again from the fragments.
	Reload(ctx context.Context, req *ReloadRequest) error
}

// Local is this node's writers behind the Service interface (they answer
// for the users of the buckets this node manages, ErrNotManager for others).
func (m *Manager) Local() Service { return local{m} }

// For returns the writer of user wherever it runs.
func (m *Manager) For(user string) Service { return routed{m, userdb.Normalize(user)} }

// on returns node n's writers: this node's directly, another's by RPC.
func (m *Manager) on(n cluster.NodeID) Service {
	if n == m.self {
		return local{m}
	}
	return remote{m.peers, n}
}

type local struct{ m *Manager }

func (l local) Alloc(ctx context.Context, r *AllocRequest) (*AllocReply, error) {
	return l.m.alloc(ctx, r)
}
func (l local) Confirm(ctx context.Context, r *ConfirmRequest) error { return l.m.confirm(ctx, r) }
func (l local) Apply(ctx context.Context, r *ApplyRequest) (*userdb.Profile, error) {
	return l.m.apply(ctx, r)
}
func (l local) Mailboxes(ctx context.Context, r *MailboxRequest) (*MailboxesReply, error) {
	return l.m.mailboxes(ctx, r)
}
func (l local) Messages(ctx context.Context, r *MailboxRequest) (*MessagesReply, error) {
	return l.m.messages(ctx, r)
}
func (l local) Create(ctx context.Context, r *MailboxRequest) (*mailbox.Mailbox, error) {
	return l.m.create(ctx, r)
}
func (l local) Delete(ctx context.Context, r *MailboxRequest) error    { return l.m.delete(ctx, r) }
func (l local) Rename(ctx context.Context, r *MailboxRequest) error    { return l.m.rename(ctx, r) }
func (l local) Subscribe(ctx context.Context, r *MailboxRequest) error { return l.m.subscribe(ctx, r) }
func (l local) StoreFlags(ctx context.Context, r *FlagsRequest) (*FlagsReply, error) {
	return l.m.storeFlags(ctx, r)
}
func (l local) Expunge(ctx context.Context, r *FlagsRequest) (*UIDsReply, error) {
	return l.m.expunge(ctx, r)
}
func (l local) Copy(ctx context.Context, r *CopyRequest) (*CopyReply, error) { return l.m.copy(ctx, r) }
func (l local) Version(ctx context.Context, r *MailboxRequest) (*VersionReply, error) {
	return l.m.version(ctx, r)
}
func (l local) Rehome(ctx context.Context, r *RehomeRequest) error { return l.m.rehome(ctx, r) }
func (l local) Reload(ctx context.Context, r *ReloadRequest) error { return l.m.reload(ctx, r) }

// routed calls the user's writer on the manager of the user's bucket. A
// call lost with its node (declared dead while the call ran) is sent again
// to the next manager when that is safe (cluster.Idempotent): Alloc (an
// allocation never confirmed expires, and the next writer starts past
// every reservation), Confirm, the reads, Subscribe, STORE without
// UNCHANGEDSINCE, Expunge (UIDs gone already are passed over; a session
// learns of them at its next look at the mailbox) and Reload. Apply,
// Create, Delete, Rename, Copy and Rehome are not (cluster.Once): their
// callers get a temporary failure.
type routed struct {
	m    *Manager
	user string
}

// onManager runs call on the user's writer; repeat says whether it may be
// sent again to the next manager when the node it went to is declared dead
// while it runs (cluster.Repeat).
func onManager[T any](ctx context.Context, r routed, repeat cluster.Repeat, call func(context.Context, Service) (T, error)) (T, error) {
	return cluster.OnManager(ctx, r.m.peers.UserMap, r.m.self, r.user, Service(local{r.m}), r.m.on, repeat, call)
}

func onManager0(ctx context.Context, r routed, repeat cluster.Repeat, call func(context.Context, Service) error) error {
	_, err := onManager(ctx, r, repeat, func(ctx context.Context, s Service) (struct{}, error) { return struct{}{}, call(ctx, s) })
	return err
}

func (r routed) Alloc(ctx context.Context, req *AllocRequest) (*AllocReply, error) {
	return onManager(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) (*AllocReply, error) { return s.Alloc(ctx, req) })
}
func (r routed) Confirm(ctx context.Context, req *ConfirmRequest) error {
	return onManager0(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) error { return s.Confirm(ctx, req) })
}
func (r routed) Apply(ctx context.Context, req *ApplyRequest) (*userdb.Profile, error) {
	return onManager(ctx, r, cluster.Once, func(ctx context.Context, s Service) (*userdb.Profile, error) { return s.Apply(ctx, req) })
}
func (r routed) Mailboxes(ctx context.Context, req *MailboxRequest) (*MailboxesReply, error) {
	return onManager(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) (*MailboxesReply, error) { return s.Mailboxes(ctx, req) })
}
func (r routed) Messages(ctx context.Context, req *MailboxRequest) (*MessagesReply, error) {
	return onManager(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) (*MessagesReply, error) { return s.Messages(ctx, req) })
}
func (r routed) Create(ctx context.Context, req *MailboxRequest) (*mailbox.Mailbox, error) {
	return onManager(ctx, r, cluster.Once, func(ctx context.Context, s Service) (*mailbox.Mailbox, error) { return s.Create(ctx, req) })
}
func (r routed) Delete(ctx context.Context, req *MailboxRequest) error {
	return onManager0(ctx, r, cluster.Once, func(ctx context.Context, s Service) error { return s.Delete(ctx, req) })
}
func (r routed) Rename(ctx context.Context, req *MailboxRequest) error {
	return onManager0(ctx, r, cluster.Once, func(ctx context.Context, s Service) error { return s.Rename(ctx, req) })
}
func (r routed) Subscribe(ctx context.Context, req *MailboxRequest) error {
	return onManager0(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) error { return s.Subscribe(ctx, req) })
}
func (r routed) StoreFlags(ctx context.Context, req *FlagsRequest) (*FlagsReply, error) {
	return onManager(ctx, r, req.repeat(), func(ctx context.Context, s Service) (*FlagsReply, error) { return s.StoreFlags(ctx, req) })
}
func (r routed) Expunge(ctx context.Context, req *FlagsRequest) (*UIDsReply, error) {
	return onManager(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) (*UIDsReply, error) { return s.Expunge(ctx, req) })
}
func (r routed) Copy(ctx context.Context, req *CopyRequest) (*CopyReply, error) {
	return onManager(ctx, r, cluster.Once, func(ctx context.Context, s Service) (*CopyReply, error) { return s.Copy(ctx, req) })
}
func (r routed) Version(ctx context.Context, req *MailboxRequest) (*VersionReply, error) {
	return onManager(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) (*VersionReply, error) { return s.Version(ctx, req) })
}
func (r routed) Rehome(ctx context.Context, req *RehomeRequest) error {
	return onManager0(ctx, r, cluster.Once, func(ctx context.Context, s Service) error { return s.Rehome(ctx, req) })
}
func (r routed) Reload(ctx context.Context, req *ReloadRequest) error {
	return onManager0(ctx, r, cluster.Idempotent, func(ctx context.Context, s Service) error { return s.Reload(ctx, req) })
}

// repeat says whether a STORE may be sent again to the next manager after
// its node died under it: flags added, removed or replaced leave the same
// flags when applied twice, but with UNCHANGEDSINCE the first application
// would fail the second's MODSEQ test (RFC 7162 §3.1.3).
func (r *FlagsRequest) repeat() cluster.Repeat { return cluster.Repeat(r.UnchangedSince == 0) }

// remote is another node's writers, by RPC.
type remote struct {
	conns cluster.Conns
	node  cluster.NodeID
}

func (r remote) client() (nodepb.WriterClient, error) {
	cc, err := r.conns.Conn(r.node)
	if err != nil {
		return nil, err
	}
	return nodepb.NewWriterClient(cc), nil
}

// call runs one call on the remote writer and converts its reply.
func call[P, T any](ctx context.Context, r remote, do func(nodepb.WriterClient) (P, error), conv func(P) T) (T, error) {
	var zero T
	c, err := r.client()
	if err != nil {
		return zero, err
	}
	p, err := do(c)
	if err != nil {
		return zero, err
	}
	return conv(p), nil
}

func empty(*nodepb.Empty) struct{} { return struct{}{} }

func (r remote) Alloc(ctx context.Context, req *AllocRequest) (*AllocReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.AllocReply, error) { return c.Alloc(ctx, req.toPB()) }, allocReplyFromPB)
}
func (r remote) Confirm(ctx context.Context, req *ConfirmRequest) error {
	_, err := call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Empty, error) { return c.Confirm(ctx, req.toPB()) }, empty)
	return err
}
func (r remote) Apply(ctx context.Context, req *ApplyRequest) (*userdb.Profile, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Profile, error) { return c.Apply(ctx, req.toPB()) }, userdb.ProfileFromPB)
}
func (r remote) Mailboxes(ctx context.Context, req *MailboxRequest) (*MailboxesReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.MailboxesReply, error) { return c.Mailboxes(ctx, req.toPB()) }, mailboxesReplyFromPB)
}
func (r remote) Messages(ctx context.Context, req *MailboxRequest) (*MessagesReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.MessagesReply, error) { return c.Messages(ctx, req.toPB()) }, messagesReplyFromPB)
}
func (r remote) Create(ctx context.Context, req *MailboxRequest) (*mailbox.Mailbox, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Mailbox, error) { return c.Create(ctx, req.toPB()) },
		func(p *nodepb.Mailbox) *mailbox.Mailbox { mb := mailbox.MailboxFromPB(p); return &mb })
}
func (r remote) Delete(ctx context.Context, req *MailboxRequest) error {
	_, err := call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Empty, error) { return c.Delete(ctx, req.toPB()) }, empty)
	return err
}
func (r remote) Rename(ctx context.Context, req *MailboxRequest) error {
	_, err := call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Empty, error) { return c.Rename(ctx, req.toPB()) }, empty)
	return err
}
func (r remote) Subscribe(ctx context.Context, req *MailboxRequest) error {
	_, err := call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Empty, error) { return c.Subscribe(ctx, req.toPB()) }, empty)
	return err
}
func (r remote) StoreFlags(ctx context.Context, req *FlagsRequest) (*FlagsReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.FlagsReply, error) { return c.StoreFlags(ctx, req.toPB()) }, flagsReplyFromPB)
}
func (r remote) Expunge(ctx context.Context, req *FlagsRequest) (*UIDsReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.UIDsReply, error) { return c.Expunge(ctx, req.toPB()) },
		func(p *nodepb.UIDsReply) *UIDsReply { return &UIDsReply{UIDs: p.Uids} })
}
func (r remote) Copy(ctx context.Context, req *CopyRequest) (*CopyReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.CopyReply, error) { return c.Copy(ctx, req.toPB()) },
		func(p *nodepb.CopyReply) *CopyReply {
			return &CopyReply{Dest: mailbox.MailboxFromPB(p.Dest), SrcUIDs: p.SrcUids, DstUIDs: p.DstUids}
		})
}
func (r remote) Version(ctx context.Context, req *MailboxRequest) (*VersionReply, error) {
	return call(ctx, r, func(c nodepb.WriterClient) (*nodepb.VersionReply, error) { return c.Version(ctx, req.toPB()) },
		func(p *nodepb.VersionReply) *VersionReply { return &VersionReply{Version: p.Version} })
}
func (r remote) Rehome(ctx context.Context, req *RehomeRequest) error {
	_, err := call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Empty, error) { return c.Rehome(ctx, req.toPB()) }, empty)
	return err
}
func (r remote) Reload(ctx context.Context, req *ReloadRequest) error {
	_, err := call(ctx, r, func(c nodepb.WriterClient) (*nodepb.Empty, error) {
		return c.Reload(ctx, &nodepb.ReloadRequest{User: req.User})
	}, empty)
	return err
}

// Register exposes this node's writers to other nodes.
func (m *Manager) Register(s grpc.ServiceRegistrar) {
	nodepb.RegisterWriterServer(s, server{l: local{m}})
	nodepb.RegisterRedoServer(s, redoServer{m: m})
}

type server struct {
	nodepb.UnimplementedWriterServer
	l local
}

func (s server) Alloc(ctx context.Context, p *nodepb.AllocRequest) (*nodepb.AllocReply, error) {
	rep, err := s.l.Alloc(ctx, &AllocRequest{User: p.User, Mailbox: p.Mailbox, From: cluster.MemberFromPB(p.From)})
	if err != nil {
		return nil, err
	}
	return &nodepb.AllocReply{Place: mailbox.PlacedToPB(&rep.Place), MailMap: cluster.IDsToPB(rep.MailMap),
		Spread: int32(rep.Spread), Replicas: int32(rep.Replicas), Policy: string(rep.Policy)}, nil
}
func (s server) Confirm(ctx context.Context, p *nodepb.ConfirmRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Confirm(ctx, &ConfirmRequest{Place: mailbox.PlacedFromPB(p.Place),
		Message: mailbox.MessageFromPB(p.Message), Nodes: cluster.IDsFromPB(p.Nodes), Cancel: p.Cancel, Unused: p.Unused})
}
func (s server) Apply(ctx context.Context, p *nodepb.ApplyRequest) (*nodepb.Profile, error) {
	prof, err := s.l.Apply(ctx, &ApplyRequest{Op: p.Op, Address: p.Address, Hash: p.Hash, SCRAM: p.ScramSha256, Replicas: int(p.Replicas), Policy: p.Policy,
		QuotaStorage: p.QuotaStorage, QuotaMessages: p.QuotaMessages, Admin: p.Admin, Spread: int(p.Spread)})
	if err != nil {
		return nil, err
	}
	return prof.ToPB(), nil
}
func (s server) Mailboxes(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.MailboxesReply, error) {
	rep, err := s.l.Mailboxes(ctx, mailboxRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	out := &nodepb.MailboxesReply{Subscriptions: rep.Subscriptions, StorageUsed: rep.Usage.Storage, MessagesUsed: rep.Usage.Messages,
		QuotaStorage: rep.Usage.QuotaStorage, QuotaMessages: rep.Usage.QuotaMessages}
	for i := range rep.Mailboxes {
		out.Mailboxes = append(out.Mailboxes, mailbox.MailboxToPB(&rep.Mailboxes[i]))
	}
	return out, nil
}
func (s server) Messages(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.MessagesReply, error) {
	rep, err := s.l.Messages(ctx, mailboxRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	out := &nodepb.MessagesReply{Mailbox: mailbox.MailboxToPB(&rep.Mailbox)}
	for i := range rep.Messages {
		vm := &rep.Messages[i]
		out.Messages = append(out.Messages, &nodepb.ViewMessage{Message: mailbox.MessageToPB(&vm.Message), Holders: cluster.IDsToPB(vm.Holders)})
	}
	return out, nil
}
func (s server) Create(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.Mailbox, error) {
	mb, err := s.l.Create(ctx, mailboxRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	return mailbox.MailboxToPB(mb), nil
}
func (s server) Delete(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Delete(ctx, mailboxRequestFromPB(p))
}
func (s server) Rename(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Rename(ctx, mailboxRequestFromPB(p))
}
func (s server) Subscribe(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Subscribe(ctx, mailboxRequestFromPB(p))
}
func (s server) StoreFlags(ctx context.Context, p *nodepb.FlagsRequest) (*nodepb.FlagsReply, error) {
	rep, err := s.l.StoreFlags(ctx, flagsRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	out := &nodepb.FlagsReply{Failed: rep.Failed}
	for i := range rep.Updated {
		out.Updated = append(out.Updated, mailbox.MessageToPB(&rep.Updated[i]))
	}
	return out, nil
}
func (s server) Expunge(ctx context.Context, p *nodepb.FlagsRequest) (*nodepb.UIDsReply, error) {
	rep, err := s.l.Expunge(ctx, flagsRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	return &nodepb.UIDsReply{Uids: rep.UIDs}, nil
}
func (s server) Copy(ctx context.Context, p *nodepb.CopyRequest) (*nodepb.CopyReply, error) {
	rep, err := s.l.Copy(ctx, &CopyRequest{User: p.User, ID: p.Id, UIDs: p.Uids, Dest: p.Dest, Move: p.Move})
	if err != nil {
		return nil, err
	}
	return &nodepb.CopyReply{Dest: mailbox.MailboxToPB(&rep.Dest), SrcUids: rep.SrcUIDs, DstUids: rep.DstUIDs}, nil
}
func (s server) Version(ctx context.Context, p *nodepb.MailboxRequest) (*nodepb.VersionReply, error) {
	rep, err := s.l.Version(ctx, mailboxRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	return &nodepb.VersionReply{Version: rep.Version}, nil
}
func (s server) Rehome(ctx context.Context, p *nodepb.RehomeRequest) (*nodepb.Empty, error) {
	req := &RehomeRequest{User: p.User}
	for _, mv := range p.Moves {
		req.Moves = append(req.Moves, replica.MoveFromPB(mv))
	}
	return &nodepb.Empty{}, s.l.Rehome(ctx, req)
}
func (s server) Reload(ctx context.Context, p *nodepb.ReloadRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Reload(ctx, &ReloadRequest{User: p.User})
}

func (r *AllocRequest) toPB() *nodepb.AllocRequest {
	return &nodepb.AllocRequest{User: r.User, Mailbox: r.Mailbox, From: r.From.ToPB()}
}

func allocReplyFromPB(p *nodepb.AllocReply) *AllocReply {
	pol, _ := replica.ParsePolicy(p.Policy)
	return &AllocReply{Place: mailbox.PlacedFromPB(p.Place), MailMap: cluster.IDsFromPB(p.MailMap),
		Spread: int(p.Spread), Replicas: int(p.Replicas), Policy: pol}
}

func (r *ConfirmRequest) toPB() *nodepb.ConfirmRequest {
	return &nodepb.ConfirmRequest{Place: mailbox.PlacedToPB(&r.Place), Message: mailbox.MessageToPB(&r.Message),
		Nodes: cluster.IDsToPB(r.Nodes), Cancel: r.Cancel, Unused: r.Unused}
}

func (r *ApplyRequest) toPB() *nodepb.ApplyRequest {
	return &nodepb.ApplyRequest{Op: r.Op, Address: r.Address, Hash: r.Hash, ScramSha256: r.SCRAM, Replicas: int32(r.Replicas), Policy: r.Policy,
		QuotaStorage: r.QuotaStorage, QuotaMessages: r.QuotaMessages, Admin: r.Admin, Spread: int32(r.Spread)}
}

func (r *MailboxRequest) toPB() *nodepb.MailboxRequest {
	return &nodepb.MailboxRequest{User: r.User, Name: r.Name, Id: r.ID, NewName: r.NewName, SpecialUse: r.SpecialUse, On: r.On, Usage: r.Usage, UsageAll: r.UsageAll}
}

func mailboxRequestFromPB(p *nodepb.MailboxRequest) *MailboxRequest {
	return &MailboxRequest{User: p.User, Name: p.Name, ID: p.Id, NewName: p.NewName, SpecialUse: p.SpecialUse, On: p.On, Usage: p.Usage, UsageAll: p.UsageAll}
}

func mailboxesReplyFromPB(p *nodepb.MailboxesReply) *MailboxesReply {
	out := &MailboxesReply{Subscriptions: p.Subscriptions, Usage: mailbox.Usage{Storage: p.StorageUsed, Messages: p.MessagesUsed,
		QuotaStorage: p.QuotaStorage, QuotaMessages: p.QuotaMessages}}
	for _, mb := range p.Mailboxes {
		out.Mailboxes = append(out.Mailboxes, mailbox.MailboxFromPB(mb))
	}
	return out
}

func messagesReplyFromPB(p *nodepb.MessagesReply) *MessagesReply {
	out := &MessagesReply{Mailbox: mailbox.MailboxFromPB(p.Mailbox), Messages: make([]ViewMsg, 0, len(p.Messages))}
	for _, vm := range p.Messages {
		out.Messages = append(out.Messages, ViewMsg{Message: mailbox.MessageFromPB(vm.Message), Holders: cluster.IDsFromPB(vm.Holders)})
	}
	return out
}

func (r *FlagsRequest) toPB() *nodepb.FlagsRequest {
	return &nodepb.FlagsRequest{User: r.User, Id: r.ID, Uids: r.UIDs, Op: int32(r.Op), Flags: r.Flags,
		UnchangedSince: r.UnchangedSince, OnlyDeleted: r.OnlyDeleted}
}

func flagsRequestFromPB(p *nodepb.FlagsRequest) *FlagsRequest {
	return &FlagsRequest{User: p.User, ID: p.Id, UIDs: p.Uids, Op: mailbox.FlagOp(p.Op), Flags: p.Flags,
		UnchangedSince: p.UnchangedSince, OnlyDeleted: p.OnlyDeleted}
}

func flagsReplyFromPB(p *nodepb.FlagsReply) *FlagsReply {
	out := &FlagsReply{Failed: p.Failed}
	for _, mp := range p.Updated {
		out.Updated = append(out.Updated, mailbox.MessageFromPB(mp))
	}
	return out
}

func (r *CopyRequest) toPB() *nodepb.CopyRequest {
	return &nodepb.CopyRequest{User: r.User, Id: r.ID, Uids: r.UIDs, Dest: r.Dest, Move: r.Move}
}

func (r *RehomeRequest) toPB() *nodepb.RehomeRequest {
	out := &nodepb.RehomeRequest{User: r.User}
	for _, mv := range r.Moves {
		out.Moves = append(out.Moves, replica.MoveToPB(mv))
	}
	return out
}

// BoxesToPB converts a writer's mailbox states for a handoff.
func BoxesToPB(bs []BoxState) []*nodepb.BoxState {
	out := make([]*nodepb.BoxState, 0, len(bs))
	for _, b := range bs {
		pb := &nodepb.BoxState{UidValidity: b.UIDValidity, UidNext: b.UIDNext, ModSeq: b.ModSeq,
			ReservedUid: b.ReservedUID, ReservedModSeq: b.ReservedModSeq}
		for _, a := range b.Inflight {
			pb.Inflight = append(pb.Inflight, &nodepb.Allocation{Uid: a.UID, Age: int64(a.Age), From: a.From.ToPB()})
		}
		out = append(out, pb)
	}
	return out
}

// BoxesFromPB converts a writer's mailbox states from a handoff.
func BoxesFromPB(ps []*nodepb.BoxState) []BoxState {
	out := make([]BoxState, 0, len(ps))
	for _, p := range ps {
		b := BoxState{UIDValidity: p.UidValidity, UIDNext: p.UidNext, ModSeq: p.ModSeq,
			ReservedUID: p.ReservedUid, ReservedModSeq: p.ReservedModSeq}
		for _, a := range p.Inflight {
			b.Inflight = append(b.Inflight, Allocation{UID: a.Uid, Age: time.Duration(a.Age), From: cluster.MemberFromPB(a.From)})
		}
		out = append(out, b)
	}
	return out
}
