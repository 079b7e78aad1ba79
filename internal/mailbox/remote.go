package mailbox

import (
	"context"

	"github.com/quillmail/quill/internal/rpc"
)

// Remote access to this node's fragments (Porcupine §2.2: the mailbox
// manager enables remote access to mailbox fragments). The mailbox's
// ordered writer on the user's manager node reads fragments and drops
// deleted mailboxes and users with these; changes to messages go through
// the replication manager (object.go).

// FragmentRequest names one cluster mailbox of a user.
type FragmentRequest struct {
	User        string `json:"user"`
	UIDValidity uint32 `json:"uidvalidity"`
}

// Empty is the reply of calls that return nothing.
type Empty struct{}

// Register exposes the fragment operations to other nodes.
func (m *Manager) Register(s *rpc.Server) {
	s.Handle("fragment.Get", rpc.Method(func(ctx context.Context, r *FragmentRequest) (*FragmentDigest, error) {
		return m.Fragment(r.User, r.UIDValidity)
	}))
	s.Handle("fragment.Drop", rpc.Method(func(ctx context.Context, r *FragmentRequest) (*Empty, error) {
		return &Empty{}, m.DropMailbox(r.User, r.UIDValidity)
	}))
	s.Handle("fragment.Audit", rpc.Method(func(ctx context.Context, r *AuditRequest) (*AuditReply, error) {
		return m.Audit(r)
	}))
	s.Handle("fragment.DropUser", rpc.Method(func(ctx context.Context, r *FragmentRequest) (*Empty, error) {
		return &Empty{}, m.DeleteUser(r.User)
	}))
}
