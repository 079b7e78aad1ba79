package queue

// The queue on a store every node reaches (Storage; internal/cassandra,
// issue 15 item 4): the entries and their messages live only there, so a
// node keeps no queue state of its own and can be killed, wiped and
// started again without losing an entry.
//
// Writes: a new entry's message, then the entry, at the store's write
// consistency, before Add returns (the SMTP 250 waits for it); every later
// state (an attempt's outcome, a retry, a delete, done) is the whole entry
// again under a newer HLC stamp, which the store keeps by newest stamp
// (Cassandra: USING TIMESTAMP the stamp). The node's clock observes every
// stamp it reads, so its next write is newer than what it read. A done or
// deleted entry is a tombstone without its message, swept after the
// tombstone age as the native queue's are.
//
// Who runs an entry: the manager of the entry id's bucket in the user map
// (Leader), which every node computes from the same live members by
// rendezvous hashing, with no coordination. A node that dies loses its
// buckets to the others within the failure detector's few seconds, and
// their runners pick its entries up. A bucket a node gains is run only
// after bucketSettle, and each attempt starts from the entry's state read
// from the store, so an attempt the bucket's previous manager finished in
// that time is not made again. SMTP delivery stays at least once: a
// previous manager still in an attempt longer than bucketSettle (a slow
// remote server) when the bucket moves between two live nodes, or one cut
// off from the others, may deliver the message again; one killed after
// the remote's 250 and before it saved the outcome does so too, as on the
// native store.
//
// What the node keeps in memory is soft state: the entries as the store
// listed them at the last scan (every sharedRescan) and as this node read
// and wrote them since, from which the runner picks the due ones it leads.
// Listings (quill queue list, /api/queue, the console) read the store.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
)

const (
	// sharedRescan is how often a node lists the shared store's entries
	// for its runner: an entry another node queued (or retried) for one
	// of this node's buckets waits at most this long before its attempt.
	sharedRescan = 5 * time.Second
	// bucketSettle is how long a node waits before it runs the entries of
	// a bucket it gained: the previous manager's attempts in progress
	// (most take well under a second) end and save their outcome first.
	bucketSettle = 10 * time.Second
)

// SharedStore is what Shared needs of a store every node reaches
// (cassandra.Store). Entries are written at their stamp, newest stamp
// winning; QueueEntry wraps ErrNotFound for an entry it does not have.
type SharedStore interface {
	PutQueueEntry(ctx context.Context, e *Entry) error
	QueueEntry(ctx context.Context, id string) (*Entry, error)
	QueueEntries(ctx context.Context, fn func(*Entry) error) error
	DeleteQueueEntry(ctx context.Context, id string, stamp replica.Stamp) error
	PutQueueMessage(ctx context.Context, id string, r io.Reader) (int64, error)
	QueueMessage(ctx context.Context, id string) ([]byte, error)
	DeleteQueueMessage(ctx context.Context, id string) error
}

// Clock stamps a node's writes and moves past the stamps it reads (the
// replication manager's HLC).
type Clock interface {
	Now() replica.Stamp
	Observe(replica.Stamp)
}

// Shared is the queue's Storage on a SharedStore.
type Shared struct {
	// Settle is how long a gained bucket waits (bucketSettle; tests
	// shorten it).
	Settle time.Duration

	store SharedStore
	self  cluster.NodeID
	clock Clock
	// userMap returns the current user map (no managers before the
	// first one).
	userMap func() cluster.UserMap
	log     *slog.Logger
	created time.Time

	mu      sync.Mutex
	entries map[string]*Entry // tombstones too
	scanned time.Time         // when the last scan began
	gained  map[uint8]time.Time
	looked  bool // settled saw a map that gives this node buckets
	// sawOthers: settled saw a map giving a bucket to another node.
	sawOthers bool
	onChange  func()
}

// NewShared returns the queue's storage on store for node self, whose
// current user map userMap returns.
func NewShared(store SharedStore, self cluster.NodeID, clock Clock, userMap func() cluster.UserMap, log *slog.Logger) *Shared {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Shared{Settle: bucketSettle, store: store, self: self, clock: clock, userMap: userMap, log: log, created: time.Now(),
		entries: map[string]*Entry{}, gained: map[uint8]time.Time{}}
}

