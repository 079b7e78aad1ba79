package queue

// The native store of the queue (Storage): each entry is an object of the
// replication manager with R replicas the load balancer chose (Store is
// this node's replica of those it holds), run by the first live node of
// its replica set; the cluster's queue is what every live node lists,
// the newest state of each entry winning.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/replica"
)

// Replicated is the queue's native Storage.
type Replicated struct {
	Self   cluster.NodeID
	Store  *Store
	Repl   Writer
	Placer Placer
	Peers  cluster.Conns
	// Alive lists the live nodes, this one included.
	Alive func() []cluster.NodeID
	Log   *slog.Logger
	// lists keeps each node's last answer to the cluster-wide listing
	// (List), which stands in for a node that is late.
	lists cluster.Recall[[]*Entry]
}

func (r *Replicated) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// Place chooses the new entry's replica set: this node and want-1 others
// the balancer picks, all in the user's island (Archipelago's one-island
// principle: the entry is the user's state); when this node is of another
// island, want nodes of the user's.
func (r *Replicated) Place(user string, want int, policy replica.Policy) ([]cluster.NodeID, error) {
	set := []cluster.NodeID{r.Self}
	if r.Placer != nil {
		b := cluster.Bucket(user)
		if !r.Placer.May(b, r.Self) {
			set = nil
		}
		if more := want - len(set); more > 0 {
			set = append(set, r.Placer.Replicas(b, set, more)...)
		}
	}
	if len(set) < policy.Need(want) {
		return nil, fmt.Errorf("queue for %s: write policy %s needs %d of %d replicas, %d live nodes to choose from: %w",
			user, policy, policy.Need(want), want, len(set), proxy.ErrTryLater)
	}
	slices.Sort(set)
	return set, nil
}

// Write sends e's new state to its replicas through the replication
// manager.
func (r *Replicated) Write(ctx context.Context, e *Entry, raw []byte, policy replica.Policy) error {
	return write(ctx, r.Repl, e, raw, e.Replicas, policy)
}

// Lookup returns this node's replica of the entry.
func (r *Replicated) Lookup(_ context.Context, id string) (*Entry, bool, error) {
	e, ok := r.Store.lookup(id)
	return e, ok, nil
}

// Body returns the message of an entry held here.
func (r *Replicated) Body(_ context.Context, id string) ([]byte, error) { return r.Store.Body(id) }

// Due picks among the entries held here those this node leads.
func (r *Replicated) Due(_ context.Context, alive map[cluster.NodeID]bool, pick func(e *Entry) bool) ([]string, int) {
	return r.Store.Due(func(e *Entry) bool { return Leader(e.Replicas, alive) == r.Self && pick(e) })
}

// Leader is the first live node of the entry's replica set.
func (r *Replicated) Leader(e *Entry, alive map[cluster.NodeID]bool) cluster.NodeID {
	return Leader(e.Replicas, alive)
}

// Sweep forgets this node's old tombstones.
func (r *Replicated) Sweep(_ context.Context, before time.Time) (int, error) {
	return r.Store.Sweep(before)
}

// SetOnChange hears every entry applied here.
func (r *Replicated) SetOnChange(f func()) { r.Store.SetOnChange(f) }

func (r *Replicated) client(n cluster.NodeID) (nodepb.QueueClient, error) {
	cc, err := r.Peers.Conn(n)
	if err != nil {
		return nil, err
	}
	return nodepb.NewQueueClient(cc), nil
}

// listOn returns the entries node n holds (id "" for all).
func (r *Replicated) listOn(ctx context.Context, n cluster.NodeID, id string) ([]*Entry, error) {
	if n == r.Self {
		if id != "" {
			if e, ok := r.Store.lookup(id); ok {
				return []*Entry{e}, nil
			}
			return nil, nil
		}
		return r.Store.List(), nil
	}
	c, err := r.client(n)
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

// List asks every live node for the entries it holds (id "" for all),
// all at once and each within cluster.FanOutWait, and keeps the newest
// state of each, oldest entry first. For the whole queue, a node's last
// answer stands in for it when it is late; a single entry's state is
// always fresh.
func (r *Replicated) List(ctx context.Context, id string) Listing {
	nodes := r.Alive()
	if !slices.Contains(nodes, r.Self) {
		nodes = append(nodes, r.Self)
	}
	recall := &r.lists
	if id != "" {
		recall = &cluster.Recall[[]*Entry]{}
	}
	answers := recall.Ask(ctx, nodes, cluster.FanOutWait, func(ctx context.Context, n cluster.NodeID) ([]*Entry, error) {
		return r.listOn(ctx, n, id)
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
	sortEntries(l.Entries)
	return l
}

// sortEntries orders entries oldest first, then by id.
func sortEntries(es []*Entry) {
	sort.Slice(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.ID < b.ID
	})
}

// Fresh asks the entry's other live replicas for its state and adopts a
// newer one; it reports whether it did. A leader calls it before each
// attempt: after a restart, a pause or a partition its own state may be
// older than what another replica did meanwhile (delivered, deleted),
// and the update log may not have caught it up yet. A replica that does
// not answer is passed over: delivery goes on (a repeat is possible, a
// loss is not).
func (r *Replicated) Fresh(ctx context.Context, e *Entry, alive map[cluster.NodeID]bool) bool {
	newest := e
	for _, n := range e.Replicas {
		if n == r.Self || !alive[n] {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, freshenTimeout)
		es, err := r.listOn(cctx, n, e.ID)
		cancel()
		if err != nil {
			r.log().Info("queue: a replica did not say its state of an entry; going on", "id", e.ID, "replica", n, "err", err)
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
	if err := r.Store.adopt(newest); err != nil {
		r.log().Warn("queue: newer state of an entry not adopted", "id", e.ID, "err", err)
		return false
	}
	r.log().Info("queue: adopted a newer state from a replica", "id", e.ID, "deleted", newest.Deleted, "origin", newest.Stamp.Node)
	return true
}

// Rehome gives entries held here new replica sets (the repair found them
// short of replicas, or outside their user's island): a new state of each
// goes to the new set with its message, and to the replicas it leaves,
// which drop their copy. A move planned on the current set (Move.From: it
// leaves live replicas, as when an island table change moved the user)
// first writes the entry to the old and new sets together, held by every
// one durably, so the leaving replicas drop their copies only once the
// new ones hold it (as the writer's moves do, writer/rebalance.go).
func (r *Replicated) Rehome(ctx context.Context, moves []replica.Move) error {
	for _, mv := range moves {
		id, _ := IDOf(mv.Object)
		e, ok := r.Store.Get(id)
		if !ok {
			continue // done or deleted meanwhile
		}
		body, err := r.Store.Body(id)
		if err != nil {
			return err
		}
		if len(mv.From) > 0 {
			if !cluster.SameNodes(e.Replicas, mv.From) {
				continue // moved since it was planned: planned again on a fresh scan
			}
			both := *e
			both.Replicas = cluster.NodeSet(append(slices.Clone(mv.From), mv.Replicas...))
			if err := write(ctx, r.Repl, &both, body, both.Replicas, replica.All); err != nil {
				return err
			}
		}
		e.Replicas = slices.Clone(mv.Replicas)
		slices.Sort(e.Replicas)
		targets := append(slices.Clone(e.Replicas), mv.Gone...)
		if err := write(ctx, r.Repl, e, body, targets, replica.One); err != nil {
			return err
		}
		r.log().Info("queue entry re-homed", "id", id, "replicas", e.Replicas, "gone", mv.Gone)
	}
	return nil
}
