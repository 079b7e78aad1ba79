package mailbox

// The mailbox manager's remote access on the wire (proto/quill/v1/
// fragment.proto): the Fragments service, its client for another node's
// manager and the server exposing this one, and the conversions of the
// mailbox types every service uses (messages, mailboxes, placements, and
// message objects inside replication updates).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Fragments is a node's mailbox manager as another node reaches it: read a
// fragment, drop one or all of a user's, digest them for the writers'
// audit, read a message's bytes.
type Fragments interface {
	Get(ctx context.Context, req *FragmentRequest) (*FragmentDigest, error)
	Drop(ctx context.Context, req *FragmentRequest) error
	DropUser(ctx context.Context, req *FragmentRequest) error
	Audit(ctx context.Context, req *AuditRequest) (*AuditReply, error)
	Body(ctx context.Context, req *BodyRequest) (*BodyReply, error)
	TextExcluded(ctx context.Context, req *TextRequest) (*TextAnswer, error)
}

// TextRequest asks a node's text index which messages of a mailbox it
// holds cannot match every query, and which certainly match each
// (Manager.TextExcluded).
type TextRequest struct {
	User        string
	UIDValidity uint32
	Queries     []fts.Query
}

// BodyRequest asks a node for one message's bytes.
type BodyRequest struct {
	User string
	ID   string
}

// BodyReply carries the message.
type BodyReply struct {
	Raw []byte
}

// On returns node n's mailbox manager: this one directly (conns unused),
// another's by RPC.
func (m *Manager) On(conns cluster.Conns, n cluster.NodeID) Fragments {
	if n == m.Self {
		return local{m}
	}
	return remoteFragments{conns, n}
}

// local is this node's mailbox manager behind the Fragments interface.
type local struct{ m *Manager }

func (l local) Get(ctx context.Context, r *FragmentRequest) (*FragmentDigest, error) {
	return l.m.Fragment(r.User, r.UIDValidity)
}
func (l local) Drop(ctx context.Context, r *FragmentRequest) error {
	return l.m.DropMailbox(r.User, r.UIDValidity)
}
func (l local) DropUser(ctx context.Context, r *FragmentRequest) error { return l.m.DeleteUser(r.User) }
func (l local) Audit(ctx context.Context, r *AuditRequest) (*AuditReply, error) {
	return l.m.Audit(r)
}
func (l local) Body(ctx context.Context, r *BodyRequest) (*BodyReply, error) {
	b, err := l.m.Body(r.User, r.ID)
	if errors.Is(err, ErrNoMessage) {
		return nil, errors.Join(err, rpc.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return &BodyReply{Raw: b}, nil
}

func (l local) TextExcluded(ctx context.Context, r *TextRequest) (*TextAnswer, error) {
	return l.m.TextExcluded(r.User, r.UIDValidity, r.Queries)
}

type remoteFragments struct {
	conns cluster.Conns
	node  cluster.NodeID
}

func (r remoteFragments) client() (nodepb.FragmentClient, error) {
	cc, err := r.conns.Conn(r.node)
	if err != nil {
		return nil, err
	}
	return nodepb.NewFragmentClient(cc), nil
}

func (r remoteFragments) Get(ctx context.Context, req *FragmentRequest) (*FragmentDigest, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Get(ctx, req.toPB())
	if err != nil {
		return nil, err
	}
	out := &FragmentDigest{UIDNext: p.UidNext, HighestModSeq: p.HighestModSeq}
	for _, mp := range p.Messages {
		out.Messages = append(out.Messages, MessageFromPB(mp))
	}
	return out, nil
}

func (r remoteFragments) Drop(ctx context.Context, req *FragmentRequest) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	_, err = c.Drop(ctx, req.toPB())
	return err
}

func (r remoteFragments) DropUser(ctx context.Context, req *FragmentRequest) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	_, err = c.DropUser(ctx, req.toPB())
	return err
}

func (r remoteFragments) Audit(ctx context.Context, req *AuditRequest) (*AuditReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Audit(ctx, req.toPB())
	if err != nil {
		return nil, err
	}
	return auditReplyFromPB(p), nil
}

func (r remoteFragments) Body(ctx context.Context, req *BodyRequest) (*BodyReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Body(ctx, &nodepb.BodyRequest{User: req.User, Id: req.ID})
	if err != nil {
		return nil, err
	}
	return &BodyReply{Raw: p.Raw}, nil
}

func (r remoteFragments) TextExcluded(ctx context.Context, req *TextRequest) (*TextAnswer, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.TextExcluded(ctx, req.toPB())
	if err != nil {
		return nil, err
	}
	out := &TextAnswer{Skip: skipsFromPB(p.Skips), Sure: make([][]TextSkip, len(req.Queries))}
	for _, s := range p.Sure {
		if int(s.Query) >= len(out.Sure) {
			return nil, fmt.Errorf("text index answer: query %d of %d", s.Query, len(out.Sure))
		}
		out.Sure[s.Query] = skipsFromPB(s.Skips)
	}
	return out, nil
}

