// Package queue is the outbound queue: mail a user submitted for other
// domains, kept as hard state in Porcupine's sense (§2.2) until every
// recipient's server has taken it or refused it for good.
//
// Entries are objects of the replication manager (§4.2–4.4, kind "q"): R
// copies on nodes the load balancer chooses, written through the same
// update log and mended by the same repair as messages, so killing the
// node that took a message, or the node delivering it, loses nothing:
// another replica carries on. A delivery may repeat after a crash (the
// remote took the message, the new state never reached a replica); it is
// never dropped.
//
// Who delivers an entry is decided without coordination: the first live
// node of its sorted replica set (the rule the repair uses to choose who
// mends an object; Leader). Each node keeps the entries it holds in memory
// (loaded at start, kept by Apply), and its runner (runner.go) attempts
// those it leads when they are due. Every attempt ends in a new total
// update of the entry that records, per recipient, the state, the
// attempts, the next try and the last reply. An entry with nothing left
// to try becomes a tombstone, swept after the update log's maximum age as
// clusterwide's are.
//
// That is the native store (Replicated, replicated.go). Where entries live
// is a seam (Storage, storage.go): with `quill serve --store cassandra`
// they and their messages are in the keyspace only (Shared, shared.go),
// each run by the manager of its id's bucket in the user map, so a node
// keeps no queue state of its own.
//
// What is written by hand here and why: the queue's state machine and its
// place in the replication manager are Quill's own (no library keeps a
// queue in a Porcupine cluster). SMTP on the wire is github.com/emersion/
// go-smtp's client, DNS is the Go resolver (deliver.go), and the DSN is
// put together with the standard library's MIME writer (dsn.go).
package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
	"google.golang.org/protobuf/proto"
)

// Kind is the replication manager's name for queue entries.
const Kind = "q"

// maxEntryBytes bounds an entry's encoded state (not its message): 100
// recipients with their last replies fit many times over; anything far
// larger from the network is refused.
const maxEntryBytes = 1 << 20

// State is where one recipient's delivery stands.
type State int32

const (
	// Queued: to be tried (again) at NextTry.
	Queued State = iota
	// Delivered: a server took it (250 after DATA).
	Delivered
	// Failed: refused for good, or the queue lifetime ran out; the
	// sender is owed a DSN.
	Failed
	// Reported: failed, and the DSN went into the queue (or there was no
	// one to tell: a null sender).
	Reported
)

