package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/rpc"
)

// BodyRequest asks a node for one message's bytes.
type BodyRequest struct {
	User string `json:"user"`
	ID   string `json:"id"`
}

// BodyReply carries the message.
type BodyReply struct {
	Raw []byte `json:"raw"`
}

// LocalBody returns a message this node stores.
func (p *Proxy) LocalBody(ctx context.Context, req *BodyRequest) (*BodyReply, error) {
	b, err := p.Boxes.Body(req.User, req.ID)
	if errors.Is(err, mailbox.ErrNoMessage) {
		return nil, errors.Join(err, rpc.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return &BodyReply{Raw: b}, nil
}

// body fetches a message from the node that stores it (Porcupine §2.3.2:
// the proxy fetches each message from the appropriate node).
func (p *Proxy) body(ctx context.Context, n cluster.NodeID, user, id string) ([]byte, error) {
	if n == p.Self {
		return p.Boxes.Body(user, id)
	}
	var rep BodyReply
	if err := p.Peers.Call(ctx, n, "mailbox.Body", &BodyRequest{User: user, ID: id}, &rep); err != nil {
		return nil, err
	}
	return rep.Raw, nil
}

func (p *Proxy) openBody(ctx context.Context, n cluster.NodeID, user, id string) (io.ReadCloser, error) {
	b, err := p.body(ctx, n, user, id)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// Register exposes the mailbox manager's remote operations.
func (p *Proxy) Register(s *rpc.Server) {
	s.Handle("mailbox.Body", rpc.Method(p.LocalBody))
	p.Boxes.Register(s)
}
