package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/rpc"
)

// body fetches a message from one of the nodes that hold it (Porcupine
// §4.3: the retrieval proxy reads the least loaded live replica), trying the
// others if it fails.
func (p *Proxy) body(ctx context.Context, nodes []cluster.NodeID, user, id string) ([]byte, error) {
	if slices.Contains(nodes, p.Self) {
		if b, err := p.Boxes.Body(user, id); err == nil {
			return b, nil
		}
	}
	state := map[cluster.NodeID]string{}
	for _, mi := range p.Peers.Alive() {
		state[mi.ID] = mi.State
	}
	var cand []cluster.NodeID
	for _, n := range nodes {
		if _, live := state[n]; n != p.Self && live {
			cand = append(cand, n)
		}
	}
	// The least loaded first (Porcupine §5), suspect members last.
	sort.SliceStable(cand, func(i, j int) bool {
		si, sj := state[cand[i]] == "suspect", state[cand[j]] == "suspect"
		if si != sj {
			return sj
		}
		return p.Loads.Get(cand[i]).Pending < p.Loads.Get(cand[j]).Pending
	})
	err := fmt.Errorf("user %s message %s: no live replica among %v: %w", user, id, nodes, mailbox.ErrNoMessage)
	for i, n := range cand {
		// Each holder but the last gets its own deadline, so one that
		// hangs (paused, cut off) leaves time to ask the next.
		try, cancel := ctx, context.CancelFunc(func() {})
		if i < len(cand)-1 {
			try, cancel = context.WithTimeout(ctx, bodyTryTimeout)
		}
		var rep *mailbox.BodyReply
		rep, err = p.Boxes.On(p.Peers, n).Body(try, &mailbox.BodyRequest{User: user, ID: id})
		cancel()
		if err == nil {
			return rep.Raw, nil
		}
	}
	return nil, err
}

// bodyTryTimeout bounds one holder's answer to a body read when another
// holder is left to ask.
const bodyTryTimeout = rpc.DefaultTimeout

func (p *Proxy) openBody(ctx context.Context, nodes []cluster.NodeID, user, id string) (io.ReadCloser, error) {
	b, err := p.body(ctx, nodes, user, id)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}
