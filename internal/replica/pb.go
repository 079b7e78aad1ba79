package replica

// The replication manager's service on the wire (proto/quill/v1/
// replica.proto): conversions of its types, the client for another node's
// manager, and the server that exposes this one. The update log on disk
// uses the same encoding (an Entry).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Service is the replication manager as another node's reaches it: a
// manager, or the client of one on another node (On).
type Service interface {
	// Write coordinates updates (see Manager.Write); a reply with fewer
	// targets than the policy asks for comes with ErrPolicy.
	Write(ctx context.Context, req *WriteRequest) (*WriteReply, error)
	// Push applies updates pushed by their coordinator.
	Push(ctx context.Context, req *PushRequest) (*PushReply, error)
	// Done marks updates that reached every target.
	Done(ctx context.Context, req *DoneRequest) error
}

var _ Service = (*Manager)(nil)

// On returns node n's replication manager: this one directly, another's by
// RPC.
func (m *Manager) On(n cluster.NodeID) Service {
	if n == m.self {
		return m
	}
	return Remote(m.peers, n)
}

// Remote returns the client of node n's replication manager.
func Remote(conns cluster.Conns, n cluster.NodeID) Service { return remote{conns, n} }

type remote struct {
	conns cluster.Conns
	node  cluster.NodeID
}

func (r remote) client() (nodepb.ReplicaClient, error) {
	cc, err := r.conns.Conn(r.node)
	if err != nil {
		return nil, err
	}
	return nodepb.NewReplicaClient(cc), nil
}

func (r remote) Write(ctx context.Context, req *WriteRequest) (*WriteReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	p, err := c.Write(ctx, req.toPB())
	if err != nil {
		return nil, err
	}
	rep := &WriteReply{Acked: cluster.IDsFromPB(p.Acked)}
	if p.Short != "" {
		return rep, fmt.Errorf("%s: %w", p.Short, ErrPolicy)
	}
	return rep, nil
}

func (r remote) Push(ctx context.Context, req *PushRequest) (*PushReply, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	pr := req.toPB()
	var blobs [][]byte
	for _, e := range pr.Entries {
		if u := e.Update; u != nil && len(u.Blob) >= streamFrom {
			blobs = append(blobs, u.Blob)
			u.BlobSize, u.Blob = int64(len(u.Blob)), nil
		}
	}
	var p *nodepb.PushReply
	if len(blobs) == 0 {
		p, err = c.Push(ctx, pr)
	} else {
		p, err = pushStream(ctx, c, pr, blobs)
	}
	if err != nil {
		return nil, err
	}
	out := &PushReply{Outcomes: make([]Outcome, len(p.Outcomes))}
	for i, o := range p.Outcomes {
		out.Outcomes[i] = Outcome(o)
	}
	return out, nil
}

// Pushes of large blobs. A message body in one gRPC message is framed
// whole on each side: the sender marshals a copy, the receiver reads the
// frame into one buffer and unmarshals a second copy. Streamed in chunks,
// the sender holds no copy and the receiver one, the blob itself.
const (
	// streamFrom is the blob size from which a push streams: the size
	// from which a body is kept as a file (mailbox.LargeBody).
	streamFrom = 64 << 10
	// pushChunk is the size of a stream's chunks: large enough that the
	// per-message cost is nothing beside the copy, small beside a body.
	pushChunk = 256 << 10
	// maxStreamBlob bounds a streamed blob a peer announces (bad input
	// must not make a node allocate without bound): the RPC layer's own
	// bound on a message, which is above the SMTP limit.
	maxStreamBlob = 64 << 20
)