func skipsFromPB(p []uint64) []TextSkip {
	out := make([]TextSkip, len(p))
	for i, s := range p {
		out[i] = TextSkip(s)
	}
	return out
}

func skipsToPB(skips []TextSkip) []uint64 {
	out := make([]uint64, len(skips))
	for i, s := range skips {
		out[i] = uint64(s)
	}
	return out
}

// Register exposes the mailbox manager's remote operations.
func (m *Manager) Register(s grpc.ServiceRegistrar) {
	nodepb.RegisterFragmentServer(s, fragmentServer{l: local{m}})
}

type fragmentServer struct {
	nodepb.UnimplementedFragmentServer
	l local
}

func fragmentRequestFromPB(p *nodepb.FragmentRequest) *FragmentRequest {
	return &FragmentRequest{User: p.User, UIDValidity: p.UidValidity}
}

func (s fragmentServer) Get(ctx context.Context, p *nodepb.FragmentRequest) (*nodepb.FragmentDigest, error) {
	d, err := s.l.Get(ctx, fragmentRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	out := &nodepb.FragmentDigest{UidNext: d.UIDNext, HighestModSeq: d.HighestModSeq}
	for i := range d.Messages {
		out.Messages = append(out.Messages, MessageToPB(&d.Messages[i]))
	}
	return out, nil
}

func (s fragmentServer) Drop(ctx context.Context, p *nodepb.FragmentRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.Drop(ctx, fragmentRequestFromPB(p))
}

func (s fragmentServer) DropUser(ctx context.Context, p *nodepb.FragmentRequest) (*nodepb.Empty, error) {
	return &nodepb.Empty{}, s.l.DropUser(ctx, fragmentRequestFromPB(p))
}

func (s fragmentServer) Audit(ctx context.Context, p *nodepb.AuditRequest) (*nodepb.AuditReply, error) {
	rep, err := s.l.Audit(ctx, auditRequestFromPB(p))
	if err != nil {
		return nil, err
	}
	return rep.toPB(), nil
}

func (s fragmentServer) Body(ctx context.Context, p *nodepb.BodyRequest) (*nodepb.BodyReply, error) {
	rep, err := s.l.Body(ctx, &BodyRequest{User: p.User, ID: p.Id})
	if err != nil {
		return nil, err
	}
	return &nodepb.BodyReply{Raw: rep.Raw}, nil
}

func (s fragmentServer) TextExcluded(ctx context.Context, p *nodepb.TextRequest) (*nodepb.TextReply, error) {
	req := &TextRequest{User: p.User, UIDValidity: p.UidValidity}
	if len(p.Queries) > maxTextQueries {
		return nil, fmt.Errorf("text index: %d queries, at most %d", len(p.Queries), maxTextQueries)
	}
	for _, q := range p.Queries {
		req.Queries = append(req.Queries, fts.Query{Fields: q.Fields, Needle: q.Needle})
	}
	a, err := s.l.TextExcluded(ctx, req)
	if err != nil {
		return nil, err
	}
	rep := &nodepb.TextReply{Skips: skipsToPB(a.Skip)}
	for i, sure := range a.Sure {
		if len(sure) > 0 {
			rep.Sure = append(rep.Sure, &nodepb.TextSure{Query: uint32(i), Skips: skipsToPB(sure)})
		}
	}
	return rep, nil
}

// maxTextQueries bounds the string criteria one search asks a node about.
const maxTextQueries = 64

func (r *TextRequest) toPB() *nodepb.TextRequest {
	p := &nodepb.TextRequest{User: r.User, UidValidity: r.UIDValidity}
	for _, q := range r.Queries {
		p.Queries = append(p.Queries, &nodepb.TextQuery{Fields: q.Fields, Needle: q.Needle})
	}
	return p
}

func (r *FragmentRequest) toPB() *nodepb.FragmentRequest {
	return &nodepb.FragmentRequest{User: r.User, UidValidity: r.UIDValidity}
}

func (r *AuditRequest) toPB() *nodepb.AuditRequest {
	out := &nodepb.AuditRequest{List: r.List, Before: uint64(r.Before), Users: r.Users}
	for _, b := range r.Buckets {
		out.Buckets = append(out.Buckets, uint32(b))
	}
	for _, b := range r.Boxes {
		out.Boxes = append(out.Boxes, &nodepb.AuditBox{User: b.User, UidValidity: b.UIDValidity})
	}
	return out
}

func auditRequestFromPB(p *nodepb.AuditRequest) *AuditRequest {
	out := &AuditRequest{List: p.List, Before: hlc.Timestamp(p.Before), Users: p.Users}
	for _, b := range p.Buckets {
		out.Buckets = append(out.Buckets, uint8(b))
	}
	for _, b := range p.Boxes {
		out.Boxes = append(out.Boxes, AuditBox{User: b.User, UIDValidity: b.UidValidity})
	}
	return out
}

func (r *AuditReply) toPB() *nodepb.AuditReply {
	out := &nodepb.AuditReply{Users: r.Users, UsersAnswered: r.UsersAnswered}
	for _, d := range r.Boxes {
		pd := &nodepb.AuditDigest{Box: &nodepb.AuditBox{User: d.User, UidValidity: d.UIDValidity}, Count: int64(d.Count), Hash: d.Hash}
		for _, m := range d.Messages {
			pd.Messages = append(pd.Messages, &nodepb.AuditMessage{Uid: m.UID, Id: m.ID, Version: m.Version.ToPB()})
		}
		out.Boxes = append(out.Boxes, pd)
	}
	return out
}

func auditReplyFromPB(p *nodepb.AuditReply) *AuditReply {
	out := &AuditReply{Users: p.Users, UsersAnswered: p.UsersAnswered}
	for _, pd := range p.Boxes {
		d := AuditDigest{Count: int(pd.Count), Hash: pd.Hash}
		if pd.Box != nil {
			d.AuditBox = AuditBox{User: pd.Box.User, UIDValidity: pd.Box.UidValidity}
		}
		for _, m := range pd.Messages {
			d.Messages = append(d.Messages, AuditMsg{UID: m.Uid, ID: m.Id, Version: replica.StampFromPB(m.Version)})
		}
		out.Boxes = append(out.Boxes, d)
	}
	return out
}

// MessageToPB converts a message record for the wire.
func MessageToPB(m *Message) *nodepb.Message {
	return &nodepb.Message{Uid: m.UID, Id: m.ID, Size: m.Size, Date: nodepb.Nanos(m.Date), Flags: m.Flags,
		ModSeq: m.ModSeq, Version: m.Version.ToPB(), Replicas: cluster.IDsToPB(m.Replicas), Want: int32(m.Want)}
}

// MessageFromPB converts a message record from the wire.
func MessageFromPB(p *nodepb.Message) Message {
	if p == nil {
		return Message{}
	}
	return Message{UID: p.Uid, ID: p.Id, Size: p.Size, Date: nodepb.Time(p.Date), Flags: p.Flags,
		ModSeq: p.ModSeq, Version: replica.StampFromPB(p.Version), Replicas: cluster.IDsFromPB(p.Replicas), Want: int(p.Want)}
}

// MailboxToPB converts a mailbox record for the wire.
func MailboxToPB(mb *Mailbox) *nodepb.Mailbox {
	return &nodepb.Mailbox{Id: mb.ID, Name: mb.Name, UidValidity: mb.UIDValidity, UidNext: mb.UIDNext,
		HighestModSeq: mb.HighestModSeq, Subscribed: mb.Subscribed, SpecialUse: mb.SpecialUse, Created: nodepb.Nanos(mb.Created)}
}

// MailboxFromPB converts a mailbox record from the wire.
func MailboxFromPB(p *nodepb.Mailbox) Mailbox {
	if p == nil {
		return Mailbox{}
	}
	return Mailbox{ID: p.Id, Name: p.Name, UIDValidity: p.UidValidity, UIDNext: p.UidNext,
		HighestModSeq: p.HighestModSeq, Subscribed: p.Subscribed, SpecialUse: p.SpecialUse, Created: nodepb.Time(p.Created)}
}

// PlacedToPB converts a placement for the wire.
func PlacedToPB(p *Placed) *nodepb.Placed {
	return &nodepb.Placed{User: p.User, Mailbox: p.Mailbox, UidValidity: p.UIDValidity, Uid: p.UID, ModSeq: p.ModSeq, Flags: p.Flags}
}

// PlacedFromPB converts a placement from the wire.
func PlacedFromPB(p *nodepb.Placed) Placed {
	if p == nil {
		return Placed{}
	}
	return Placed{User: p.User, Mailbox: p.Mailbox, UIDValidity: p.UidValidity, UID: p.Uid, ModSeq: p.ModSeq, Flags: p.Flags}
}

// encodeObject is a message object as an update's data.
func encodeObject(o *Object) ([]byte, error) {
	return proto.Marshal(&nodepb.MessageObject{User: o.User, Id: o.ID, Mailbox: o.Mailbox, UidValidity: o.UIDValidity,
		Uid: o.UID, ModSeq: o.ModSeq, Flags: o.Flags, Size: o.Size, Date: nodepb.Nanos(o.Date),
		Replicas: cluster.IDsToPB(o.Replicas), Want: int32(o.Want), Deleted: o.Deleted, BodyFrom: o.BodyFrom})
}

// decodeObject reads an update's data: protobuf, or the JSON of updates
// logged before it (a JSON object starts with '{', which no protobuf
// encoding of a MessageObject does).
func decodeObject(b []byte, o *Object) error {
	if len(b) > 0 && b[0] == '{' {
		return json.Unmarshal(b, o)
	}
	var p nodepb.MessageObject
	if err := proto.Unmarshal(b, &p); err != nil {
		return err
	}
	*o = Object{User: p.User, ID: p.Id, Mailbox: p.Mailbox, UIDValidity: p.UidValidity, UID: p.Uid, ModSeq: p.ModSeq,
		Flags: p.Flags, Size: p.Size, Date: nodepb.Time(p.Date), Replicas: cluster.IDsFromPB(p.Replicas),
		Want: int(p.Want), Deleted: p.Deleted, BodyFrom: p.BodyFrom}
	return nil
}
