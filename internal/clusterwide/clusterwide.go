// Package clusterwide keeps the objects every node holds a replica of: the
// cluster's TLS certificates (issue 11), the domains' DKIM keys and
// inbound policies, the served domains and their aliases. They are hard state in Porcupine's sense (§2.2: lost only with
// every replica) but, unlike a user's profile, each node needs them to
// serve any session, so every node keeps one.
//
// Changes travel as updates of the replication manager (§4.2–4.4), kind
// "w", ordered by their HLC stamp: a change is logged and applied here and
// pushed to every live node, and the update log carries it to the nodes
// that were away. A node the change never named (one that joined later, or
// was replaced) is caught up by anti-entropy: each node gossips a digest of
// what it holds (cluster.NodeMeta.State), and a node that sees a peer with
// another digest pushes it everything it holds; applying is idempotent and
// the newer stamp wins, so two nodes that each changed something converge
// on the union. Nothing here is written by hand that a library does: the
// transport, log and gossip are Quill's own managers.
//
// On Cassandra (issue 15, docs/cassandra.md) the objects live in the
// keyspace instead, so a front end keeps none of them in its data
// directory: Shared (shared.go) writes a change there before it is
// acknowledged and re-reads the table when a peer gossips another digest.
// Both are an Objects, the seam the rest of the node uses; each keeps the
// whole set in memory (view), so a RCPT or a TLS handshake reads it
// without I/O.
package clusterwide

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
	"google.golang.org/protobuf/proto"
)

// Kind is the replication manager's name for clusterwide objects.
const Kind = "w"

// maxObjectBytes bounds one object: a certificate chain and key are a few
// KB; anything far larger from the network is refused.
const maxObjectBytes = 1 << 20

// syncTimeout bounds one anti-entropy push to one peer.
const syncTimeout = 10 * time.Second

// Object is one clusterwide object.
type Object struct {
	Name    string
	Stamp   replica.Stamp
	Deleted bool
	Data    []byte
}

// Writer is what the store needs of the replication manager.
type Writer interface {
	Write(ctx context.Context, req *replica.WriteRequest) (*replica.WriteReply, error)
	Now() replica.Stamp
}

// Objects is a node's clusterwide objects as the rest of the node sees
// them: read from memory, changed by Put, tended by a round every few
// seconds. Store (the native replicas) and Shared (Cassandra) implement it.
type Objects interface {
	// Get returns an object that is not deleted.
	Get(name string) (Object, bool)
	// List returns the live objects whose names start with prefix, by name.
	List(prefix string) []Object
	// Put makes a new version of an object (deleted: its tombstone),
	// stamped by w's clock, and returns once it is durable as policy asks,
	// with the nodes that acknowledged it.
	Put(ctx context.Context, w Writer, alive []cluster.NodeID, name string, data []byte, deleted bool, policy replica.Policy) ([]cluster.NodeID, error)
	// OnChange adds a listener hearing of every object applied here (the
	// node's certificates, the island table: each its own).
	OnChange(f func(Object))
	// Digest sums up the objects held here, for gossip.
	Digest() uint64
	// Tend is one round of upkeep, given the live peers' gossiped digests:
	// old tombstones swept, and the objects brought level with the peers'.
	Tend(ctx context.Context, w Writer, self cluster.NodeID, peers []Peer, sweepBefore time.Time)
}

// view is the objects held in memory, the same on both stores: what Get,
// List and Digest read, and what hears of each change.
type view struct {
	log *slog.Logger
	// onChange hear of every object applied here (from this node or a
	// peer), outside the store's lock (OnChange); replaced whole when one
	// is added, so applying reads it without a lock.
	onChange atomic.Pointer[[]func(Object)]

	mu      sync.Mutex
	objects map[string]Object
}

func newView(log *slog.Logger) view {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return view{log: log, objects: map[string]Object{}}
}

// Store is this node's replica of the clusterwide objects. It implements
// replica.Handler for Kind.
type Store struct {
	view
	db *store.DB
	// pushed remembers, per peer, the digests (ours, theirs) of the last
	// anti-entropy push, so a difference is pushed once, not every round.
	// Guarded by mu.
	pushed map[cluster.NodeID][2]uint64
}