func (s State) String() string {
	switch s {
	case Queued:
		return "queued"
	case Delivered:
		return "delivered"
	case Failed:
		return "failed"
	case Reported:
		return "reported"
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// MarshalText makes the state readable in the admin API's JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText wrote (the CLI reads the API).
func (s *State) UnmarshalText(b []byte) error {
	for _, v := range []State{Queued, Delivered, Failed, Reported} {
		if v.String() == string(b) {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("queue recipient state %q: unknown", b)
}

// Recipient is one recipient's delivery state.
type Recipient struct {
	Address   string    `json:"address"`
	State     State     `json:"state"`
	Attempts  int       `json:"attempts"`
	NextTry   time.Time `json:"next_try,omitzero"`
	LastTry   time.Time `json:"last_try,omitzero"`
	LastReply string    `json:"last_reply,omitempty"`
	Remote    string    `json:"remote,omitempty"`
}

// Entry is one queued message: its envelope, its recipients' states and
// where its replicas are.
type Entry struct {
	ID         string           `json:"id"`
	Stamp      replica.Stamp    `json:"stamp"`
	Deleted    bool             `json:"deleted,omitempty"`
	User       string           `json:"user,omitempty"`
	From       string           `json:"from"`
	Recipients []Recipient      `json:"recipients"`
	Replicas   []cluster.NodeID `json:"replicas"`
	Want       int              `json:"want"`
	Created    time.Time        `json:"created"`
	Warned     bool             `json:"warned,omitempty"`
	Size       int64            `json:"size"`
}

// Clone returns a deep copy.
func (e *Entry) Clone() *Entry {
	c := *e
	c.Recipients = slices.Clone(e.Recipients)
	c.Replicas = slices.Clone(e.Replicas)
	return &c
}

func (e *Entry) toPB() *nodepb.QueueEntry {
	p := &nodepb.QueueEntry{Id: e.ID, Version: uint64(e.Stamp.Clock), Origin: string(e.Stamp.Node), Deleted: e.Deleted,
		User: e.User, From: e.From, Replicas: cluster.IDsToPB(e.Replicas), Want: int32(e.Want), Created: nodepb.Nanos(e.Created),
		Warned: e.Warned, Size: e.Size}
	for _, r := range e.Recipients {
		p.Recipients = append(p.Recipients, &nodepb.QueueRecipient{Address: r.Address, State: int32(r.State),
			Attempts: uint32(r.Attempts), NextTry: nodepb.Nanos(r.NextTry), LastTry: nodepb.Nanos(r.LastTry), LastReply: r.LastReply, Remote: r.Remote})
	}
	return p
}

func fromPB(p *nodepb.QueueEntry) *Entry {
	e := &Entry{ID: p.Id, Stamp: replica.Stamp{Clock: hlc.Timestamp(p.Version), Node: cluster.NodeID(p.Origin)},
		Deleted: p.Deleted, User: p.User, From: p.From, Replicas: cluster.IDsFromPB(p.Replicas), Want: int(p.Want),
		Created: nodepb.Time(p.Created), Warned: p.Warned, Size: p.Size}
	for _, r := range p.Recipients {
		e.Recipients = append(e.Recipients, Recipient{Address: r.Address, State: State(r.State), Attempts: int(r.Attempts),
			NextTry: nodepb.Time(r.NextTry), LastTry: nodepb.Time(r.LastTry), LastReply: r.LastReply, Remote: r.Remote})
	}
	return e
}

func encode(e *Entry) ([]byte, error) { return proto.Marshal(e.toPB()) }

func decode(b []byte) (*Entry, error) {
	var p nodepb.QueueEntry
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return fromPB(&p), nil
}

// Marshal and Unmarshal are an entry's stored form (nodepb.QueueEntry), for
// a store other than the node's Pebble (internal/cassandra).
func Marshal(e *Entry) ([]byte, error) { return encode(e) }

// Unmarshal reads what Marshal wrote.
func Unmarshal(b []byte) (*Entry, error) { return decode(b) }

// NewID returns a new entry id: 16 random bytes in hex.
func NewID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidID checks an id from the network or an operator.
func ValidID(id string) error {
	if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		return fmt.Errorf("queue id %q: want 32 lowercase hex digits", id)
	}
	return nil
}

func objectName(id string) string { return Kind + "/" + id }

// IDOf returns the entry id of a replication object name, if it is one.
func IDOf(object string) (string, bool) {
	id, ok := strings.CutPrefix(object, Kind+"/")
	return id, ok && ValidID(id) == nil
}

func entryKey(id string) []byte { return append(store.KindPrefix(store.KindQueue), id...) }
func bodyKey(id string) []byte  { return append(store.KindPrefix(store.KindQueued), id...) }

// ErrNotFound is returned for an entry this node does not hold.
var ErrNotFound = errors.New("no such queue entry")

// Store is this node's replica of the queue entries it holds. It
// implements replica.Handler and replica.Scanner for Kind.
type Store struct {
	self cluster.NodeID
	db   *store.DB
	log  *slog.Logger

	mu      sync.Mutex
	entries map[string]*Entry // tombstones too
	// onChange hears that an entry was applied (the runner's kick).
	onChange func()
}

// Open loads the entries this node holds.
func Open(self cluster.NodeID, db *store.DB, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{self: self, db: db, log: log, entries: map[string]*Entry{}}
	it, err := db.PrefixIter(nil, store.KindPrefix(store.KindQueue))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		e, err := decode(it.Value())
		if err != nil {
			return nil, fmt.Errorf("queue entry %q: corrupt: %w", it.Key()[1:], err)
		}
		s.entries[e.ID] = e
	}
	return s, it.Error()
}

// SetOnChange sets what hears of every entry applied here; set it before
// the node takes traffic.
func (s *Store) SetOnChange(f func()) {
	s.mu.Lock()
	s.onChange = f
	s.mu.Unlock()
}

// Get returns a copy of an entry held here (not a tombstone).
func (s *Store) Get(id string) (*Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if !ok || e.Deleted {
		return nil, false
	}
	return e.Clone(), true
}

// lookup returns a copy of an entry's state here, tombstones included.
func (s *Store) lookup(id string) (*Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if !ok {
		return nil, false
	}
	return e.Clone(), true
}

// adopt makes a newer state of an entry, read from another replica, the
// one here (without logging it: the replica it came from has it).
func (s *Store) adopt(e *Entry) error {
	data, err := encode(e)
	if err != nil {
		return err
	}
	outs, err := s.Apply([]*replica.Update{{Object: objectName(e.ID), Stamp: e.Stamp, Targets: e.Replicas, Data: data}}, nil)
	if err != nil {
		return err
	}
	if outs[0] != replica.Applied && outs[0] != replica.Stale {
		return fmt.Errorf("queue entry %s: newer state from a peer not applied (outcome %d)", e.ID, outs[0])
	}
	return nil
}

// UpdateOf returns the replication update that makes e (with its message
// body) the entry's state on targets, at e's own stamp: how quill migrate
// writes an entry copied from another store through this handler.
func UpdateOf(e *Entry, body []byte, targets []cluster.NodeID) (*replica.Update, error) {
	data, err := encode(e)
	if err != nil {
		return nil, err
	}
	return &replica.Update{Object: objectName(e.ID), Stamp: e.Stamp, Targets: targets, Data: data, Blob: body}, nil
}

// All returns copies of every entry held here, tombstones included, by
// id: what quill migrate merges across nodes (a tombstone must win over an
// older state another node still holds).
func (s *Store) All() []*Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e.Clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Body returns the message of an entry held here.
func (s *Store) Body(id string) ([]byte, error) {
	v, c, err := s.db.Get(bodyKey(id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("queue entry %s: message: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("queue entry %s: message: %w", id, err)
	}
	defer c.Close()
	return slices.Clone(v), nil
}

// List returns copies of the entries held here, tombstones left out,
// oldest first.
// Due returns the ids of the entries pick chooses, oldest first, and how
// many entries are held: the runner's walk each second, which must not
// copy every entry held. pick runs under the store's lock and must not
// change the entry.
func (s *Store) Due(pick func(e *Entry) bool) (ids []string, held int) {
	type cand struct {
		created time.Time
		id      string
	}
	var out []cand
	s.mu.Lock()
	for _, e := range s.entries {
		if e.Deleted {
			continue
		}
		held++
		if pick(e) {
			out = append(out, cand{e.Created, e.ID})
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].created.Equal(out[j].created) {
			return out[i].created.Before(out[j].created)
		}
		return out[i].id < out[j].id
	})
	ids = make([]string, len(out))
	for i, c := range out {
		ids[i] = c.id
	}
	return ids, held
}

func (s *Store) List() []*Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Entry
	for _, e := range s.entries {
		if !e.Deleted {
			out = append(out, e.Clone())
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Apply implements replica.Handler: each update is a whole entry, kept
// when its stamp is newer than the one here. A node that is not among the
// entry's replicas (the repair moved it away) keeps only a tombstone.
func (s *Store) Apply(ups []*replica.Update, logw func(b *store.Batch, outs []replica.Outcome) error) ([]replica.Outcome, error) {
	s.mu.Lock()
	b := s.db.NewBatch()
	defer b.Close()
	outs := make([]replica.Outcome, len(ups))
	next := map[string]*Entry{}
	bodies := map[string]bool{}
	for i, u := range ups {
		e, err := decode(u.Data)
		if err != nil || len(u.Data) > maxEntryBytes || ValidID(e.ID) != nil || u.Object != objectName(e.ID) || e.Stamp.IsZero() {
			outs[i] = replica.Failed // bad input from the network: refused
			continue
		}
		cur := next[e.ID]
		if cur == nil {
			cur = s.entries[e.ID]
		}
		if cur != nil && !cur.Stamp.Less(e.Stamp) {
			outs[i] = replica.Stale
			continue
		}
		if cur != nil && cur.Deleted && len(cur.Replicas) == 0 && !e.Deleted {
			// Done or deleted stays so: an attempt's outcome written
			// after an operator's delete must not bring the entry back.
			// (A tombstone left by a move, with its new replicas, may
			// see the entry come back.)
			outs[i] = replica.Stale
			continue
		}
		data := u.Data
		if !e.Deleted && slices.Contains(e.Replicas, s.self) {
			switch {
			case len(u.Blob) > 0:
				if err := b.Set(bodyKey(e.ID), u.Blob); err != nil {
					s.mu.Unlock()
					return nil, err
				}
				bodies[e.ID] = true
			case !bodies[e.ID] && !s.hasBody(e.ID):
				outs[i] = replica.NeedContent
				continue
			}
		} else {
			// Done, removed, or moved away from here: a tombstone keeps
			// the stamp so an older state cannot come back. One left by a
			// move keeps the new replica set, so an attempt that was under
			// way here can still hand its outcome over (Queue.save).
			t := &Entry{ID: e.ID, Stamp: e.Stamp, Deleted: true, Created: e.Created}
			if !e.Deleted {
				t.Replicas = e.Replicas
			}
			e = t
			if data, err = encode(e); err != nil {
				s.mu.Unlock()
				return nil, err
			}
			if err := b.Delete(bodyKey(e.ID)); err != nil {
				s.mu.Unlock()
				return nil, err
			}
		}
		if err := b.Set(entryKey(e.ID), data); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		next[e.ID] = e
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
		return nil, fmt.Errorf("write %d queue entries: %w", len(ups), err)
	}
	for id, e := range next {
		s.entries[id] = e
	}
	on := s.onChange
	s.mu.Unlock()
	if on != nil && len(next) > 0 {
		on()
	}
	return outs, nil
}

func (s *Store) hasBody(id string) bool {
	_, c, err := s.db.Get(bodyKey(id))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Fill implements replica.Handler: the message is the blob.
func (s *Store) Fill(u *replica.Update) error {
	id, ok := IDOf(u.Object)
	if !ok {
		return fmt.Errorf("queue object %q: not an entry", u.Object)
	}
	body, err := s.Body(id)
	if err != nil {
		return err
	}
	u.Blob = body
	return nil
}

// Scan implements replica.Scanner: every entry held here, for the repair.
func (s *Store) Scan(fn func(h replica.Held) error) error {
	s.mu.Lock()
	var held []replica.Held
	for _, e := range s.entries {
		if !e.Deleted {
			held = append(held, replica.Held{Object: objectName(e.ID), User: e.User, Replicas: slices.Clone(e.Replicas), Want: e.Want})
		}
	}
	s.mu.Unlock()
	for _, h := range held {
		if err := fn(h); err != nil {
			return err
		}
	}
	return nil
}

// Sweep forgets the tombstones older than before (the update log's
// maximum age: a node away longer rejoins as a new one, so none can still
// hold the entry).
func (s *Store) Sweep(before time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []string
	for id, e := range s.entries {
		if e.Deleted && e.Stamp.Clock.Wall().Before(before) {
			gone = append(gone, id)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	keys := make([][]byte, len(gone))
	for i, id := range gone {
		keys[i] = entryKey(id)
	}
	if err := s.db.DeleteAll(keys, store.NoSync); err != nil { // lost in a crash: swept again
		return 0, err
	}
	for _, id := range gone {
		delete(s.entries, id)
	}
	return len(gone), nil
}

// Writer is what the queue needs of the replication manager.
type Writer interface {
	Write(ctx context.Context, req *replica.WriteRequest) (*replica.WriteReply, error)
	Now() replica.Stamp
}

// write makes e (with a new stamp) the entry's state on targets, with its
// message when body is set, and returns once policy's share hold it.
func write(ctx context.Context, w Writer, e *Entry, body []byte, targets []cluster.NodeID, policy replica.Policy) error {
	e.Stamp = w.Now()
	data, err := encode(e)
	if err != nil {
		return err
	}
	u := &replica.Update{Object: objectName(e.ID), Stamp: e.Stamp, Targets: targets, Data: data, Blob: body}
	if _, err := w.Write(ctx, &replica.WriteRequest{Updates: []*replica.Update{u}, Policy: policy, Want: e.Want}); err != nil {
		return fmt.Errorf("queue entry %s: %w", e.ID, err)
	}
	return nil
}
