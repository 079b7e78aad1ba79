package queue

// The queue's service on the wire (proto/quill/v1/queue.proto): on the
// native store every live node lists the entries it holds for the
// cluster-wide view (Replicated.List); an action goes to the entry's
// leader (or, failing that, any node holding it, or on a shared store
// this one).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// callTimeout bounds one node's answer to a listing or an action.
const callTimeout = 10 * time.Second

// freshenTimeout bounds asking a replica for an entry's state before an
// attempt.
const freshenTimeout = 5 * time.Second

// Register exposes this node's queue to the others.
func (q *Queue) Register(r grpc.ServiceRegistrar) { nodepb.RegisterQueueServer(r, server{q: q}) }

type server struct {
	nodepb.UnimplementedQueueServer
	q *Queue
}

// List answers with every entry held here, or with one entry's state
// including a tombstone (so that a replica with an old state learns that
// the entry is done).
func (s server) List(ctx context.Context, r *nodepb.QueueListRequest) (*nodepb.QueueListReply, error) {
	rep := &nodepb.QueueListReply{}
	if r.Id != "" {
		if e, ok, err := s.q.Storage.Lookup(ctx, r.Id); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		} else if ok {
			rep.Entries = append(rep.Entries, e.toPB())
		}
		return rep, nil
	}
	// A shared store is listed by each node from the store itself
	// (Shared.List): only replicas are asked for what they hold.
	if n, ok := s.q.Storage.(*Replicated); ok {
		for _, e := range n.Store.List() {
			rep.Entries = append(rep.Entries, e.toPB())
		}
	}
	return rep, nil
}

func (s server) Act(ctx context.Context, r *nodepb.QueueActRequest) (*nodepb.QueueEntry, error) {
	if err := ValidID(r.Id); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	e, err := s.q.actHere(ctx, r.Id, r.Action)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, status.Error(codes.NotFound, err.Error())
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return e.toPB(), nil
}

func (q *Queue) actHere(ctx context.Context, id, action string) (*Entry, error) {
	switch action {
	case "retry":
		return q.Retry(ctx, id)
	case "delete":
		e, err := q.get(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := q.Delete(ctx, id); err != nil {
			return nil, err
		}
		e.Deleted = true
		return e, nil
	}
	return nil, fmt.Errorf("queue action %q: want retry or delete", action)
}

// Listing is the cluster's queue as a node sees it.
type Listing struct {
	Entries []*Entry `json:"entries"`
	// Unreachable names live nodes that did not answer within
	// cluster.FanOutWait, and why: entries held only there come from
	// their last answer (Stale), or are missing if they never answered.
	Unreachable map[cluster.NodeID]string `json:"unreachable,omitempty"`
	// Stale names the unreachable nodes whose last answer stands in, and
	// how old it is.
	Stale map[cluster.NodeID]*cluster.Stale `json:"stale,omitempty"`
	// Unavailable says why a shared store could not be read (the entries
	// are then missing).
	Unavailable string `json:"unavailable,omitempty"`
}

// ListAll returns the cluster's queue (id "" for all, else one entry's
// state), oldest entry first, from wherever the storage keeps it.
func (q *Queue) ListAll(ctx context.Context, id string) Listing { return q.Storage.List(ctx, id) }

// Act applies an operator's action ("retry", "delete") to an entry,
// wherever in the cluster it is: on its leader, or on another replica if
// the leader cannot be reached.
func (q *Queue) Act(ctx context.Context, id, action string) (*Entry, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	if action != "retry" && action != "delete" {
		return nil, fmt.Errorf("queue action %q: want retry or delete", action)
	}
	l := q.ListAll(ctx, id)
	if l.Unavailable != "" {
		return nil, fmt.Errorf("queue entry %s: %s", id, l.Unavailable)
	}
	if len(l.Entries) == 0 {
		return nil, fmt.Errorf("queue entry %s: %w", id, ErrNotFound)
	}
	e := l.Entries[0]
	alive := q.aliveSet()
	order := []cluster.NodeID{}
	if lead := q.Storage.Leader(e, alive); lead != "" {
		order = append(order, lead)
	}
	for _, n := range e.Replicas {
		if alive[n] && !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	if len(e.Replicas) == 0 && !slices.Contains(order, q.Self) {
		// A shared store: any node can act on it, this one if the
		// leader cannot be reached.
		order = append(order, q.Self)
	}
	var errs []error
	for _, n := range order {
		got, err := q.actOn(ctx, n, id, action)
		if err == nil {
			return got, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
	}
	return nil, fmt.Errorf("queue entry %s: %s on no replica: %w", id, action, errors.Join(errs...))
}

func (q *Queue) actOn(ctx context.Context, n cluster.NodeID, id, action string) (*Entry, error) {
	if n == q.Self {
		return q.actHere(ctx, id, action)
	}
	cc, err := q.Peers.Conn(n)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	p, err := nodepb.NewQueueClient(cc).Act(ctx, &nodepb.QueueActRequest{Id: id, Action: action})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("queue entry %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return fromPB(p), nil
}