// Open loads the objects this node holds.
func Open(db *store.DB, log *slog.Logger) (*Store, error) {
	s := &Store{view: newView(log), db: db, pushed: map[cluster.NodeID][2]uint64{}}
	it, err := db.PrefixIter(nil, store.KindPrefix(store.KindWide))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		o, err := decode(it.Value())
		if err != nil {
			return nil, fmt.Errorf("clusterwide object %q: corrupt: %w", it.Key()[1:], err)
		}
		s.objects[o.Name] = o
	}
	return s, nil
}

func key(name string) []byte { return append(store.KindPrefix(store.KindWide), name...) }

func objectName(name string) string { return Kind + "/" + name }

func encode(o Object) ([]byte, error) {
	return proto.Marshal(&nodepb.WideObject{Name: o.Name, Version: uint64(o.Stamp.Clock), Origin: string(o.Stamp.Node),
		Deleted: o.Deleted, Data: o.Data})
}

func decode(b []byte) (Object, error) {
	var w nodepb.WideObject
	if err := proto.Unmarshal(b, &w); err != nil {
		return Object{}, err
	}
	return Object{Name: w.Name, Stamp: replica.Stamp{Clock: hlc.Timestamp(w.Version), Node: cluster.NodeID(w.Origin)},
		Deleted: w.Deleted, Data: w.Data}, nil
}

// ValidName checks an object's name: a kind prefix and a name, printable,
// without spaces.
func ValidName(name string) error {
	kind, rest, ok := strings.Cut(name, "/")
	if !ok || kind == "" || rest == "" || len(name) > 255 {
		return fmt.Errorf("clusterwide object name %q: want kind/name, at most 255 bytes", name)
	}
	for _, r := range name {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("clusterwide object name %q: control character or space", name)
		}
	}
	return nil
}

// OnChange adds a listener hearing of every object applied here. It may
// be added while peers already push: applying reads the list atomically.
func (s *view) OnChange(f func(Object)) {
	for {
		old := s.onChange.Load()
		var next []func(Object)
		if old != nil {
			next = slices.Clone(*old)
		}
		next = append(next, f)
		if s.onChange.CompareAndSwap(old, &next) {
			return
		}
	}
}

// Get returns an object that is not deleted.
func (s *view) Get(name string) (Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[name]
	return o, ok && !o.Deleted
}

