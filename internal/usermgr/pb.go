package usermgr

// The user manager's service on the wire (proto/quill/v1/usermgr.proto):
// scans for soft-state reconstruction, questions about a user to its
// bucket's manager, and bucket handoffs.

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
	"google.golang.org/grpc"
)

// Service is a node's user manager as other nodes reach it.
type Service interface {
	// Scan is the bucket-scoped scan of the node's hard state.
	Scan(ctx context.Context, req *ScanRequest) (*ScanReply, error)
	// Lookup answers for a user of a bucket the node manages.
	Lookup(ctx context.Context, req *LookupRequest) (*LookupReply, error)
	// Note records that a node holds a user's mail.
	Note(ctx context.Context, req *NoteRequest) error
	// Update merges a newer profile into the soft state.
	Update(ctx context.Context, req *UpdateRequest) error
	// List returns the live profiles of the buckets the node manages.
	List(ctx context.Context) (*ListReply, error)
	// Handoff takes over buckets from their previous manager.
	Handoff(ctx context.Context, req *HandoffRequest) (*HandoffReply, error)
	// DomainUsage is the node's part of what a domain's users take.
	DomainUsage(ctx context.Context, dom string) (DomainUsage, error)
}

// on returns node n's user manager: this one directly, another's by RPC.
func (m *Manager) on(n cluster.NodeID) Service {
	if n == m.self {
		return local{m}
	}
	return remote{m.peers, n}
}

// onManager runs call against the user manager of user's bucket. Every
// call it routes (Lookup, Note, Update) is Idempotent: a read, or a merge
// that leaves the same soft state when made twice.
func onManager[T any](ctx context.Context, m *Manager, user string, call func(context.Context, Service) (T, error)) (T, error) {
	return cluster.OnManager(ctx, m.peers.UserMap, m.self, user, Service(local{m}), m.on, cluster.Idempotent, call)
}

type local struct{ m *Manager }

func (l local) Scan(ctx context.Context, r *ScanRequest) (*ScanReply, error) { return l.m.Scan(ctx, r) }
func (l local) Lookup(ctx context.Context, r *LookupRequest) (*LookupReply, error) {
	return l.m.lookup(ctx, r)
}
func (l local) Note(ctx context.Context, r *NoteRequest) error     { return l.m.note(ctx, r) }
func (l local) Update(ctx context.Context, r *UpdateRequest) error { return l.m.update(r) }
func (l local) List(ctx context.Context) (*ListReply, error)       { return l.m.list(ctx) }
func (l local) Handoff(ctx context.Context, r *HandoffRequest) (*HandoffReply, error) {
	return l.m.handoff(ctx, r)
}
func (l local) DomainUsage(ctx context.Context, dom string) (DomainUsage, error) {
	return l.m.DomainPart(ctx, dom)
}

type remote struct {
	conns cluster.Conns
	node  cluster.NodeID
}

func (r remote) client() (nodepb.UserManagerClient, error) {
	cc, err := r.conns.Conn(r.node)
	if err != nil {
		return nil, err
	}
	return nodepb.NewUserManagerClient(cc), nil
}

func (r remote) Scan(ctx context.Context, req *ScanRequest) (*ScanReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Scan(ctx, &nodepb.ScanRequest{Buckets: bucketsToPB(req.Buckets), From: string(req.From)})
	if err != nil {
		return nil, err
	}
	out := &ScanReply{Node: cluster.NodeID(p.Node), Boot: p.Boot, Fragments: p.Fragments,
		Held: bucketsFromPB(p.Held), Ended: p.Ended}
	for _, pp := range p.Profiles {
		out.Profiles = append(out.Profiles, *userdb.ProfileFromPB(pp))
	}
	return out, nil
}

func (r remote) Lookup(ctx context.Context, req *LookupRequest) (*LookupReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Lookup(ctx, &nodepb.LookupRequest{User: req.User})
	if err != nil {
		return nil, err
	}
	return &LookupReply{Profile: userdb.ProfileFromPB(p.Profile), MailMap: cluster.IDsFromPB(p.MailMap)}, nil
}

func (r remote) Note(ctx context.Context, req *NoteRequest) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	_, err = c.Note(ctx, &nodepb.NoteRequest{User: req.User, Node: string(req.Node)})
	return err
}

func (r remote) Update(ctx context.Context, req *UpdateRequest) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	_, err = c.Update(ctx, &nodepb.UpdateRequest{Profile: req.Profile.ToPB()})
	return err
}

func (r remote) List(ctx context.Context) (*ListReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.List(ctx, &nodepb.Empty{})
	if err != nil {
		return nil, err
	}
	out := &ListReply{}
	for _, pp := range p.Profiles {
		out.Profiles = append(out.Profiles, *userdb.ProfileFromPB(pp))
	}
	return out, nil
}

func (r remote) Handoff(ctx context.Context, req *HandoffRequest) (*HandoffReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Handoff(ctx, req.toPB())
	if err != nil {
		return nil, err
	}
	return &HandoffReply{Refused: bucketsFromPB(p.Refused)}, nil
}

