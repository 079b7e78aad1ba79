package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// FanOutWait bounds each node's answer when an operator's question goes
// to every node (the admin API's listings, the dashboard): they answer
// within a second while nodes are dying (issue 14), with what arrived in
// time, the last answer of each node that was late (marked stale) and the
// names of those that did not answer. A listing on a LAN takes
// milliseconds, tens on a loaded node; the other half of the second is
// for the answer's own work and for a busy machine: on 2 cores at a load
// average of 10, a trivial admin call was seen to take 450 ms.
const FanOutWait = 500 * time.Millisecond

// Stale marks figures that are a node's last answer rather than a fresh
// one: when it gave them and how long ago that was.
type Stale struct {
	AsOf time.Time `json:"as_of"`
	Age  float64   `json:"age_seconds"`
}

// StaleSince returns the mark of figures given at asOf, as seen at now.
func StaleSince(asOf, now time.Time) *Stale {
	return &Stale{AsOf: asOf, Age: now.Sub(asOf).Round(time.Millisecond).Seconds()}
}

// Answer is one node's answer to a question asked of every node.
type Answer[T any] struct {
	Node  NodeID
	Value T
	// Err says why the node gave no answer in time; Value is then its
	// last answer if Stale is set, the zero value if not.
	Err   error
	Stale *Stale
}

// Recall asks every node the same question at once and remembers each
// node's last answer, which stands in for a node that does not answer in
// time. The zero value is ready to use.
type Recall[T any] struct {
	mu   sync.Mutex
	last map[NodeID]recalled[T]
}

type recalled[T any] struct {
	v  T
	at time.Time
}

// Ask asks each of nodes with ask, all at once, each under a deadline of
// wait, and returns within wait (and what a handler that ignores its
// context keeps, no more than the time to notice): one Answer per node, in
// the order of nodes. A late answer still arrives afterwards and is kept
// for the next time.
func (r *Recall[T]) Ask(ctx context.Context, nodes []NodeID, wait time.Duration, ask func(context.Context, NodeID) (T, error)) []Answer[T] {
	type result struct {
		i   int
		v   T
		err error
	}
	results := make(chan result, len(nodes))
	for i, n := range nodes {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			v, err := ask(cctx, n)
			if err == nil {
				r.keep(n, v, time.Now())
			}
			results <- result{i, v, err}
		}()
	}
	out := make([]Answer[T], len(nodes))
	got := make([]bool, len(nodes))
	timer := time.NewTimer(wait)
	defer timer.Stop()
collect:
	for left := len(nodes); left > 0; left-- {
		select {
		case res := <-results:
			out[res.i] = Answer[T]{Node: nodes[res.i], Value: res.v, Err: res.err}
			got[res.i] = true
		case <-timer.C:
			break collect
		}
	}
	now := time.Now()
	for i, n := range nodes {
		if !got[i] {
			out[i] = Answer[T]{Node: n, Err: fmt.Errorf("node %s: no answer within %v", n, wait)}
		}
		if out[i].Err != nil {
			out[i].Value, out[i].Stale = r.recall(n, now)
		}
	}
	return out
}

func (r *Recall[T]) keep(n NodeID, v T, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[NodeID]recalled[T]{}
	}
	if at.After(r.last[n].at) {
		r.last[n] = recalled[T]{v: v, at: at}
	}
}

// recall returns a node's last answer and its stale mark (nil, and the
// zero value, if it never answered).
func (r *Recall[T]) recall(n NodeID, now time.Time) (T, *Stale) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.last[n]
	if !ok {
		var zero T
		return zero, nil
	}
	return l.v, StaleSince(l.at, now)
}
