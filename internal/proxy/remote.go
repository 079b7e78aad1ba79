package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/rpc"
)

// bodyHedge is how long a body read waits for one holder before asking the
// next one too (the first answer wins). A read takes milliseconds on a LAN,
// tens under load, so a healthy holder is seldom asked twice; a holder
// that stands still (paused, cut off, its connection waiting for a node
// that went down) costs the read this much, not the time the membership
// takes to declare it dead.
const bodyHedge = 500 * time.Millisecond

// lateFor is how long a holder that let a read wait past bodyHedge is
// asked after the others (like a suspect member), so that a FETCH of many
// messages waits for it once, not once per message. An answer from it
// ends the mark early.
const lateFor = 10 * time.Second

// late remembers the holders that let a body read wait past bodyHedge.
type late struct {
	mu    sync.Mutex
	until map[cluster.NodeID]time.Time
}

func (l *late) mark(n cluster.NodeID, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until == nil {
		l.until = map[cluster.NodeID]time.Time{}
	}
	l.until[n] = now.Add(lateFor)
}

func (l *late) clear(n cluster.NodeID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.until, n)
}

func (l *late) is(n cluster.NodeID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Before(l.until[n])
}

// body fetches a message from one of the nodes that hold it (Porcupine
// §4.3: the retrieval proxy reads the least loaded live replica). A holder
// that fails is followed by the next at once, one that is slow to answer
// by the next as well after bodyHedge. The message is gone
// (mailbox.ErrNoMessage, which IMAP answers as expunged) only when every
// holder asked says so; a holder that could not answer makes it a
// temporary failure, as does having no live holder at all.
func (p *Proxy) body(ctx context.Context, nodes []cluster.NodeID, user, id string) ([]byte, error) {
	if p.Shared != nil {
		return p.Shared.Body(ctx, user, id)
	}
	// gone is the last holder's word that it does not have the message,
	// failed the last holder's that could not answer.
	var gone, failed error
	note := func(err error) {
		if errors.Is(err, mailbox.ErrNoMessage) {
			gone = err
		} else {
			failed = err
		}
	}
	if slices.Contains(nodes, p.Self) {
		b, err := p.Boxes.Body(user, id)
		if err == nil {
			return b, nil
		}
		note(err)
	}
	cand := p.bodyOrder(nodes, time.Now())
	if len(cand) == 0 {
		if gone != nil && len(nodes) == 1 {
			return nil, gone // held here only, and not here
		}
		return nil, fmt.Errorf("user %s message %s: no live replica among %v: %w", user, id, nodes, rpc.ErrUnavailable)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the reads still running once one has answered
	type answer struct {
		node cluster.NodeID
		raw  []byte
		err  error
	}
	answers := make(chan answer, len(cand))
	waiting := map[cluster.NodeID]bool{}
	next := 0
	ask := func() {
		n := cand[next]
		next++
		waiting[n] = true
		go func() {
			rep, err := p.Boxes.On(p.Peers, n).Body(ctx, &mailbox.BodyRequest{User: user, ID: id})
			a := answer{node: n, err: err}
			if err == nil {
				a.raw = rep.Raw
			}
			answers <- a
		}()
	}
	ask()
	hedge := time.NewTimer(bodyHedge)
	defer hedge.Stop()
	for len(waiting) > 0 {
		select {
		case a := <-answers:
			delete(waiting, a.node)
			p.late.clear(a.node)
			if a.err == nil {
				return a.raw, nil
			}
			note(a.err)
			if next < len(cand) {
				ask()
				hedge.Reset(bodyHedge)
			}
		case now := <-hedge.C:
			for n := range waiting {
				p.late.mark(n, now)
			}
			if next < len(cand) {
				ask()
				hedge.Reset(bodyHedge)
			}
		}
	}
	if failed != nil {
		return nil, failed
	}
	return nil, gone
}

// bodyOrder returns the live holders other than this node in the order a
// body read asks them: the least loaded first (Porcupine §5), suspect
// members and holders that were late lately last.
func (p *Proxy) bodyOrder(nodes []cluster.NodeID, now time.Time) []cluster.NodeID {
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
	last := func(n cluster.NodeID) bool { return state[n] == "suspect" || p.late.is(n, now) }
	sort.SliceStable(cand, func(i, j int) bool {
		if li, lj := last(cand[i]), last(cand[j]); li != lj {
			return lj
		}
		return p.Loads.Get(cand[i]).Pending < p.Loads.Get(cand[j]).Pending
	})
	return cand
}

func (p *Proxy) openBody(ctx context.Context, nodes []cluster.NodeID, user, id string) (io.ReadCloser, error) {
	if p.Shared != nil {
		// Chunk by chunk: a large message is never held whole.
		r, _, err := p.Shared.OpenBody(ctx, user, id)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(r), nil
	}
	b, err := p.body(ctx, nodes, user, id)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}
