package proxy

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/rpc"
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

// stillHolder is a Fragment service that never answers a body read: a
// holder that took the call and then stood still (SIGSTOP, a cut cable).
type stillHolder struct {
	nodepb.UnimplementedFragmentServer
}

func (stillHolder) Body(ctx context.Context, _ *nodepb.BodyRequest) (*nodepb.BodyReply, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// namedHolder answers every body read with its name.
type namedHolder struct {
	nodepb.UnimplementedFragmentServer
	name string
}

func (h namedHolder) Body(context.Context, *nodepb.BodyRequest) (*nodepb.BodyReply, error) {
	return &nodepb.BodyReply{Raw: []byte(h.name)}, nil
}

// rpcMembers reaches each member's RPC server over real gRPC.
type rpcMembers struct {
	members
	addr map[cluster.NodeID]string
	c    *rpc.Client
}

func (m rpcMembers) Conn(node cluster.NodeID) (grpc.ClientConnInterface, error) {
	return m.c.Conn(m.addr[node])
}

func serveFragments(t *testing.T, svc nodepb.FragmentServer) string {
	s := rpc.NewServer(func() rpc.Load { return rpc.Load{} })
	nodepb.RegisterFragmentServer(s.Registrar(), svc)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// A holder that does not answer a body read is not waited for: the next
// holder is asked as well after bodyHedge, and the still one is asked last
// by the next reads.
func TestBodyDoesNotWaitForAStillHolder(t *testing.T) {
	c := rpc.NewClient()
	defer c.Close()
	peers := rpcMembers{members: members{member("a", "alive"), member("b", "alive"), member("c", "alive")},
		addr: map[cluster.NodeID]string{"b": serveFragments(t, stillHolder{}), "c": serveFragments(t, namedHolder{name: "c"})}, c: c}
	loads := balance.NewTracker()
	loads.Observe("c", balance.Load{Pending: 50}) // b, the still one, looks the better choice
	boxes := mailbox.New(nil)
	boxes.Self = "a"
	p := &Proxy{Self: "a", Loads: loads, Boxes: boxes, Peers: peers}
	holders := []cluster.NodeID{"b", "c"}
	if got := p.bodyOrder(holders, time.Now()); !slices.Equal(got, holders) {
		t.Fatalf("first read asks %v, want b (least loaded) first", got)
	}
	const limit = 30 * time.Second // what the read may wait without the hedge
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	b, err := p.body(ctx, holders, "u@example.org", "m1")
	if err != nil || string(b) != "c" {
		t.Fatalf("read gave %q (%v), want c's answer", b, err)
	}
	if took := time.Since(start); took > limit/3 {
		t.Fatalf("read waited %v for the still holder", took)
	}
	if got := p.bodyOrder(holders, time.Now()); !slices.Equal(got, []cluster.NodeID{"c", "b"}) {
		t.Fatalf("after b was late, reads ask %v, want c first", got)
	}
	if got := p.bodyOrder(holders, time.Now().Add(lateFor+time.Second)); !slices.Equal(got, holders) {
		t.Fatalf("%v after b was late, reads ask %v, want b first again", lateFor, got)
	}
}

// A message none of whose holders is live is unavailable for now, not
// gone: IMAP must not answer it as expunged (NO [EXPUNGEISSUED]).
func TestBodyWithNoLiveHolderIsTemporary(t *testing.T) {
	boxes := mailbox.New(nil)
	boxes.Self = "a"
	p := &Proxy{Self: "a", Loads: balance.NewTracker(), Boxes: boxes, Peers: members{member("a", "alive")}} // b is not live
	_, err := p.body(context.Background(), []cluster.NodeID{"b"}, "u@example.org", "m1")
	if !errors.Is(err, rpc.ErrUnavailable) || errors.Is(err, mailbox.ErrNoMessage) {
		t.Fatalf("read with every holder down: %v, want a temporary failure", err)
	}
}