func (r remote) DomainUsage(ctx context.Context, dom string) (DomainUsage, error) {
	c, err := r.client()
	if err != nil {
		return DomainUsage{}, err
	}
	p, err := c.DomainUsage(ctx, &nodepb.DomainUsageRequest{Domain: dom})
	if err != nil {
		return DomainUsage{}, err
	}
	return domainUsageFromPB(p), nil
}

// Register exposes the user manager and the node's writers to other nodes.
func (m *Manager) Register(s grpc.ServiceRegistrar) {
	nodepb.RegisterUserManagerServer(s, server{l: local{m}})
	m.writers.Register(s)
}

type server struct {
	nodepb.UnimplementedUserManagerServer
	l local
}

func (s server) Scan(ctx context.Context, p *nodepb.ScanRequest) (*nodepb.ScanReply, error) {
	rep, err := s.l.Scan(ctx, &ScanRequest{Buckets: bucketsFromPB(p.Buckets), From: cluster.NodeID(p.From)})
	if err != nil {
		return nil, err
	}
	out := &nodepb.ScanReply{Node: string(rep.Node), Boot: rep.Boot, Fragments: rep.Fragments,
		Held: bucketsToPB(rep.Held), Ended: rep.Ended}
	for i := range rep.Profiles {
		out.Profiles = append(out.Profiles, rep.Profiles[i].ToPB())
	}
	return out, nil
}

func (s server) Lookup(ctx context.Context, p *nodepb.LookupRequest) (*nodepb.LookupReply, error) {
	rep, err := s.l.Lookup(ctx, &LookupRequest{User: p.User})
	if err != nil {
		return nil, err
	}
	out := &nodepb.LookupReply{MailMap: cluster.IDsToPB(rep.MailMap)}
	if rep.Profile != nil {
		out.Profile = rep.Profile.ToPB()
	}
	return out, nil
}

func (s server) Note(ctx context.Context, p *nodepb.NoteRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Note(ctx, &NoteRequest{User: p.User, Node: cluster.NodeID(p.Node)})
}

func (s server) Update(ctx context.Context, p *nodepb.UpdateRequest) (*nodepb.Empty, error) {
	prof := userdb.ProfileFromPB(p.Profile)
	if prof == nil {
		return &nodepb.Empty{}, nil
	}
	return &nodepb.Empty{}, s.l.Update(ctx, &UpdateRequest{Profile: *prof})
}

func (s server) List(ctx context.Context, _ *nodepb.Empty) (*nodepb.ListReply, error) {
	rep, err := s.l.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &nodepb.ListReply{}
	for i := range rep.Profiles {
		out.Profiles = append(out.Profiles, rep.Profiles[i].ToPB())
	}
	return out, nil
}

func (s server) DomainUsage(ctx context.Context, p *nodepb.DomainUsageRequest) (*nodepb.DomainUsageReply, error) {
	u, err := s.l.DomainUsage(ctx, userdb.Normalize(p.Domain))
	if err != nil {
		return nil, err
	}
	return domainUsageToPB(u), nil
}

func (s server) Handoff(ctx context.Context, p *nodepb.HandoffRequest) (*nodepb.HandoffReply, error) {
	rep, err := s.l.Handoff(ctx, handoffRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	return &nodepb.HandoffReply{Refused: bucketsToPB(rep.Refused)}, nil
}

func bucketsToPB(bs []uint8) []uint32 {
	out := make([]uint32, len(bs))
	for i, b := range bs {
		out[i] = uint32(b)
	}
	return out
}

func bucketsFromPB(bs []uint32) []uint8 {
	out := make([]uint8, 0, len(bs))
	for _, b := range bs {
		if b < cluster.Buckets {
			out = append(out, uint8(b))
		}
	}
	return out
}

func (r *HandoffRequest) toPB() *nodepb.HandoffRequest {
	out := &nodepb.HandoffRequest{From: string(r.From), Boot: r.Boot}
	for _, hb := range r.Buckets {
		pb := &nodepb.HandoffBucket{Bucket: uint32(hb.Bucket), Tenure: hb.Tenure, Held: int64(hb.Held)}
		for _, hu := range hb.Users {
			pu := &nodepb.HandoffUser{User: hu.User, MailMap: cluster.IDsToPB(hu.MailMap), Boxes: writer.BoxesToPB(hu.Boxes)}
			if hu.Profile != nil {
				pu.Profile = hu.Profile.ToPB()
			}
			pb.Users = append(pb.Users, pu)
		}
		out.Buckets = append(out.Buckets, pb)
	}
	return out
}

func handoffRequestFromPB(p *nodepb.HandoffRequest) *HandoffRequest {
	out := &HandoffRequest{From: cluster.NodeID(p.From), Boot: p.Boot}
	for _, pb := range p.Buckets {
		if pb.Bucket >= cluster.Buckets {
			continue
		}
		hb := HandoffBucket{Bucket: uint8(pb.Bucket), Tenure: pb.Tenure, Held: time.Duration(pb.Held)}
		for _, pu := range pb.Users {
			hb.Users = append(hb.Users, HandoffUser{Profile: userdb.ProfileFromPB(pu.Profile), MailMap: cluster.IDsFromPB(pu.MailMap),
				UserState: writer.UserState{User: pu.User, Boxes: writer.BoxesFromPB(pu.Boxes)}})
		}
		out.Buckets = append(out.Buckets, hb)
	}
	return out
}