// List returns the objects whose names start with prefix, deleted ones
// left out, sorted by name.
func (s *view) List(prefix string) []Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Object
	for _, o := range s.objects {
		if !o.Deleted && strings.HasPrefix(o.Name, prefix) {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// UpdateOf returns the replication update that makes o the object's state
// on targets, at o's own stamp: how quill migrate writes an object copied
// from another store through this handler.
func UpdateOf(o Object, targets []cluster.NodeID) (*replica.Update, error) {
	b, err := encode(o)
	if err != nil {
		return nil, err
	}
	return &replica.Update{Object: objectName(o.Name), Stamp: o.Stamp, Targets: targets, Data: b}, nil
}

// All returns every object held here, tombstones included, sorted by
// name: what quill migrate merges across nodes.
func (s *view) All() []Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Object, 0, len(s.objects))
	for _, o := range s.objects {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Digest sums up what this node holds (names and stamps, tombstones
// included) for gossip: equal digests mean nothing to push.
func (s *view) Digest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.digestLocked()
}

func (s *view) digestLocked() uint64 {
	if len(s.objects) == 0 {
		return 0
	}
	names := make([]string, 0, len(s.objects))
	for n := range s.objects {
		names = append(names, n)
	}
	slices.Sort(names)
	h := fnv.New64a()
	for _, n := range names {
		o := s.objects[n]
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", n, o.Stamp.Clock, o.Stamp.Node)
	}
	return h.Sum64() | 1 // never 0, which means "holds nothing"
}

// Put makes a new version of an object (or, with deleted, its tombstone)
// and writes it to every live node. It returns once policy's share of
// them hold it durably (replica.One: this node); the nodes that did not
// acknowledge in time get it from the update log or, if they were not
// named, from anti-entropy.
func (s *Store) Put(ctx context.Context, w Writer, alive []cluster.NodeID, name string, data []byte, deleted bool, policy replica.Policy) (acked []cluster.NodeID, err error) {
	data, err = s.checkPut(name, data, deleted)
	if err != nil {
		return nil, err
	}
	o := Object{Name: name, Stamp: w.Now(), Deleted: deleted, Data: data}
	b, err := encode(o)
	if err != nil {
		return nil, err
	}
	u := &replica.Update{Object: objectName(name), Stamp: o.Stamp, Targets: alive, Data: b}
	rep, err := w.Write(ctx, &replica.WriteRequest{Updates: []*replica.Update{u}, Policy: policy})
	if rep != nil {
		acked = rep.Acked
	}
	if err != nil {
		return acked, fmt.Errorf("clusterwide object %s: %w", name, err)
	}
	return acked, nil
}

// checkPut checks a change before it is made: a valid name, a bounded
// size, and for a delete an object to delete. It returns the data to store
// (none for a tombstone).
func (s *view) checkPut(name string, data []byte, deleted bool) ([]byte, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if len(data) > maxObjectBytes {
		return nil, fmt.Errorf("clusterwide object %s: %d bytes, over the %d-byte limit", name, len(data), maxObjectBytes)
	}
	if deleted {
		if _, ok := s.Get(name); !ok {
			return nil, fmt.Errorf("clusterwide object %s: %w", name, ErrNotFound)
		}
		return nil, nil
	}
	return data, nil
}

// fire tells the change handler of objects applied here, outside the lock.
func (s *view) fire(applied []Object) {
	on := s.onChange.Load()
	for _, o := range applied {
		s.log.Info("clusterwide object applied", "name", o.Name, "deleted", o.Deleted, "origin", o.Stamp.Node)
		if on != nil {
			for _, f := range *on {
				f(o)
			}
		}
	}
}

// oldTombstones lists the tombstones stamped before before.
func (s *view) oldTombstones(before time.Time) []Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.oldTombstonesLocked(before)
}

func (s *view) oldTombstonesLocked(before time.Time) []Object {
	var gone []Object
	for _, o := range s.objects {
		if o.Deleted && o.Stamp.Clock.Wall().Before(before) {
			gone = append(gone, o)
		}
	}
	return gone
}

// Tend implements Objects: the tombstones older than sweepBefore are
// swept, and the peers whose digest differs are caught up (Sync).
func (s *Store) Tend(ctx context.Context, w Writer, self cluster.NodeID, peers []Peer, sweepBefore time.Time) {
	if n, err := s.Sweep(sweepBefore); err != nil {
		s.log.Warn("clusterwide: sweeping old tombstones failed", "err", err)
	} else if n > 0 {
		s.log.Info("clusterwide: old tombstones swept", "count", n)
	}
	s.Sync(ctx, w, self, peers)
}

// Sweep forgets the tombstones older than before (the update log's
// maximum age: a node away longer rejoins as a new one, so no node can
// still hold the deleted object). Each node sweeps its own; digests agree
// again once every node has swept the same ones.
func (s *Store) Sweep(before time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gone := s.oldTombstonesLocked(before)
	if len(gone) == 0 {
		return 0, nil
	}
	keys := make([][]byte, len(gone))
	for i, o := range gone {
		keys[i] = key(o.Name)
	}
	if err := s.db.DeleteAll(keys, store.NoSync); err != nil { // lost in a crash: swept again
		return 0, err
	}
	for _, o := range gone {
		delete(s.objects, o.Name)
	}
	return len(gone), nil
}

// ErrNotFound is returned for an object this node does not hold.
var ErrNotFound = errors.New("no such object")

// Apply implements replica.Handler: each update is a whole object, kept
// when its stamp is newer than the one here.
func (s *Store) Apply(ups []*replica.Update, logw func(b *store.Batch, outs []replica.Outcome) error) ([]replica.Outcome, error) {
	s.mu.Lock()
	b := s.db.NewBatch()
	defer b.Close()
	outs := make([]replica.Outcome, len(ups))
	var applied []Object
	next := map[string]Object{}
	for i, u := range ups {
		o, err := decode(u.Data)
		if err != nil || len(u.Data) > maxObjectBytes+1024 || ValidName(o.Name) != nil || u.Object != objectName(o.Name) || o.Stamp.IsZero() {
			outs[i] = replica.Failed // bad input from the network: refused
			continue
		}
		cur, ok := next[o.Name]
		if !ok {
			cur, ok = s.objects[o.Name]
		}
		if ok && !cur.Stamp.Less(o.Stamp) {
			outs[i] = replica.Stale
			continue
		}
		if err := b.Set(key(o.Name), u.Data); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		next[o.Name] = o
		applied = append(applied, o)
		outs[i] = replica.Applied
	}
	if logw != nil {
		if err := logw(b, outs); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	if err := b.Commit(store.Sync); err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("write %d clusterwide objects: %w", len(ups), err)
	}
	for n, o := range next {
		s.objects[n] = o
	}
	s.mu.Unlock()
	s.fire(applied)
	return outs, nil
}

// Fill implements replica.Handler: an update carries the whole object.
func (s *Store) Fill(u *replica.Update) error { return nil }

// Peer is what anti-entropy needs to know of a live peer.
type Peer struct {
	ID     cluster.NodeID
	Digest uint64
}

// NeedPush decides, without I/O, which peers to push everything to: those
// whose digest differs from ours and differed differently at the last push.
func NeedPush(self cluster.NodeID, mine uint64, peers []Peer, pushed map[cluster.NodeID][2]uint64) []cluster.NodeID {
	if mine == 0 {
		return nil
	}
	return Differing(self, mine, peers, pushed)
}

// Differing decides, without I/O, which peers hold something else than
// this node (another digest) and held something else at the last catch-up
// with them (done: the digests, ours and theirs, after it), so one
// difference is acted on once, not every round.
func Differing(self cluster.NodeID, mine uint64, peers []Peer, done map[cluster.NodeID][2]uint64) []cluster.NodeID {
	var out []cluster.NodeID
	for _, p := range peers {
		if p.ID == self || p.Digest == mine || done[p.ID] == [2]uint64{mine, p.Digest} {
			continue
		}
		out = append(out, p.ID)
	}
	return out
}

// Sync pushes everything this node holds to each live peer whose digest
// differs (anti-entropy). Called every gossip round; each push is bounded
// by syncTimeout, and a failed one is tried again the next round.
func (s *Store) Sync(ctx context.Context, w Writer, self cluster.NodeID, peers []Peer) {
	s.mu.Lock()
	mine := s.digestLocked()
	targets := NeedPush(self, mine, peers, s.pushed)
	var ups []*replica.Update
	if len(targets) > 0 {
		for _, o := range s.objects {
			b, err := encode(o)
			if err != nil {
				continue
			}
			ups = append(ups, &replica.Update{Object: objectName(o.Name), Stamp: o.Stamp, Data: b})
		}
	}
	s.mu.Unlock()
	for _, t := range targets {
		batch := make([]*replica.Update, len(ups))
		for i, u := range ups {
			c := *u
			c.Targets = []cluster.NodeID{t}
			batch[i] = &c
		}
		cctx, cancel := context.WithTimeout(ctx, syncTimeout)
		_, err := w.Write(cctx, &replica.WriteRequest{Updates: batch, Policy: replica.All})
		cancel()
		if err != nil {
			s.log.Info("clusterwide: catching up a peer failed; next round tries again", "peer", t, "err", err)
			continue
		}
		theirs := uint64(0)
		for _, p := range peers {
			if p.ID == t {
				theirs = p.Digest
			}
		}
		s.mu.Lock()
		s.pushed[t] = [2]uint64{mine, theirs}
		s.mu.Unlock()
		s.log.Info("clusterwide: caught a peer up", "peer", t, "objects", len(batch))
	}
}
