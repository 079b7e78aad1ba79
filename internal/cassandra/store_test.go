package cassandra

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/cassandra/cassandratest"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

func TestMain(m *testing.M) { os.Exit(cassandratest.Main(m)) }

// testConfig is the configuration the tests use: the package's node (or
// QUILL_CASSANDRA_HOSTS), replication QUILL_CASSANDRA_RF (default 1) and
// QUORUM both ways.
func testConfig(t *testing.T, keyspace string) Config {
	t.Helper()
	rs := os.Getenv("QUILL_CASSANDRA_RF")
	if rs == "" {
		rs = "1"
	}
	r, err := ParseReplication(rs)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Hosts: cassandratest.Hosts(t), Keyspace: keyspace, Replication: r}
}

var (
	sharedOnce  sync.Once
	sharedStore *Store
	sharedErr   error
	// run makes names unique to this run, so a cluster kept between runs
	// (QUILL_CASSANDRA_HOSTS) never shows a test an earlier run's rows.
	run = randomHex(4)
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// open returns the store on the shared test keyspace, made once.
func open(t *testing.T) *Store {
	t.Helper()
	cfg := testConfig(t, "quill_test")
	sharedOnce.Do(func() { sharedStore, sharedErr = Open(context.Background(), cfg) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedStore
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var clock = hlc.New()

func stamp() replica.Stamp { return replica.Stamp{Clock: clock.Now(), Node: "n1"} }

func user(name string) string { return name + "-" + run + "@example.org" }

// together runs fn(0), ..., fn(n-1) at once and fails the test with their
// first error.
func together(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
}

func TestProfiles(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	addr := user("Alice")
	if _, err := st.Profile(ctx, addr); !errors.Is(err, userdb.ErrNotFound) {
		t.Fatalf("profile of a new user: %v, want ErrNotFound", err)
	}
	older := &userdb.Profile{Address: addr, PasswordHash: "old", Version: clock.Now(), Created: time.Now().Truncate(time.Millisecond),
		Mailboxes: []userdb.MailboxDef{{Name: "INBOX", UIDValidity: 7, UIDReserved: 257, ModSeqReserved: 300}}}
	newer := older.Clone()
	newer.PasswordHash, newer.Version, newer.QuotaStorage = "new", clock.Now(), 1<<20
	// The newer version is written first; the older one, arriving late,
	// must not replace it.
	for _, p := range []*userdb.Profile{newer, older} {
		if err := st.PutProfile(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.Profile(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if got.Address != userdb.Normalize(addr) || got.PasswordHash != "new" || got.QuotaStorage != 1<<20 || got.Version != newer.Version ||
		len(got.Mailboxes) != 1 || got.Mailboxes[0] != newer.Mailboxes[0] || !got.Created.Equal(older.Created) {
		t.Fatalf("profile read back: %+v, want %+v", got, newer)
	}

	// A tombstone is a profile too, and a late update does not undo it.
	gone := newer.Clone()
	gone.Deleted, gone.PasswordHash, gone.Version = true, "", clock.Now()
	if err := st.PutProfile(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := st.PutProfile(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Profile(ctx, addr); err != nil || !got.Deleted {
		t.Fatalf("after delete and a late update: %+v, %v; want the tombstone", got, err)
	}
	if err := st.DeleteProfile(ctx, addr, uint64(clock.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Profile(ctx, addr); !errors.Is(err, userdb.ErrNotFound) {
		t.Fatalf("after purge: %v, want ErrNotFound", err)
	}
	if err := st.PutProfile(ctx, &userdb.Profile{Address: "no-at-sign", Version: clock.Now()}); err == nil {
		t.Fatal("a bad address was stored")
	}
	if err := st.PutProfile(ctx, &userdb.Profile{Address: user("nostamp")}); err == nil {
		t.Fatal("a profile without a version was stored")
	}
}

func TestScanProfilesByBucket(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	// Users of one bucket (and one of another) spread over its shards.
	var want []string
	bucket := -1
	for i := 0; len(want) < 40; i++ {
		a := userdb.Normalize(user(fmt.Sprintf("b%d", i)))
		if bucket < 0 {
			bucket = int(cluster.Bucket(a))
		}
		if int(cluster.Bucket(a)) == bucket {
			want = append(want, a)
		} else if i%50 != 0 {
			continue
		}
		if err := st.PutProfile(ctx, &userdb.Profile{Address: a, Version: clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := st.ScanProfiles(ctx, bucket, func(p *userdb.Profile) error {
		if int(cluster.Bucket(p.Address)) != bucket {
			t.Errorf("scan of bucket %d gave %s of bucket %d", bucket, p.Address, cluster.Bucket(p.Address))
		}
		if slices.Contains(want, p.Address) {
			got = append(got, p.Address)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("scan of bucket %d: %d of our users, want %d", bucket, len(got), len(want))
	}
	shards := map[int16]bool{}
	for _, a := range want {
		_, sh := userPartition(a)
		shards[sh] = true
	}
	if len(shards) < 8 {
		t.Errorf("40 users of a bucket fell into %d shards of %d", len(shards), userShards)
	}
	if err := st.ScanProfiles(ctx, cluster.Buckets, func(*userdb.Profile) error { return nil }); err == nil {
		t.Error("a scan of bucket 256 was accepted")
	}
}

func TestMailboxes(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	u := user("mb")
	created := time.Now().Truncate(time.Millisecond)
	for i, name := range []string{"INBOX", "Sent", "Archive/2024"} {
		mb := &mailbox.Mailbox{ID: uint64(i + 1), Name: name, UIDValidity: uint32(100 + i), UIDNext: 1, HighestModSeq: 1,
			Subscribed: i < 2, SpecialUse: map[bool]string{true: `\Sent`}[name == "Sent"], Created: created}
		if err := st.PutMailbox(ctx, u, mb); err != nil {
			t.Fatal(err)
		}
	}
	all, err := st.Mailboxes(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].Name != "INBOX" || all[1].SpecialUse != `\Sent` || !all[1].Subscribed || all[2].Subscribed ||
		all[2].Name != "Archive/2024" || all[2].ID != 3 || !all[0].Created.Equal(created) {
		t.Fatalf("mailboxes: %+v", all)
	}
	got, err := st.MailboxByName(ctx, u, "inbox")
	if err != nil || got.UIDValidity != 100 {
		t.Fatalf("INBOX by name in lower case: %+v, %v", got, err)
	}
	// A rename keeps the UIDVALIDITY and the counters move.
	mb := all[2]
	mb.Name, mb.UIDNext, mb.HighestModSeq = "Old", 42, 99
	if err := st.PutMailbox(ctx, u, &mb); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Mailbox(ctx, u, 102); err != nil || got.Name != "Old" || got.UIDNext != 42 || got.HighestModSeq != 99 {
		t.Fatalf("renamed: %+v, %v", got, err)
	}
	if _, err := st.MailboxByName(ctx, u, "Archive/2024"); !errors.Is(err, mailbox.ErrNoMailbox) {
		t.Fatalf("old name after rename: %v", err)
	}
	if err := st.PutMailbox(ctx, u, &mailbox.Mailbox{Name: "bad*name", UIDValidity: 5}); err == nil {
		t.Fatal("a bad mailbox name was stored")
	}
	if err := st.DeleteMailbox(ctx, u, 102, stamp()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Mailbox(ctx, u, 102); !errors.Is(err, mailbox.ErrNoMailbox) {
		t.Fatalf("deleted mailbox: %v", err)
	}
}

// reserveTo reserves UIDs below end for a test's mailbox.
func reserveTo(t *testing.T, st *Store, u string, v uint32, end uint32) {
	t.Helper()
	ctx := ctxT(t)
	f, err := st.Claim(ctx, u, v, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve(ctx, f, max(end, f.UIDReserved), max(uint64(end), f.ModSeqReserved)); err != nil {
		t.Fatal(err)
	}
}

func TestMessageIndex(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	u, v := user("idx"), uint32(9)
	// UIDs on both sides of a partition boundary (65,536).
	uids := []uint32{1, 2, 65534, 65535, 65536, 65537, 131072}
	reserveTo(t, st, u, v, 131073)
	date := time.Now().Truncate(time.Millisecond)
	for i, uid := range uids {
		m := &mailbox.Message{UID: uid, ID: fmt.Sprintf("m%d", uid), Size: int64(100 + i), Date: date,
			Flags: []string{`\Seen`}, ModSeq: uint64(i + 1), Version: stamp()}
		if err := st.PutMessage(ctx, u, v, m); err != nil {
			t.Fatal(err)
		}
	}
	all, err := st.AllMessages(ctx, u, v)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint32
	for _, m := range all {
		got = append(got, m.UID)
	}
	if !slices.Equal(got, uids) {
		t.Fatalf("all UIDs: %v, want %v", got, uids)
	}
	if m := all[3]; m.ID != "m65535" || m.Size != 103 || !m.Date.Equal(date) || !slices.Equal(m.Flags, []string{`\Seen`}) || m.ModSeq != 4 || m.Version.Node != "n1" {
		t.Fatalf("record of UID 65535: %+v", m)
	}
	got = nil
	if err := st.Messages(ctx, u, v, 65535, 65537, func(m *mailbox.Message) error { got = append(got, m.UID); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []uint32{65535, 65536, 65537}) {
		t.Fatalf("UIDs 65535:65537: %v", got)
	}

	// A STORE at a newer stamp changes flags and MODSEQ; one at an older
	// stamp, arriving late, does not.
	old, cur := stamp(), stamp()
	if err := st.UpdateFlags(ctx, u, v, 65536, []string{`\Flagged`, "$Label"}, 20, cur); err != nil {
		t.Fatal(err)
	}
	if err := st.UpdateFlags(ctx, u, v, 65536, nil, 19, old); err != nil {
		t.Fatal(err)
	}
	m, err := st.Message(ctx, u, v, 65536)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Flags, []string{`\Flagged`, "$Label"}) || m.ModSeq != 20 || m.Version.Clock != cur.Clock || m.ID != "m65536" {
		t.Fatalf("after STORE: %+v", m)
	}

	// An expunge at a stamp wins over an older write arriving later, and a
	// flag change stamped after it leaves no message behind.
	late := &mailbox.Message{UID: 2, ID: "m2", Size: 1, Date: date, ModSeq: 2, Version: stamp()}
	if err := st.DeleteMessage(ctx, u, v, 2, stamp()); err != nil {
		t.Fatal(err)
	}
	if err := st.PutMessage(ctx, u, v, late); err != nil {
		t.Fatal(err)
	}
	if err := st.UpdateFlags(ctx, u, v, 2, []string{`\Deleted`}, 30, stamp()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Message(ctx, u, v, 2); !errors.Is(err, mailbox.ErrNoMessage) {
		t.Fatalf("expunged UID 2: %v, want ErrNoMessage", err)
	}
	all, err = st.AllMessages(ctx, u, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(uids)-1 || all[1].UID != 65534 {
		t.Fatalf("after expunge: %d records, second %d", len(all), all[1].UID)
	}
	if err := st.PutMessage(ctx, u, v, &mailbox.Message{UID: 3, ID: "x"}); err == nil {
		t.Fatal("a record without a stamp was stored")
	}

	// Deleting the mailbox takes its index with it, every partition.
	if err := st.DeleteMailbox(ctx, u, v, stamp()); err != nil {
		t.Fatal(err)
	}
	reserveTo(t, st, u, v, 131073)
	if all, err := st.AllMessages(ctx, u, v); err != nil || len(all) != 0 {
		t.Fatalf("index after the mailbox's delete: %d records, %v", len(all), err)
	}
}

func TestBodies(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	u := user("body")
	small := []byte("Subject: hi\r\n\r\nhello\r\n")
	exact := bytes.Repeat([]byte("a"), chunkSize)
	big := make([]byte, 3_000_000)
	rand.Read(big)
	for _, c := range []struct {
		id     string
		data   []byte
		chunks int
	}{{"small", small, 0}, {"exact", exact, 0}, {"big", big, 3}, {"empty", nil, 0}} {
		n, err := st.PutBody(ctx, u, c.id, bytes.NewReader(c.data))
		if err != nil || n != int64(len(c.data)) {
			t.Fatalf("put %s: %d bytes, %v", c.id, n, err)
		}
		got, err := st.Body(ctx, u, c.id)
		if err != nil || !bytes.Equal(got, c.data) {
			t.Fatalf("body %s: %d bytes back of %d, %v", c.id, len(got), len(c.data), err)
		}
		_, chunks, _, err := st.blobHead(ctx, bodyTables, c.id, []any{userdb.Normalize(u), c.id})
		if err != nil || chunks != c.chunks {
			t.Fatalf("body %s of %d bytes: %d chunks, want %d (%v)", c.id, len(c.data), chunks, c.chunks, err)
		}
	}

	// The 3 MB body is read as a stream, one chunk of at most 1 MiB per
	// read of the table.
	r, size, err := st.OpenBody(ctx, u, "big")
	if err != nil || size != int64(len(big)) {
		t.Fatalf("open big: %d, %v", size, err)
	}
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got.Bytes(), big) {
		t.Fatal("streamed body differs")
	}
	if br, ok := r.(*blobReader); !ok || br.next != 3 {
		t.Fatalf("stream read %v chunks", r)
	}

	// A missing chunk is an error, not a short message.
	if err := st.write(ctx, `DELETE FROM body_chunks WHERE user = ? AND id = ? AND chunk = 1`, userdb.Normalize(u), "big").Exec(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Body(ctx, u, "big"); err == nil {
		t.Fatal("a body with a chunk missing was read")
	}

	for _, id := range []string{"small", "big"} {
		if err := st.DeleteBody(ctx, u, id); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Body(ctx, u, id); !errors.Is(err, mailbox.ErrNoMessage) {
			t.Fatalf("deleted body %s: %v", id, err)
		}
	}
	var left int
	if err := st.read(ctx, `SELECT COUNT(*) FROM body_chunks WHERE user = ? AND id = ? AND chunk = 0`, userdb.Normalize(u), "big").Scan(&left); err != nil || left != 0 {
		t.Fatalf("chunks left after delete: %d, %v", left, err)
	}
	if err := st.DeleteBody(ctx, u, "never"); err != nil {
		t.Fatalf("deleting a body that is not there: %v", err)
	}
}

func TestQueue(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	id := queue.NewID()
	e := &queue.Entry{ID: id, Stamp: stamp(), User: user("q"), From: "a@example.org", Created: time.Now().Truncate(time.Millisecond),
		Recipients: []queue.Recipient{{Address: "b@example.net", State: queue.Queued, NextTry: time.Now().Truncate(time.Millisecond)}}, Size: 3}
	later := e.Clone()
	later.Stamp = stamp()
	later.Recipients[0].State, later.Recipients[0].Attempts, later.Recipients[0].LastReply = queue.Delivered, 1, "250 ok"
	for _, x := range []*queue.Entry{later, e} {
		if err := st.PutQueueEntry(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.QueueEntry(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Recipients[0].State != queue.Delivered || got.Recipients[0].LastReply != "250 ok" || got.From != e.From || !got.Created.Equal(e.Created) {
		t.Fatalf("entry: %+v", got)
	}
	body := bytes.Repeat([]byte("x"), 2*chunkSize+5)
	if n, err := st.PutQueueMessage(ctx, id, bytes.NewReader(body)); err != nil || n != int64(len(body)) {
		t.Fatalf("queue message: %d, %v", n, err)
	}
	if b, err := st.QueueMessage(ctx, id); err != nil || !bytes.Equal(b, body) {
		t.Fatalf("queue message back: %d bytes, %v", len(b), err)
	}
	found := false
	if err := st.QueueEntries(ctx, func(x *queue.Entry) error {
		found = found || x.ID == id
		return nil
	}); err != nil || !found {
		t.Fatalf("listing: found %v, %v", found, err)
	}
	if err := st.DeleteQueueEntry(ctx, id, stamp()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.QueueEntry(ctx, id); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("deleted entry: %v", err)
	}
	if _, err := st.QueueMessage(ctx, id); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("deleted entry's message: %v", err)
	}
	if err := st.PutQueueEntry(ctx, &queue.Entry{ID: "nothex", Stamp: stamp()}); err == nil {
		t.Fatal("a bad queue id was stored")
	}
}

func TestClusterwide(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	kind := "k" + run
	a := clusterwide.Object{Name: kind + "/example.org", Stamp: stamp(), Data: []byte("v1")}
	b := clusterwide.Object{Name: kind + "/example.net", Stamp: stamp(), Data: []byte("other")}
	newer := a
	newer.Stamp, newer.Data = stamp(), []byte("v2")
	for _, o := range []clusterwide.Object{newer, b, a} {
		if err := st.PutObject(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	got, ok, err := st.Object(ctx, a.Name)
	if err != nil || !ok || string(got.Data) != "v2" || got.Stamp != newer.Stamp || got.Name != a.Name {
		t.Fatalf("object: %+v %v %v", got, ok, err)
	}
	list, err := st.Objects(ctx, kind)
	if err != nil || len(list) != 2 || list[0].Name != b.Name || list[1].Name != a.Name {
		t.Fatalf("objects of %s: %+v, %v", kind, list, err)
	}
	kinds, err := st.ObjectKinds(ctx)
	if err != nil || !slices.Contains(kinds, kind) {
		t.Fatalf("kinds: %v, %v", kinds, err)
	}
	tomb := clusterwide.Object{Name: b.Name, Stamp: stamp(), Deleted: true}
	if err := st.PutObject(ctx, tomb); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := st.Object(ctx, b.Name); err != nil || !ok || !got.Deleted || got.Data != nil {
		t.Fatalf("tombstone: %+v %v %v", got, ok, err)
	}
	if err := st.DeleteObject(ctx, b.Name, stamp()); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.Object(ctx, b.Name); err != nil || ok {
		t.Fatalf("after delete: %v %v", ok, err)
	}
	if err := st.PutObject(ctx, clusterwide.Object{Name: "noslash", Stamp: stamp()}); err == nil {
		t.Fatal("a bad object name was stored")
	}
}

func TestFence(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	u, v := user("fence"), uint32(3)
	a, err := st.Claim(ctx, u, v, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if a.Epoch != 1 || a.UIDReserved != 0 || a.ModSeqReserved != 0 {
		t.Fatalf("first claim: %+v", a)
	}
	if a, err = st.Reserve(ctx, a, 258, 258); err != nil {
		t.Fatal(err)
	}
	// B takes over: it starts at A's reserved ends.
	b, err := st.Claim(ctx, u, v, "node-b")
	if err != nil {
		t.Fatal(err)
	}
	if b.Epoch != 2 || b.UIDReserved != 258 || b.ModSeqReserved != 258 {
		t.Fatalf("takeover: %+v", b)
	}
	var def userdb.MailboxDef
	b.Into(&def)
	if def.UIDReserved != 258 || def.ModSeqReserved != 258 {
		t.Fatalf("Into: %+v", def)
	}
	// A, fenced, can neither reserve more nor give back.
	if _, err := st.Reserve(ctx, a, 600, 600); !errors.Is(err, ErrFenced) {
		t.Fatalf("fenced writer's reserve: %v, want ErrFenced", err)
	}
	if _, err := st.Release(ctx, a, 100, 100); !errors.Is(err, ErrFenced) {
		t.Fatalf("fenced writer's release: %v, want ErrFenced", err)
	}
	if b, err = st.Reserve(ctx, b, 514, 600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve(ctx, b, 300, 600); err == nil {
		t.Fatal("a reserve below the reserved end was accepted")
	}
	// B stops cleanly at UID 300, MODSEQ 310: the next writer starts
	// there.
	if b, err = st.Release(ctx, b, 300, 310); err != nil {
		t.Fatal(err)
	}
	cur, err := st.Reservations(ctx, u, v)
	if err != nil || cur.Owner != "node-b" || cur.Epoch != 2 || cur.UIDReserved != 300 || cur.ModSeqReserved != 310 {
		t.Fatalf("after release: %+v, %v", cur, err)
	}
	c, err := st.Claim(ctx, u, v, "node-c")
	if err != nil || c.Epoch != 3 || c.UIDReserved != 300 {
		t.Fatalf("claim after release: %+v, %v", c, err)
	}
}

// simWriter hands out UIDs as the native writer does (writer/view.go's
// counters): only below an end it reserved, a block past what it needs,
// starting at the reserved end when it claims.
type simWriter struct {
	st      *Store
	owner   string
	f       Fence
	uidNext uint32
	modseq  uint64
	handed  []uint32
	fenced  int
}

const simBlock = 16

func (w *simWriter) claim(ctx context.Context, u string, v uint32) error {
	f, err := w.st.Claim(ctx, u, v, w.owner)
	if err != nil {
		return err
	}
	w.f, w.uidNext, w.modseq = f, max(f.UIDReserved, 1), f.ModSeqReserved
	return nil
}

// deliver hands out n UIDs, reserving first when they are not covered.
func (w *simWriter) deliver(ctx context.Context, u string, v uint32, n int) error {
	if uint64(w.uidNext)+uint64(n) > uint64(w.f.UIDReserved) || w.modseq+uint64(n) >= w.f.ModSeqReserved {
		f, err := w.st.Reserve(ctx, w.f, w.uidNext+uint32(n)+simBlock, w.modseq+uint64(n)+simBlock)
		for try := 0; Retryable(err) && try < 5; try++ {
			// The outcome is unknown: the ends may have moved or not;
			// the same reservation again settles it.
			f, err = w.st.Reserve(ctx, w.f, w.uidNext+uint32(n)+simBlock, w.modseq+uint64(n)+simBlock)
		}
		if errors.Is(err, ErrFenced) {
			w.fenced++
			return w.claim(ctx, u, v) // taken over: take it back
		}
		if err != nil {
			return err
		}
		w.f = f
	}
	for range n {
		w.handed = append(w.handed, w.uidNext)
		w.uidNext++
		w.modseq++
	}
	return nil
}

// Two writers on two sessions (two nodes) race for one mailbox, each
// claiming it back whenever it finds itself fenced: no UID is handed out
// twice, and each writer's UIDs only grow.
func TestFenceRace(t *testing.T) {
	ctx := ctxT(t)
	cfg := testConfig(t, "quill_test")
	open(t)
	// Whether a writer is fenced mid-work depends on how the two
	// interleave (a reservation must fall between the other's claims):
	// a loaded machine can keep them apart for a whole race, so a race in
	// which nobody was fenced is run again, on a mailbox of its own.
	const attempts = 4
	for attempt := range attempts {
		if fenced := fenceRace(t, ctx, cfg, user(fmt.Sprintf("race%d", attempt)), 1); fenced > 0 || t.Failed() {
			return
		}
	}
	t.Errorf("the writers never fenced each other in %d races: the race was not run", attempts)
}

// fenceRace runs one race of TestFenceRace and returns how many times the
// writers were fenced.
func fenceRace(t *testing.T, ctx context.Context, cfg Config, u string, v uint32) int {
	var ws []*simWriter
	for _, name := range []string{"node-a", "node-b"} {
		st, err := Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		ws = append(ws, &simWriter{st: st, owner: name})
	}
	const rounds = 60
	var claimed sync.WaitGroup
	claimed.Add(len(ws))
	together(t, len(ws), func(i int) error {
		w := ws[i]
		err := w.claim(ctx, u, v)
		claimed.Done()
		if err != nil {
			return err
		}
		claimed.Wait()
		for r := range rounds {
			// A pause of up to 2 ms between deliveries, so the two
			// writers' steps interleave in time rather than by the
			// scheduler's chance.
			time.Sleep(time.Duration(mrand.IntN(2000)) * time.Microsecond)
			// Now and then a writer claims the mailbox although it holds
			// it (a manager that believes the bucket moved to it): the
			// other is fenced in the middle of its work.
			if r%5 == 2*i {
				if err := w.claim(ctx, u, v); err != nil {
					return err
				}
			}
			if err := w.deliver(ctx, u, v, 1+(r+i)%5); err != nil {
				return err
			}
		}
		return nil
	})
	seen := map[uint32]string{}
	for _, w := range ws {
		if !slices.IsSorted(w.handed) {
			t.Errorf("%s handed out UIDs out of order", w.owner)
		}
		for _, uid := range w.handed {
			if other, dup := seen[uid]; dup {
				t.Fatalf("UID %d handed out by %s and %s", uid, other, w.owner)
			}
			seen[uid] = w.owner
		}
	}
	t.Logf("%d UIDs handed out; fenced: %s %d times, %s %d times", len(seen), ws[0].owner, ws[0].fenced, ws[1].owner, ws[1].fenced)
	return ws[0].fenced + ws[1].fenced
}

func TestMigrationsRunOnce(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	before, err := st.Migrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Open(ctx, testConfig(t, "quill_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	after, err := again.Migrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != SchemaVersion() || !slices.Equal(before, after) {
		t.Fatalf("migrations before a second open %+v, after %+v", before, after)
	}
	for _, m := range after {
		if !m.Done {
			t.Errorf("migration %d not done", m.Version)
		}
	}
}

// A try of a migration that claimed it and then timed out (a busy
// cluster) leaves this process's claim: the next try runs the migration
// at once instead of waiting for itself (and, after migrationStale,
// taking its own claim over, which a bench under heavy load saw).
func TestMigrationRetryKeepsItsOwnClaim(t *testing.T) {
	st, ctx := open(t), ctxT(t)
	const v = 1 << 20 // far past the real migrations; deleted below
	me := claimant()
	if err := st.write(ctx, `INSERT INTO schema_version (version, name, claimed_by, claimed_at, done) VALUES (?, ?, ?, ?, false)`,
		v, "test", me, time.Now()).Exec(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.write(context.Background(), `DELETE FROM schema_version WHERE version = ?`, v).Exec() })
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	m := migration{name: "test", stmts: []string{`CREATE TABLE IF NOT EXISTS retry_own_claim (k int PRIMARY KEY)`}}
	if err := st.tryMigration(short, v, m, me); err != nil {
		t.Fatalf("retry of our own claimed migration: %v", err)
	}
	t.Cleanup(func() { st.s.Query(`DROP TABLE IF EXISTS retry_own_claim`).Exec() })
	var done bool
	if err := st.read(ctx, `SELECT done FROM schema_version WHERE version = ?`, v).Scan(&done); err != nil || !done {
		t.Fatalf("migration not marked done: %v, %v", done, err)
	}
}

// Two nodes open a new keyspace at once: one applies each migration, the
// other waits for it, and every table has its fixed id.
func TestMigrationsConcurrent(t *testing.T) {
	ctx := ctxT(t)
	ks := "quill_mig_" + run
	cfg := testConfig(t, ks)
	stores := make([]*Store, 2)
	t.Cleanup(func() {
		for _, st := range stores {
			if st != nil {
				st.Close()
			}
		}
	})
	together(t, len(stores), func(i int) (err error) {
		stores[i], err = Open(ctx, cfg)
		return err
	})
	t.Cleanup(func() { stores[0].s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec() })
	ms, err := stores[0].Migrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != SchemaVersion() {
		t.Fatalf("%d migrations recorded, want %d", len(ms), SchemaVersion())
	}
	for _, m := range ms {
		if !m.Done || m.ClaimedBy == "" {
			t.Errorf("migration %+v", m)
		}
	}
	it := stores[1].read(ctx, `SELECT table_name, id FROM system_schema.tables WHERE keyspace_name = ?`, ks).Iter()
	var name string
	var id gocql.UUID
	n := 0
	for it.Scan(&name, &id) {
		n++
		if want := tableID(ks, name); id.String() != want {
			t.Errorf("table %s has id %s, want %s", name, id, want)
		}
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if n != 11 {
		t.Errorf("%d tables in %s, want 11", n, ks)
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]string{"3": "3", "dc1:3,dc2:2": "dc1:3,dc2:2", " dc2:1 , dc1:2": "dc1:2,dc2:1"} {
		r, err := ParseReplication(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseReplication(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	for _, bad := range []string{"0", "", "dc1", "dc1:x", "d'c:1", "-1"} {
		if _, err := ParseReplication(bad); err == nil {
			t.Errorf("ParseReplication(%q) accepted", bad)
		}
	}
	r, _ := ParseReplication("dc1:3,dc2:2")
	if got := r.cql(); got != "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}" {
		t.Errorf("cql: %s", got)
	}
	for _, s := range []string{"one", "QUORUM", "all", "local_quorum"} {
		if _, err := ParseConsistency(s); err != nil {
			t.Errorf("ParseConsistency(%q): %v", s, err)
		}
	}
	if _, err := ParseConsistency("TWO"); err == nil {
		t.Error("ParseConsistency(TWO) accepted")
	}
	if _, err := stamped("x", 0); err == nil {
		t.Error("stamp 0 accepted")
	}
	if _, err := stamped("x", math.MaxUint64); err == nil {
		t.Error("stamp 2^64-1 accepted")
	}
	if tableID("mail", "users") == tableID("mail", "mailboxes") || tableID("a", "users") == tableID("b", "users") {
		t.Error("table ids repeat")
	}
}

// What Retryable says of the errors a write meets when its coordinator is
// killed (seen in tests/cassandra's fault run), and of errors a retry
// cannot mend.
func TestRetryable(t *testing.T) {
	lost := []error{
		fmt.Errorf("message x of u: write: %w", fmt.Errorf("gocql: failed to read non self-contained frame: %w", io.EOF)),
		fmt.Errorf("write: %w", gocql.ErrConnectionClosed),
		fmt.Errorf("write: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}),
		fmt.Errorf("write: %w", &gocql.RequestErrWriteTimeout{}),
		fmt.Errorf("write: %w", gocql.ErrNoConnections),
	}
	for _, err := range lost {
		if !Retryable(err) {
			t.Errorf("Retryable(%v) = false", err)
		}
	}
	// The message's source failing (its client's connection reset) is the
	// caller's error, not a lost connection to Cassandra.
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	_, srcErr := open(t).PutBody(ctxT(t), user("retry"), "m1", iotest.ErrReader(reset))
	if srcErr == nil {
		t.Fatal("PutBody from a failing reader succeeded")
	}
	// A source cut short that says so with io.ErrUnexpectedEOF (what a
	// reader of a stream of known length does) is refused like any other
	// failure, in the first chunk and after it, not stored as the message.
	st := open(t)
	for _, n := range []int{100, chunkSize + 100} {
		cut := io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("x"), n)), iotest.ErrReader(io.ErrUnexpectedEOF))
		id := fmt.Sprintf("cut%d", n)
		if _, err := st.PutBody(ctxT(t), user("retry"), id, cut); err == nil || Retryable(err) {
			t.Errorf("PutBody of %d bytes then io.ErrUnexpectedEOF: %v, want a final error", n, err)
		}
		if _, err := st.Body(ctxT(t), user("retry"), id); !errors.Is(err, mailbox.ErrNoMessage) {
			t.Errorf("a body cut short after %d bytes was stored: %v", n, err)
		}
	}
	for _, err := range []error{errors.New("user bob: message without an id"), mailbox.ErrNoMessage, context.Canceled, srcErr} {
		if Retryable(err) {
			t.Errorf("Retryable(%v) = true", err)
		}
	}
}

// A mailbox of 100,000 messages (QUILL_CASSANDRA_LARGE=1, make
// cassandra-large): written by 32 writers at once, read back whole and by
// a range across a partition boundary, in UID order.
func TestLargeMailbox(t *testing.T) {
	if os.Getenv("QUILL_CASSANDRA_LARGE") == "" {
		t.Skip("set QUILL_CASSANDRA_LARGE=1 (make cassandra-large)")
	}
	st := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	u, v := user("large"), uint32(1)
	const n = 100_000
	reserveTo(t, st, u, v, n+1)
	began := time.Now()
	together(t, 32, func(w int) error {
		for uid := uint32(1 + w); uid <= n; uid += 32 {
			m := &mailbox.Message{UID: uid, ID: fmt.Sprintf("%029d", uid), Size: 4700, Date: time.Now(),
				Flags: []string{`\Seen`}, ModSeq: uint64(uid), Version: stamp()}
			if err := st.PutMessage(ctx, u, v, m); err != nil {
				return err
			}
		}
		return nil
	})
	wrote := time.Since(began)
	began = time.Now()
	all, err := st.AllMessages(ctx, u, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n {
		t.Fatalf("%d records read back, want %d", len(all), n)
	}
	for i, m := range all {
		if m.UID != uint32(i+1) {
			t.Fatalf("record %d has UID %d", i, m.UID)
		}
	}
	t.Logf("%d index records written in %s, read in %s", n, wrote.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	var got int
	if err := st.Messages(ctx, u, v, 65000, 66000, func(*mailbox.Message) error { got++; return nil }); err != nil || got != 1001 {
		t.Fatalf("UIDs 65000:66000: %d records, %v", got, err)
	}
}
