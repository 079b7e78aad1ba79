package cassandra

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
)

// nodeClock is a node's HLC as the queue sees it (the replication
// manager's Now and Observe, without its store).
type nodeClock struct {
	c    *hlc.Clock
	node cluster.NodeID
}

func (n nodeClock) Now() replica.Stamp      { return replica.Stamp{Clock: n.c.Now(), Node: n.node} }
func (n nodeClock) Observe(s replica.Stamp) { n.c.Observe(s.Clock) }

// testUserMap is a user map a test changes: who manages each bucket.
type testUserMap struct {
	mu sync.Mutex
	m  cluster.UserMap
}

func (u *testUserMap) get() cluster.UserMap {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.m
}

func (u *testUserMap) set(manager func(b uint8) cluster.NodeID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for b := range cluster.Buckets {
		u.m.Node[b] = manager(uint8(b))
	}
}

// TestSharedQueue drives the queue's storage on Cassandra (queue.Shared)
// from two nodes on one keyspace of its own: entries and a chunked
// message written by one are read by the other, every shard is listed,
// the newest stamp wins also from a node whose clock is an hour behind,
// each entry is run by one node and by the other once the first one's
// buckets are its own and settled, a finished entry is a tombstone
// without its message, and the sweep removes the tombstones.
func TestSharedQueue(t *testing.T) {
	ctx := ctxT(t)
	ks := "quill_queue_" + run
	st, err := Open(ctx, testConfig(t, ks))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec()
		st.Close()
	})
	um := &testUserMap{}
	um.set(func(b uint8) cluster.NodeID { return []cluster.NodeID{"n-a", "n-b"}[b%2] })
	node := func(id cluster.NodeID, skew time.Duration) *queue.Shared {
		s := queue.NewShared(st, id, nodeClock{hlc.NewSkewed(skew), id}, um.get, nil)
		s.Settle = 300 * time.Millisecond
		return s
	}
	a, b := node("n-a", 0), node("n-b", 0)
	qa := &queue.Queue{Self: "n-a", Storage: a, Log: slog.New(slog.DiscardHandler)}

	// Put: through the queue's Add (message, then entry), until every
	// shard has entries.
	shards := map[int16]int{}
	var ids []string
	for len(shards) < queueShards {
		id, err := qa.Add(ctx, user("q"), "sender@example.org", []string{"rcpt@remote.example", "rcpt@remote.example"}, []byte("Subject: q\r\n\r\nhi\r\n"), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		shards[queueShard(id)]++
		if len(ids) > 500 {
			t.Fatalf("%d entries cover %d shards", len(ids), len(shards))
		}
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), (2*chunkSize+1000)/16)
	bigID, err := qa.Add(ctx, user("q"), "sender@example.org", []string{"big@remote.example"}, big, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, bigID)

	// The listing, from the other node, has every entry of every shard.
	l := b.List(ctx, "")
	if l.Unavailable != "" {
		t.Fatal(l.Unavailable)
	}
	var listed []string
	for _, e := range l.Entries {
		listed = append(listed, e.ID)
		if len(e.Recipients) != 1 && e.ID != bigID {
			t.Fatalf("entry %s: %d recipients, want the duplicate folded into 1", e.ID, len(e.Recipients))
		}
	}
	if want := slices.Sorted(slices.Values(ids)); !slices.Equal(slices.Sorted(slices.Values(listed)), want) {
		t.Fatalf("listing from n-b: %d entries, want the %d written by n-a", len(listed), len(ids))
	}
	if one := b.List(ctx, bigID); len(one.Entries) != 1 || one.Entries[0].Size != int64(len(big)) {
		t.Fatalf("listing of one entry: %+v", one)
	}

	// The message above 1 MiB is chunked and read back whole by the
	// other node.
	if got, err := b.Body(ctx, bigID); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("large message from n-b: %d bytes, %v", len(got), err)
	}
	var chunks int
	if err := st.s.Query(`SELECT COUNT(*) FROM queue_message_chunks WHERE id = ? AND chunk IN (0, 1, 2, 3)`, bigID).
		WithContext(ctx).Scan(&chunks); err != nil || chunks != 3 {
		t.Fatalf("chunks of a %d-byte message: %d, %v; want 3", len(big), chunks, err)
	}

	// Update: n-b records an attempt; n-a reads it.
	id := ids[0]
	e, ok, err := b.Lookup(ctx, id)
	if err != nil || !ok {
		t.Fatalf("lookup from n-b: %v %v", ok, err)
	}
	e.Recipients[0].Attempts, e.Recipients[0].LastReply = 1, "451 try later"
	e.Recipients[0].NextTry = time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := b.Write(ctx, e, nil, replica.One); err != nil {
		t.Fatal(err)
	}
	if got, _, err := a.Lookup(ctx, id); err != nil || got.Recipients[0].LastReply != "451 try later" || got.Stamp != e.Stamp {
		t.Fatalf("n-a reads n-b's update: %+v, %v", got, err)
	}

	// Newest stamp wins: a node an hour behind writes without having read
	// the entry, and loses; once it read it, its write is newer and wins.
	late := node("n-late", -time.Hour)
	stale := e.Clone()
	stale.Recipients[0].LastReply = "stale"
	if err := late.Write(ctx, stale, nil, replica.One); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := a.Lookup(ctx, id); got.Recipients[0].LastReply != "451 try later" {
		t.Fatalf("an older-stamped write replaced a newer one: %q", got.Recipients[0].LastReply)
	}
	cur, _, err := late.Lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	cur.Recipients[0].LastReply = "after reading"
	if err := late.Write(ctx, cur, nil, replica.One); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := a.Lookup(ctx, id); got.Recipients[0].LastReply != "after reading" {
		t.Fatalf("a write stamped after reading the entry lost: %q", got.Recipients[0].LastReply)
	}

	// Who runs what: each entry due now is run by its bucket's manager
	// only; when n-a dies, n-b takes its buckets and runs their entries
	// once they settled.
	dueNow := func(e *queue.Entry) bool { d, ok := queue.Due(e); return !ok || !d.After(time.Now()) }
	time.Sleep(a.Settle)
	runs := func(s *queue.Shared) map[string]bool {
		got, _ := s.Due(ctx, nil, dueNow)
		out := map[string]bool{}
		for _, id := range got {
			out[id] = true
		}
		return out
	}
	ra, rb := runs(a), runs(b)
	for _, x := range ids {
		want := x != id // the first one waits an hour
		byA, byB := ra[x], rb[x]
		if byA && byB || (byA || byB) != want {
			t.Fatalf("entry %s: run by n-a %v, by n-b %v; want by exactly one: %v", x, byA, byB, want)
		}
		if lead := a.Leader(&queue.Entry{ID: x}, nil); (lead == "n-a") != byA && want {
			t.Fatalf("entry %s: leader %s, run by n-a %v", x, lead, byA)
		}
	}
	if len(ra) == 0 || len(rb) == 0 {
		t.Fatalf("n-a runs %d entries, n-b %d: the buckets split them", len(ra), len(rb))
	}
	um.set(func(uint8) cluster.NodeID { return "n-b" })
	if now := runs(b); len(now) != len(rb) {
		t.Fatalf("n-b runs %d entries right after it gained n-a's buckets, want still its own %d", len(now), len(rb))
	}
	time.Sleep(b.Settle)
	if now := runs(b); len(now) != len(ids)-1 {
		t.Fatalf("n-b runs %d entries once n-a's buckets settled, want %d", len(now), len(ids)-1)
	}

	// Done: a tombstone, no message, out of the listing; then swept.
	done, _, _ := b.Lookup(ctx, bigID)
	done.Deleted = true
	if err := b.Write(ctx, done, nil, replica.One); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := a.Lookup(ctx, bigID); err != nil || !ok || !got.Deleted || len(got.Recipients) != 0 {
		t.Fatalf("tombstone read by n-a: %+v %v %v", got, ok, err)
	}
	if _, err := a.Body(ctx, bigID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("message of a finished entry: %v, want gone", err)
	}
	if l := a.List(ctx, ""); len(l.Entries) != len(ids)-1 || slices.ContainsFunc(l.Entries, func(e *queue.Entry) bool { return e.ID == bigID }) {
		t.Fatalf("listing after the delete: %d entries", len(l.Entries))
	}
	if n, err := b.Sweep(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("sweep of tombstones older than an hour: %d, %v; want none", n, err)
	}
	if n, err := b.Sweep(ctx, time.Now().Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v; want the one tombstone", n, err)
	}
	if _, err := st.QueueEntry(ctx, bigID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("swept tombstone: %v", err)
	}
	if _, ok, err := a.Lookup(ctx, ids[1]); err != nil || !ok {
		t.Fatalf("a live entry after the sweep: %v %v", ok, err)
	}
}
