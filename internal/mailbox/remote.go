package mailbox

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/rpc"
)

// Remote access to this node's fragments (Porcupine §2.2: the mailbox
// manager enables remote access to mailbox fragments). The mailbox's
// ordered writer on the user's manager node calls these; so do retrieval
// proxies for bodies.

// FragmentRequest names one cluster mailbox of a user.
type FragmentRequest struct {
	User        string `json:"user"`
	UIDValidity uint32 `json:"uidvalidity"`
}

// StoreAtRequest stores a message under allocated UIDs.
type StoreAtRequest struct {
	Places []Placed  `json:"places"`
	ID     string    `json:"id"`
	Raw    []byte    `json:"raw"`
	Date   time.Time `json:"date"`
}

// SetFlagsRequest applies decided flag changes.
type SetFlagsRequest struct {
	User        string       `json:"user"`
	UIDValidity uint32       `json:"uidvalidity"`
	Changes     []FlagChange `json:"changes"`
}

// UIDsRequest names messages of a cluster mailbox.
type UIDsRequest struct {
	User        string   `json:"user"`
	UIDValidity uint32   `json:"uidvalidity"`
	UIDs        []uint32 `json:"uids"`
}

// CopyAtRequest copies or moves messages into allocated places.
type CopyAtRequest struct {
	User        string   `json:"user"`
	UIDValidity uint32   `json:"uidvalidity"`
	UIDs        []uint32 `json:"uids"`
	Dest        []Placed `json:"dest"`
	Move        bool     `json:"move"`
}

// Empty is the reply of calls that return nothing.
type Empty struct{}

// Register exposes the fragment operations to other nodes.
func (m *Manager) Register(s *rpc.Server) {
	s.Handle("fragment.Get", rpc.Method(func(ctx context.Context, r *FragmentRequest) (*FragmentDigest, error) {
		return m.Fragment(r.User, r.UIDValidity)
	}))
	s.Handle("fragment.StoreAt", rpc.Method(func(ctx context.Context, r *StoreAtRequest) (*Empty, error) {
		return &Empty{}, m.StoreAt(r.Places, r.ID, r.Raw, r.Date)
	}))
	s.Handle("fragment.SetFlags", rpc.Method(func(ctx context.Context, r *SetFlagsRequest) (*Empty, error) {
		return &Empty{}, m.SetFlagsAt(r.User, r.UIDValidity, r.Changes)
	}))
	s.Handle("fragment.Expunge", rpc.Method(func(ctx context.Context, r *UIDsRequest) (*Empty, error) {
		_, err := m.ExpungeAt(r.User, r.UIDValidity, r.UIDs)
		return &Empty{}, err
	}))
	s.Handle("fragment.Copy", rpc.Method(func(ctx context.Context, r *CopyAtRequest) (*Empty, error) {
		return &Empty{}, m.CopyAt(r.User, r.UIDValidity, r.UIDs, r.Dest, r.Move)
	}))
	s.Handle("fragment.Drop", rpc.Method(func(ctx context.Context, r *FragmentRequest) (*Empty, error) {
		return &Empty{}, m.DropMailbox(r.User, r.UIDValidity)
	}))
	s.Handle("fragment.DropUser", rpc.Method(func(ctx context.Context, r *FragmentRequest) (*Empty, error) {
		return &Empty{}, m.DeleteUser(r.User)
	}))
}
