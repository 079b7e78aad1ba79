package clusterwide

// The clusterwide objects in a store every node reaches (Cassandra's
// clusterwide table, issue 15): the table is the hard state, and each node
// keeps a copy of it in memory, filled at start and read again when a peer
// shows it holds something else.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
)

// Table is the shared store of the objects (cassandra.Store): writes at
// the object's stamp, the newest stamp winning there as here, tombstones
// included; listed by kind.
type Table interface {
	PutObject(ctx context.Context, o Object) error
	ObjectKinds(ctx context.Context) ([]string, error)
	Objects(ctx context.Context, kind string) ([]Object, error)
	DeleteObject(ctx context.Context, name string, stamp replica.Stamp) error
}

// How a node learns of another node's change. The writer's digest changes
// at once; the membership gossips it within its meta interval (2 s,
// cluster.metaUpdateInterval), and a peer reads the table again at its
// next round (core's wideSyncInterval, 3 s) when a digest differs: a
// change reaches every live node within about 6 s.
const (
	// sharedReread is the backstop: the table is read again this often
	// even when every digest agrees, for what no digest shows: a write
	// whose node died between the table and its memory, `quill migrate`
	// into a running keyspace, a read at ONE that missed a write. A
	// minute keeps the cost (one read of the table) negligible.
	sharedReread = time.Minute
	// sharedReadTimeout bounds one read of the table in a round; a read
	// that fails is tried again the next round.
	sharedReadTimeout = 30 * time.Second
)

// Shared is the node's view of the objects of a shared Table. It
// implements Objects.
type Shared struct {
	view
	table Table

	// readMu makes one read of the table at a time; seen (the digests,
	// ours and a peer's, after the last read a difference with that peer
	// caused) and lastRead are guarded by it.
	readMu   sync.Mutex
	seen     map[cluster.NodeID][2]uint64
	lastRead time.Time
}

// OpenShared loads every object of the table, so the node serves nothing
// before it holds them.
func OpenShared(ctx context.Context, t Table, log *slog.Logger) (*Shared, error) {
	s := &Shared{view: newView(log), table: t, seen: map[cluster.NodeID][2]uint64{}}
	if _, err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Refresh reads the whole table and applies what is newer than the copy
// here (the change handler hears of each), returning how many. Objects
// missing from the table are kept: only a sweep of old tombstones removes
// rows, and each node sweeps its own copy.
func (s *Shared) Refresh(ctx context.Context) (int, error) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	return s.refreshLocked(ctx)
}

func (s *Shared) refreshLocked(ctx context.Context) (int, error) {
	kinds, err := s.table.ObjectKinds(ctx)
	if err != nil {
		return 0, fmt.Errorf("clusterwide objects: %w", err)
	}
	var all []Object
	for _, k := range kinds {
		objs, err := s.table.Objects(ctx, k)
		if err != nil {
			return 0, fmt.Errorf("clusterwide objects: %w", err)
		}
		all = append(all, objs...)
	}
	s.lastRead = time.Now()
	applied := s.merge(all)
	s.fire(applied)
	return len(applied), nil
}

// merge keeps each object that is newer than the one here (a bad row is
// skipped and logged) and returns those it kept.
func (s *view) merge(objs []Object) []Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var applied []Object
	for _, o := range objs {
		if ValidName(o.Name) != nil || o.Stamp.IsZero() || len(o.Data) > maxObjectBytes {
			s.log.Warn("clusterwide object refused: bad name, stamp or size", "name", o.Name, "bytes", len(o.Data))
			continue
		}
		if cur, ok := s.objects[o.Name]; ok && !cur.Stamp.Less(o.Stamp) {
			continue
		}
		s.objects[o.Name] = o
		applied = append(applied, o)
	}
	return applied
}

// Put implements Objects: the new version is written to the table (at the
// store's write consistency level) before Put returns, then applied here.
// Its stamp is w's clock, past the version held here, so it wins over
// every version this node has seen. The other nodes read it when they see
// this node's digest change; alive and policy (the native store's push)
// have nothing to do: the table is every node's. The acknowledging node is
// this one, whose stamp the object carries.
func (s *Shared) Put(ctx context.Context, w Writer, alive []cluster.NodeID, name string, data []byte, deleted bool, policy replica.Policy) ([]cluster.NodeID, error) {
	data, err := s.checkPut(name, data, deleted)
	if err != nil {
		return nil, err
	}
	stamp := w.Now()
	s.mu.Lock()
	if cur, ok := s.objects[name]; ok && !cur.Stamp.Less(stamp) {
		stamp.Clock = cur.Stamp.Clock + 1
	}
	s.mu.Unlock()
	o := Object{Name: name, Stamp: stamp, Deleted: deleted, Data: data}
	if err := s.table.PutObject(ctx, o); err != nil {
		return nil, fmt.Errorf("clusterwide object %s: %w", name, err)
	}
	s.fire(s.merge([]Object{o}))
	return []cluster.NodeID{stamp.Node}, nil
}

// Tend implements Objects: old tombstones are removed from the table and
// from here; the table is read again when a peer's digest differs from
// ours (differently from the last time it did), or sharedReread passed.
func (s *Shared) Tend(ctx context.Context, w Writer, self cluster.NodeID, peers []Peer, sweepBefore time.Time) {
	s.sweep(ctx, sweepBefore)
	s.readMu.Lock()
	defer s.readMu.Unlock()
	differ := Differing(self, s.Digest(), peers, s.seen)
	if len(differ) == 0 && time.Since(s.lastRead) < sharedReread {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, sharedReadTimeout)
	n, err := s.refreshLocked(rctx)
	cancel()
	if err != nil {
		s.log.Warn("clusterwide: reading the shared objects failed; the next round tries again", "err", err)
		return
	}
	mine := s.Digest()
	for _, p := range peers {
		if p.ID != self {
			s.seen[p.ID] = [2]uint64{mine, p.Digest}
		}
	}
	if n > 0 || len(differ) > 0 {
		s.log.Info("clusterwide: shared objects read again", "applied", n, "peers_differing", differ)
	}
}

// sweep removes the tombstones stamped before before: from the table (at
// the tombstone's stamp, so a newer version written since stays), then
// from here if no newer version came meanwhile. Every node sweeps the
// same ones; the table's delete is idempotent.
func (s *Shared) sweep(ctx context.Context, before time.Time) {
	gone := s.oldTombstones(before)
	swept := 0
	for _, o := range gone {
		if err := s.table.DeleteObject(ctx, o.Name, o.Stamp); err != nil {
			s.log.Warn("clusterwide: sweeping an old tombstone failed; the next round tries again", "name", o.Name, "err", err)
			continue
		}
		s.mu.Lock()
		if cur, ok := s.objects[o.Name]; ok && cur.Stamp == o.Stamp {
			delete(s.objects, o.Name)
			swept++
		}
		s.mu.Unlock()
	}
	if swept > 0 {
		s.log.Info("clusterwide: old tombstones swept", "count", swept)
	}
}
