package proxy

import (
	"context"
	"errors"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/rpc"
)

// The mailbox manager's remote operations (Porcupine §2.2: the mailbox
// manager "enables remote access to mailbox fragments"): a retrieval proxy on
// any node lists, reads and deletes the fragments a node holds.

// ListRequest names a user's INBOX fragment on the callee.
type ListRequest struct {
	User string `json:"user"`
}

// ListReply is the digest of the fragment: its mailbox and messages.
type ListReply struct {
	Mailbox  uint64            `json:"mailbox"`
	Messages []mailbox.Message `json:"messages"`
}

// LocalList returns this node's INBOX fragment of a user.
func (p *Proxy) LocalList(ctx context.Context, req *ListRequest) (*ListReply, error) {
	mb, err := p.Boxes.Mailbox(req.User, mailbox.Inbox)
	if errors.Is(err, mailbox.ErrNoMailbox) {
		return &ListReply{}, nil
	}
	if err != nil {
		return nil, err
	}
	msgs, err := p.Boxes.Messages(req.User, mb.ID)
	if err != nil {
		return nil, err
	}
	return &ListReply{Mailbox: mb.ID, Messages: msgs}, nil
}

// BodyRequest asks for one message's bytes.
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

// ExpungeRequest removes messages from a fragment.
type ExpungeRequest struct {
	User    string   `json:"user"`
	Mailbox uint64   `json:"mailbox"`
	UIDs    []uint32 `json:"uids"`
}

// LocalExpunge removes messages this node stores.
func (p *Proxy) LocalExpunge(ctx context.Context, req *ExpungeRequest) (*struct{}, error) {
	_, err := p.Boxes.Expunge(req.User, req.Mailbox, req.UIDs)
	return &struct{}{}, err
}

// Register exposes the mailbox manager's remote operations.
func (p *Proxy) Register(s *rpc.Server) {
	s.Handle("mailbox.Store", rpc.Method(p.LocalStore))
	s.Handle("mailbox.List", rpc.Method(p.LocalList))
	s.Handle("mailbox.Body", rpc.Method(p.LocalBody))
	s.Handle("mailbox.Expunge", rpc.Method(p.LocalExpunge))
}
