package proxy

import (
	"context"
	"errors"
	"testing"

	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
)

type members []cluster.MemberInfo

func (m members) Alive() []cluster.MemberInfo { return m }
func (m members) Degraded() bool              { return false }

// Conn is a connection on which a body read answers with the name of the
// node asked.
func (m members) Conn(node cluster.NodeID) (grpc.ClientConnInterface, error) {
	return nameConn(node), nil
}

type nameConn cluster.NodeID

func (c nameConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if r, ok := reply.(*nodepb.BodyReply); ok {
		r.Raw = []byte(c)
	}
	return nil
}

func (nameConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

func member(id cluster.NodeID, state string) cluster.MemberInfo {
	return cluster.MemberInfo{Member: cluster.Member{ID: id}, State: state}
}

// A body is read from a live holder before a suspect one, whatever their
// loads.
func TestBodyAsksSuspectHoldersLast(t *testing.T) {
	loads := balance.NewTracker()
	loads.Observe("c", balance.Load{Pending: 50})
	boxes := mailbox.New(nil)
	boxes.Self = "a"
	p := &Proxy{Self: "a", Loads: loads, Boxes: boxes, Peers: members{member("a", "alive"), member("b", "suspect"), member("c", "alive")}}
	b, err := p.body(context.Background(), []cluster.NodeID{"b", "c"}, "u@example.org", "m1")
	if err != nil || string(b) != "c" {
		t.Fatalf("read from %q (%v), want the live holder c, not the suspect b", b, err)
	}
}