// Place chooses nothing: the store keeps its own copies.
func (s *Shared) Place(string, int, replica.Policy) ([]cluster.NodeID, error) { return nil, nil }

// Write stores e under a new stamp, its message first when raw is set. A
// done or deleted entry is written as a tombstone and its message
// removed. policy has no say: the store's write consistency level is the
// deployment's durability.
func (s *Shared) Write(ctx context.Context, e *Entry, raw []byte, _ replica.Policy) error {
	if raw != nil {
		if _, err := s.store.PutQueueMessage(ctx, e.ID, bytes.NewReader(raw)); err != nil {
			return err
		}
	}
	e.Stamp = s.clock.Now()
	st := e
	if e.Deleted {
		st = &Entry{ID: e.ID, Stamp: e.Stamp, Deleted: true, Created: e.Created}
	}
	if err := s.store.PutQueueEntry(ctx, st); err != nil {
		return err
	}
	s.keep(st)
	if st.Deleted {
		// The tombstone holds the entry down; the message is garbage
		// from now on (a failure here leaves it to the sweep).
		if err := s.store.DeleteQueueMessage(ctx, e.ID); err != nil {
			s.log.Warn("queue: message of a finished entry not removed; the sweep removes it", "id", e.ID, "err", err)
		}
	}
	s.mu.Lock()
	on := s.onChange
	s.mu.Unlock()
	if on != nil {
		on()
	}
	return nil
}

// keep makes e the cached state of its entry unless the cache has a newer
// one.
func (s *Shared) keep(e *Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.entries[e.ID]; !ok || cur.Stamp.Less(e.Stamp) {
		s.entries[e.ID] = e.Clone()
	}
}