// pushStream sends a push whose large blobs (blobs, in the order of their
// entries) were left out of pr, as PushStream's chunks.
func pushStream(ctx context.Context, c nodepb.ReplicaClient, pr *nodepb.PushRequest, blobs [][]byte) (*nodepb.PushReply, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream on every early return
	st, err := c.PushStream(ctx)
	if err != nil {
		return nil, err
	}
	send := func(p *nodepb.PushPart) error {
		if err := st.Send(p); errors.Is(err, io.EOF) {
			// The peer ended the stream: its answer says why.
			_, err = st.CloseAndRecv()
			return err
		} else {
			return err
		}
	}
	if err := send(&nodepb.PushPart{Request: pr}); err != nil {
		return nil, err
	}
	for _, b := range blobs {
		for len(b) > 0 {
			n := min(len(b), pushChunk)
			if err := send(&nodepb.PushPart{Chunk: b[:n]}); err != nil {
				return nil, err
			}
			b = b[n:]
		}
	}
	return st.CloseAndRecv()
}

// PushStream implements the streamed push: the request, then each large
// blob read into one buffer of its announced size.
func (s server) PushStream(st grpc.ClientStreamingServer[nodepb.PushPart, nodepb.PushReply]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	if first.Request == nil {
		return fmt.Errorf("push stream: the first part has no request")
	}
	for _, e := range first.Request.Entries {
		u := e.GetUpdate()
		if u == nil || u.BlobSize == 0 {
			continue
		}
		if u.BlobSize < 0 || u.BlobSize > maxStreamBlob {
			return fmt.Errorf("push stream: update of %s announces a blob of %d bytes (at most %d)", u.Object, u.BlobSize, maxStreamBlob)
		}
		u.Blob = make([]byte, 0, u.BlobSize)
		for int64(len(u.Blob)) < u.BlobSize {
			p, err := st.Recv()
			if err != nil {
				return fmt.Errorf("push stream: blob of %s cut short at %d of %d bytes: %w", u.Object, len(u.Blob), u.BlobSize, err)
			}
			if int64(len(u.Blob)+len(p.Chunk)) > u.BlobSize {
				return fmt.Errorf("push stream: blob of %s longer than the %d bytes announced", u.Object, u.BlobSize)
			}
			u.Blob = append(u.Blob, p.Chunk...)
		}
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("push stream: more parts than the request announced")
	}
	rep, err := s.Push(st.Context(), first.Request)
	if err != nil {
		return err
	}
	return st.SendAndClose(rep)
}

func (r remote) Done(ctx context.Context, req *DoneRequest) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	_, err = c.Done(ctx, req.toPB())
	return err
}

// Register exposes the manager to its peers.
func (m *Manager) Register(s grpc.ServiceRegistrar) { nodepb.RegisterReplicaServer(s, server{m: m}) }

type server struct {
	nodepb.UnimplementedReplicaServer
	m *Manager
}

