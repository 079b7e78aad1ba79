package queue

// The queue's service on the wire (proto/quill/v1/queue.proto) and the
// cluster-wide view built on it: every live node lists the entries it
// holds, the newest state of each wins, and an action goes to the entry's
// leader (or, failing that, any node holding it).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
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
		if e, ok := s.q.Store.lookup(r.Id); ok {
			rep.Entries = append(rep.Entries, e.toPB())
		}
		return rep, nil
	}
	for _, e := range s.q.Store.List() {
		rep.Entries = append(rep.Entries, e.toPB())
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
		e, ok := q.Store.Get(id)
		if !ok {
			return nil, fmt.Errorf("queue entry %s: %w", id, ErrNotFound)
		}
		if err := q.Delete(ctx, id); err != nil {
			return nil, err
		}
		e.Deleted = true
		return e, nil
	}
	return nil, fmt.Errorf("queue action %q: want retry or delete", action)
}

func (q *Queue) client(n cluster.NodeID) (nodepb.QueueClient, error) {
	cc, err := q.Peers.Conn(n)
	if err != nil {
		return nil, err
	}
	return nodepb.NewQueueClient(cc), nil
}

// listOn returns the entries node n holds (id "" for all).
func (q *Queue) listOn(ctx context.Context, n cluster.NodeID, id string) ([]*Entry, error) {
	if n == q.Self {
		if id != "" {
			if e, ok := q.Store.lookup(id); ok {
				return []*Entry{e}, nil
			}
			return nil, nil
		}
		return q.Store.List(), nil
	}
	c, err := q.client(n)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	rep, err := c.List(ctx, &nodepb.QueueListRequest{Id: id})
	if err != nil {
		return nil, err
	}
	out := make([]*Entry, 0, len(rep.Entries))
	for _, p := range rep.Entries {
		out = append(out, fromPB(p))
	}
	return out, nil
}

// Listing is the cluster's queue as the live nodes hold it.
type Listing struct {
	Entries []*Entry `json:"entries"`
	// Unreachable names live nodes that did not answer within
	// cluster.FanOutWait, and why: entries held only there come from
	// their last answer (Stale), or are missing if they never answered.
	Unreachable map[cluster.NodeID]string `json:"unreachable,omitempty"`
	// Stale names the unreachable nodes whose last answer stands in, and
	// how old it is.
	Stale map[cluster.NodeID]*cluster.Stale `json:"stale,omitempty"`
}

// ListAll asks every live node for the entries it holds (id "" for all),
// all at once and each within cluster.FanOutWait, and keeps the newest
// state of each, oldest entry first. For the whole queue, a node's last
// answer stands in for it when it is late; a single entry's state is
// always fresh.
func (q *Queue) ListAll(ctx context.Context, id string) Listing {
	nodes := q.Alive()
	if !slices.Contains(nodes, q.Self) {
		nodes = append(nodes, q.Self)
	}
	recall := &q.lists
	if id != "" {
		recall = &cluster.Recall[[]*Entry]{}
	}
	answers := recall.Ask(ctx, nodes, cluster.FanOutWait, func(ctx context.Context, n cluster.NodeID) ([]*Entry, error) {
		return q.listOn(ctx, n, id)
	})
	best := map[string]*Entry{}
	var l Listing
	for _, a := range answers {
		if a.Err != nil {
			if l.Unreachable == nil {
				l.Unreachable = map[cluster.NodeID]string{}
			}
			l.Unreachable[a.Node] = a.Err.Error()
		}
		if a.Stale != nil {
			if l.Stale == nil {
				l.Stale = map[cluster.NodeID]*cluster.Stale{}
			}
			l.Stale[a.Node] = a.Stale
		}
		for _, e := range a.Value {
			// A replica the repair moved away keeps a tombstone with
			// the stamp of the move: at equal stamps the live state
			// wins.
			if cur := best[e.ID]; cur == nil || cur.Stamp.Less(e.Stamp) || (cur.Stamp == e.Stamp && cur.Deleted && !e.Deleted) {
				best[e.ID] = e
			}
		}
	}
	for _, e := range best {
		if !e.Deleted { // done or deleted, whatever older copies say
			l.Entries = append(l.Entries, e)
		}
	}
	sort.Slice(l.Entries, func(i, j int) bool {
		a, b := l.Entries[i], l.Entries[j]
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.ID < b.ID
	})
	return l
}

// freshen asks the entry's other live replicas for its state and adopts
// a newer one; it reports whether it did. A leader calls it before each
// attempt: after a restart, a pause or a partition its own state may be
// older than what another replica did meanwhile (delivered, deleted),
// and the update log may not have caught it up yet. A replica that does
// not answer is passed over: delivery goes on (a repeat is possible, a
// loss is not).
func (q *Queue) freshen(ctx context.Context, e *Entry, alive map[cluster.NodeID]bool) bool {
	newest := e
	for _, n := range e.Replicas {
		if n == q.Self || !alive[n] {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, freshenTimeout)
		es, err := q.listOn(cctx, n, e.ID)
		cancel()
		if err != nil {
			q.Log.Info("queue: a replica did not say its state of an entry; going on", "id", e.ID, "replica", n, "err", err)
			continue
		}
		for _, o := range es {
			if newest.Stamp.Less(o.Stamp) {
				newest = o
			}
		}
	}
	if newest == e {
		return false
	}
	if err := q.Store.adopt(newest); err != nil {
		q.Log.Warn("queue: newer state of an entry not adopted", "id", e.ID, "err", err)
		return false
	}
	q.Log.Info("queue: adopted a newer state from a replica", "id", e.ID, "deleted", newest.Deleted, "origin", newest.Stamp.Node)
	return true
}

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
	if len(l.Entries) == 0 {
		return nil, fmt.Errorf("queue entry %s: %w", id, ErrNotFound)
	}
	e := l.Entries[0]
	alive := q.aliveSet()
	order := []cluster.NodeID{}
	if lead := Leader(e.Replicas, alive); lead != "" {
		order = append(order, lead)
	}
	for _, n := range e.Replicas {
		if alive[n] && !slices.Contains(order, n) {
			order = append(order, n)
		}
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
	c, err := q.client(n)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	p, err := c.Act(ctx, &nodepb.QueueActRequest{Id: id, Action: action})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("queue entry %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return fromPB(p), nil
}