// Lookup reads the entry from the store, at its read consistency.
func (s *Shared) Lookup(ctx context.Context, id string) (*Entry, bool, error) {
	e, err := s.store.QueueEntry(ctx, id)
	if errors.Is(err, ErrNotFound) {
		s.mu.Lock()
		delete(s.entries, id) // swept
		s.mu.Unlock()
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	s.clock.Observe(e.Stamp)
	s.keep(e)
	return e, true, nil
}

// Fresh finds nothing newer: the attempt's state was just read from the
// store (Lookup).
func (s *Shared) Fresh(context.Context, *Entry, map[cluster.NodeID]bool) bool { return false }

// Body reads the entry's message from the store.
func (s *Shared) Body(ctx context.Context, id string) ([]byte, error) {
	return s.store.QueueMessage(ctx, id)
}

// Leader is the manager of the entry id's bucket.
func (s *Shared) Leader(e *Entry, _ map[cluster.NodeID]bool) cluster.NodeID {
	m := s.userMap()
	return m.Manager(e.ID)
}

// scan lists every entry of the store and makes the listing the cache,
// keeping what this node wrote or read since the scan began. It returns
// the live entries, oldest first.
func (s *Shared) scan(ctx context.Context) ([]*Entry, error) {
	began := time.Now()
	got := map[string]*Entry{}
	var newest replica.Stamp
	err := s.store.QueueEntries(ctx, func(e *Entry) error {
		got[e.ID] = e
		if newest.Less(e.Stamp) {
			newest = e.Stamp
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !newest.IsZero() {
		s.clock.Observe(newest)
	}
	s.mu.Lock()
	for id, cur := range s.entries {
		if e, ok := got[id]; ok && !e.Stamp.Less(cur.Stamp) {
			continue
		}
		if _, ok := got[id]; ok || cur.Stamp.Clock.Wall().After(began) {
			got[id] = cur // written or read here during the scan
		}
	}
	s.entries, s.scanned = got, began
	var live []*Entry
	for _, e := range got {
		if !e.Deleted {
			live = append(live, e.Clone())
		}
	}
	s.mu.Unlock()
	sortEntries(live)
	return live, nil
}

// settled returns the buckets this node manages and has managed for
// Settle; those it gained are noted.
func (s *Shared) settled(m *cluster.UserMap, now time.Time) map[uint8]bool {
	out := map[uint8]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The node's first map that gives it buckets is its start's: a map
	// from before it joined (none of its own) does not use this up, or a
	// node's first buckets would wait Settle from when it got them.
	first := !s.looked
	for i := 0; i < cluster.Buckets; i++ {
		if m.Node[uint8(i)] == s.self {
			s.looked = true
		} else if m.Node[uint8(i)] != "" {
			s.sawOthers = true
		}
	}
	for i := 0; i < cluster.Buckets; i++ {
		b := uint8(i)
		if m.Node[b] != s.self {
			delete(s.gained, b)
			continue
		}
		since, ok := s.gained[b]
		if !ok {
			since = now
			if first {
				// The node's first buckets count from its start: the
				// runner's own hold-off has passed meanwhile.
				since = s.created
			}
			s.gained[b] = since
		}
		// A node that has managed every bucket since it started runs
		// them at once: no other node had any to be in an attempt of (a
		// single node, the default, would otherwise hold the mail of its
		// first Settle). Buckets taken over from a node still wait.
		if now.Sub(since) >= s.Settle || !s.sawOthers {
			out[b] = true
		}
	}
	return out
}

// Due lists the store again when the last scan is older than
// sharedRescan, and picks among the entries of the buckets this node
// manages (those it has managed for Settle) those that are due. held counts the live
// entries of this node's buckets.
func (s *Shared) Due(ctx context.Context, _ map[cluster.NodeID]bool, pick func(e *Entry) bool) ([]string, int) {
	s.mu.Lock()
	stale := time.Since(s.scanned) >= sharedRescan
	s.mu.Unlock()
	if stale {
		if _, err := s.scan(ctx); err != nil {
			s.log.Warn("queue: the shared store's entries not listed; running from the last listing", "err", err)
			s.mu.Lock()
			s.scanned = time.Now() // not again before sharedRescan
			s.mu.Unlock()
		}
	}
	now := time.Now()
	m := s.userMap()
	ours := s.settled(&m, now)
	var due []*Entry
	held := 0
	s.mu.Lock()
	for _, e := range s.entries {
		b := cluster.Bucket(e.ID)
		if e.Deleted || m.Node[b] != s.self {
			continue
		}
		held++
		if ours[b] && pick(e) {
			due = append(due, e)
		}
	}
	s.mu.Unlock()
	sortEntries(due)
	ids := make([]string, len(due))
	for i, e := range due {
		ids[i] = e.ID
	}
	return ids, held
}

// List reads the store: every live entry of the cluster, or one entry.
func (s *Shared) List(ctx context.Context, id string) Listing {
	if id != "" {
		e, ok, err := s.Lookup(ctx, id)
		switch {
		case err != nil:
			return Listing{Unavailable: err.Error()}
		case ok && !e.Deleted:
			return Listing{Entries: []*Entry{e}}
		}
		return Listing{}
	}
	live, err := s.scan(ctx)
	if err != nil {
		return Listing{Unavailable: err.Error()}
	}
	return Listing{Entries: live}
}

// Sweep removes, from the store, the tombstones of this node's buckets
// older than before (each bucket's manager sweeps its own, so the nodes do
// not repeat each other's deletes).
func (s *Shared) Sweep(ctx context.Context, before time.Time) (int, error) {
	var gone []*Entry
	m := s.userMap()
	s.mu.Lock()
	for _, e := range s.entries {
		if e.Deleted && e.Stamp.Clock.Wall().Before(before) && m.Manager(e.ID) == s.self {
			gone = append(gone, e)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, e := range gone {
		if err := s.store.DeleteQueueEntry(ctx, e.ID, e.Stamp); err != nil {
			return n, err
		}
		s.mu.Lock()
		if cur := s.entries[e.ID]; cur != nil && cur.Stamp == e.Stamp {
			delete(s.entries, e.ID)
		}
		s.mu.Unlock()
		n++
	}
	return n, nil
}

// SetOnChange hears this node's writes.
func (s *Shared) SetOnChange(f func()) {
	s.mu.Lock()
	s.onChange = f
	s.mu.Unlock()
}