func (s server) Write(ctx context.Context, p *nodepb.WriteRequest) (*nodepb.WriteReply, error) {
	req, err := writeRequestFromPB(p)
	if err != nil {
		return nil, err
	}
	rep, err := s.m.Write(ctx, req)
	if errors.Is(err, ErrPolicy) && rep != nil {
		// Logged, but short of the policy: the caller learns how many
		// targets hold it, and why not more.
		return &nodepb.WriteReply{Acked: cluster.IDsToPB(rep.Acked), Short: err.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	return &nodepb.WriteReply{Acked: cluster.IDsToPB(rep.Acked)}, nil
}

func (s server) Push(ctx context.Context, p *nodepb.PushRequest) (*nodepb.PushReply, error) {
	req := &PushRequest{Entries: make([]*Entry, len(p.Entries))}
	for i, e := range p.Entries {
		req.Entries[i] = entryFromPB(e)
	}
	rep, err := s.m.Push(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &nodepb.PushReply{Outcomes: make([]nodepb.Outcome, len(rep.Outcomes))}
	for i, o := range rep.Outcomes {
		out.Outcomes[i] = nodepb.Outcome(o)
	}
	return out, nil
}

func (s server) Done(ctx context.Context, p *nodepb.DoneRequest) (*nodepb.Empty, error) {
	req := &DoneRequest{Objects: p.Objects, Stamps: make([]Stamp, len(p.Stamps))}
	for i, st := range p.Stamps {
		req.Stamps[i] = StampFromPB(st)
	}
	return &nodepb.Empty{}, s.m.Done(ctx, req)
}

// ToPB converts a stamp for the wire.
func (a Stamp) ToPB() *nodepb.Stamp {
	return &nodepb.Stamp{Clock: uint64(a.Clock), Node: string(a.Node)}
}

// StampFromPB converts a stamp from the wire.
func StampFromPB(p *nodepb.Stamp) Stamp {
	if p == nil {
		return Stamp{}
	}
	return Stamp{Clock: hlc.Timestamp(p.Clock), Node: cluster.NodeID(p.Node)}
}

func (u *Update) toPB() *nodepb.Update {
	return &nodepb.Update{Object: u.Object, Stamp: u.Stamp.ToPB(), Targets: cluster.IDsToPB(u.Targets), Data: u.Data, Blob: u.Blob}
}

func updateFromPB(p *nodepb.Update) Update {
	if p == nil {
		return Update{}
	}
	return Update{Object: p.Object, Stamp: StampFromPB(p.Stamp), Targets: cluster.IDsFromPB(p.Targets), Data: p.Data, Blob: p.Blob}
}

func (e *Entry) toPB() *nodepb.Entry {
	return &nodepb.Entry{Update: e.Update.toPB(), Remaining: cluster.IDsToPB(e.Remaining),
		Logged: nodepb.Nanos(e.Logged), Done: nodepb.Nanos(e.Done)}
}

func entryFromPB(p *nodepb.Entry) *Entry {
	if p == nil {
		return nil
	}
	return &Entry{Update: updateFromPB(p.Update), Remaining: cluster.IDsFromPB(p.Remaining),
		Logged: nodepb.Time(p.Logged), Done: nodepb.Time(p.Done)}
}

func (r *WriteRequest) toPB() *nodepb.WriteRequest {
	out := &nodepb.WriteRequest{Policy: string(r.Policy), Want: int32(r.Want)}
	for _, u := range r.Updates {
		out.Updates = append(out.Updates, u.toPB())
	}
	return out
}

func writeRequestFromPB(p *nodepb.WriteRequest) (*WriteRequest, error) {
	pol, err := ParsePolicy(p.Policy)
	if err != nil {
		return nil, err
	}
	out := &WriteRequest{Policy: pol, Want: int(p.Want)}
	for _, u := range p.Updates {
		uu := updateFromPB(u)
		out.Updates = append(out.Updates, &uu)
	}
	return out, nil
}

func (r *PushRequest) toPB() *nodepb.PushRequest {
	out := &nodepb.PushRequest{}
	for _, e := range r.Entries {
		out.Entries = append(out.Entries, e.toPB())
	}
	return out
}

func (r *DoneRequest) toPB() *nodepb.DoneRequest {
	out := &nodepb.DoneRequest{Objects: r.Objects}
	for _, st := range r.Stamps {
		out.Stamps = append(out.Stamps, st.ToPB())
	}
	return out
}

// MoveToPB converts a move for the wire.
func MoveToPB(mv Move) *nodepb.Move {
	return &nodepb.Move{Object: mv.Object, Replicas: cluster.IDsToPB(mv.Replicas), Gone: cluster.IDsToPB(mv.Gone), From: cluster.IDsToPB(mv.From)}
}

// MoveFromPB converts a move from the wire.
func MoveFromPB(p *nodepb.Move) Move {
	return Move{Object: p.Object, Replicas: cluster.IDsFromPB(p.Replicas), Gone: cluster.IDsFromPB(p.Gone), From: cluster.IDsFromPB(p.From)}
}

// encodeEntry encodes a log entry for the store.
func encodeEntry(e *Entry) ([]byte, error) { return proto.Marshal(e.toPB()) }

// decodeEntry reads a log entry from the store: protobuf, or the JSON of
// logs written before it (a JSON object starts with '{', which no protobuf
// encoding of an Entry does: that would be field 15 as a group).
func decodeEntry(b []byte) (*Entry, error) {
	if len(b) > 0 && b[0] == '{' {
		var e Entry
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, err
		}
		return &e, nil
	}
	var p nodepb.Entry
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return entryFromPB(&p), nil
}
