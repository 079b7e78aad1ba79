package cluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/rpc"
	"google.golang.org/grpc"
)

// Peers joins the membership view and the RPC client: the way every manager
// reaches the manager of the same kind on another node (Porcupine Fig. 2's
// dotted arrows).
type Peers struct {
	members atomic.Pointer[Membership]
	RPC     *rpc.Client
}

// SetMembership installs the membership manager once it has started.
func (p *Peers) SetMembership(m *Membership) { p.members.Store(m) }

// UserMap returns the current user map.
func (p *Peers) UserMap() UserMap {
	if m := p.members.Load(); m != nil {
		return m.UserMap()
	}
	return UserMap{}
}

// Alive returns the live members.
func (p *Peers) Alive() []MemberInfo {
	if m := p.members.Load(); m != nil {
		return m.Alive()
	}
	return nil
}

// degradedWindow is how long after a membership change that left a known
// node out answers that depend on every node (such as "no such user") stay
// provisional: long enough for a crashed node to be restarted, short enough
// that a node removed for good soon stops turning bounces into retries.
const degradedWindow = 10 * time.Minute

// Degraded reports whether a member this node knew is not alive now (dead,
// or cut off by a partition) and the live set changed within
// degradedWindow.
func (p *Peers) Degraded() bool {
	if m := p.members.Load(); m != nil {
		if time.Since(m.ChangedAt()) > degradedWindow {
			return false
		}
		for _, mi := range m.Members() {
			if mi.State != "alive" && mi.State != "suspect" {
				return true
			}
		}
	}
	return false
}

// Expected returns how many nodes the cluster has, counting those away
// (Membership.Expected); 1 before the membership has started.
func (p *Peers) Expected() int {
	if m := p.members.Load(); m != nil {
		return m.Expected()
	}
	return 1
}

// Domains returns the mail domains of the cluster's users.
func (p *Peers) Domains() map[string]bool {
	if m := p.members.Load(); m != nil {
		return m.Domains()
	}
	return nil
}

// ErrNotLive: a call was not sent because its node is not a live member
// in this node's view. Nothing happened there, so a call may always be
// tried again elsewhere. It is an rpc.ErrUnavailable.
var ErrNotLive = fmt.Errorf("not a live member: %w", rpc.ErrUnavailable)

// Conn returns the connection to a live (or suspect) member, for its
// generated service clients; a node that is not live is unavailable. A
// call on it is cut short, with an error wrapping rpc.ErrNodeGone, as soon
// as the membership stops counting that boot of the node live: a call to a
// node that hangs (paused, cut off) or is down (waiting for it to come
// back) ends when the node is declared dead, not at its deadline.
func (p *Peers) Conn(node NodeID) (grpc.ClientConnInterface, error) {
	m := p.members.Load()
	if m == nil {
		return nil, fmt.Errorf("node %s: %w: membership not started", node, rpc.ErrUnavailable)
	}
	life, mi, ok := m.Life(node)
	if !ok || mi.RPC == "" {
		return nil, fmt.Errorf("node %s: %w", node, ErrNotLive)
	}
	cc, err := p.RPC.Conn(mi.RPC)
	if err != nil {
		return nil, err
	}
	return lifeConn{cc: cc, life: life}, nil
}

// lifeConn is a connection whose calls end with the callee's life.
type lifeConn struct {
	cc   grpc.ClientConnInterface
	life context.Context
}

func (c lifeConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(c.life, func() { cancel(context.Cause(c.life)) })
	defer stop()
	err := c.cc.Invoke(ctx, method, args, reply, opts...)
	if err != nil && c.life.Err() != nil {
		return fmt.Errorf("%w (%v)", context.Cause(c.life), err)
	}
	return err
}

// NewStream is not tied to the callee's life (a stream outlives the call
// that opens it, so tying it would need its own end): the streams there
// are (a push of large bodies, a backup) end at their callers' deadlines.
func (c lifeConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cc.NewStream(ctx, desc, method, opts...)
}
