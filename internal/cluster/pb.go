package cluster

import (
	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
)

// Conns gives the connection to another node for its generated service
// clients (cluster.Peers: by the node's gossiped RPC address).
type Conns interface {
	Conn(node NodeID) (grpc.ClientConnInterface, error)
}

// IDsToPB converts node ids for the wire.
func IDsToPB(ns []NodeID) []string {
	if len(ns) == 0 {
		return nil
	}
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n)
	}
	return out
}

// IDsFromPB converts node ids from the wire.
func IDsFromPB(ns []string) []NodeID {
	if len(ns) == 0 {
		return nil
	}
	out := make([]NodeID, len(ns))
	for i, n := range ns {
		out[i] = NodeID(n)
	}
	return out
}

// ToPB converts a member for the wire.
func (m Member) ToPB() *nodepb.Member { return &nodepb.Member{Id: string(m.ID), Boot: m.Boot} }

// MemberFromPB converts a member from the wire.
func MemberFromPB(p *nodepb.Member) Member {
	if p == nil {
		return Member{}
	}
	return Member{ID: NodeID(p.Id), Boot: p.Boot}
}
