package cassandra_test

// The writer (internal/writer) on Cassandra storage (WriterStorage), against
// the real Cassandra of this package's test binary: a writer.Manager
// allocates, confirms, changes flags, expunges, copies and moves with every
// change in the keyspace, and two writers ("nodes") on one mailbox, one
// taken over mid-stream and then both at once, never hand out a UID twice
// while each session's view only grows (issue 15 item 3 at writer level).
//
// What stands in for the rest of a node: bucketUsers plays the user
// manager's part for the writer (which node manages the bucket, profiles
// read from and written to Cassandra) until the user manager has its
// Cassandra half; the test does the delivering proxy's part (PutBody,
// PutMessage under the allocated UID, Confirm), as the proxy will.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/cassandra/cassandratest"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
)

// testRF is the test keyspaces' replication (QUILL_CASSANDRA_RF, 1 by
// default).
func testRF() string {
	if rs := os.Getenv("QUILL_CASSANDRA_RF"); rs != "" {
		return rs
	}
	return "1"
}

// openStore opens a keyspace (made if missing).
func openStore(t *testing.T, keyspace string) *cassandra.Store {
	t.Helper()
	r, err := cassandra.ParseReplication(testRF())
	if err != nil {
		t.Fatal(err)
	}
	st, err := cassandra.Open(context.Background(), cassandra.Config{Hosts: cassandratest.Hosts(t), Keyspace: keyspace, Replication: r})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// bucketUsers is the user manager's part for one node's writer: whether the
// node manages the user's bucket now, and the profiles, in Cassandra.
type bucketUsers struct {
	st     *cassandra.Store
	clock  *hlc.Clock
	node   cluster.NodeID
	tenure atomic.Uint64 // 0: not managed here
}

func (u *bucketUsers) Managed(_ context.Context, user string) (uint64, error) {
	if t := u.tenure.Load(); t != 0 {
		return t, nil
	}
	return 0, fmt.Errorf("user %s: node %s: %w", user, u.node, rpc.ErrNotManager)
}

func (u *bucketUsers) Profile(user string) (*userdb.Profile, error) {
	p, err := u.st.Profile(context.Background(), user)
	if errors.Is(err, userdb.ErrNotFound) {
		return nil, nil
	}
	return p, err
}

func (u *bucketUsers) SaveProfile(ctx context.Context, p *userdb.Profile, _ int) error {
	p.Version = u.clock.Now()
	p.Updated = time.Now().UTC()
	return u.st.PutProfile(ctx, p)
}

// The mail map and the audit are the native store's: Cassandra holds every
// user's mail.
func (u *bucketUsers) MailMap(context.Context, string) ([]cluster.NodeID, error) { return nil, nil }
func (u *bucketUsers) Note(context.Context, string, cluster.NodeID) error        { return nil }
func (u *bucketUsers) ViewGen(string) uint64                                     { return u.tenure.Load() }
func (u *bucketUsers) CompleteBuckets() []uint8                                  { return nil }
func (u *bucketUsers) MissingFromMailMap(string, cluster.NodeID) (bool, bool)    { return false, false }
func (u *bucketUsers) NoteAndReload(string, cluster.NodeID)                      {}
func (u *bucketUsers) Forget(string, cluster.NodeID)                             {}

// noPeers: the writer asks its peers only who is alive (allocations from a
// node that left expire; these come from no node) and, through For, who
// manages a user (the test calls Local).
type noPeers struct{ cluster.Conns }

func (noPeers) UserMap() cluster.UserMap    { return cluster.UserMap{} }
func (noPeers) Alive() []cluster.MemberInfo { return nil }
func (noPeers) Eligible(uint8) ([]cluster.MemberInfo, error) {
	return nil, nil
}

// node is one writer on Cassandra storage.
type node struct {
	users *bucketUsers
	store *cassandra.WriterStorage
	m     *writer.Manager
	s     writer.Service
}

func newNode(t *testing.T, st *cassandra.Store, id cluster.NodeID, user string) *node {
	clock := hlc.New()
	log := slog.New(slog.DiscardHandler)
	n := &node{users: &bucketUsers{st: st, clock: clock, node: id}, store: cassandra.NewWriterStorage(st, id, clock, log)}
	n.m = writer.New(id, n.users, n.store, noPeers{}, clock, log)
	n.s = n.m.Local()
	t.Cleanup(n.m.Close)
	return n
}

// take makes the node manage the user's bucket in a new tenure (as the user
// manager's Open does), with fresh writers.
func (n *node) take(user string, tenure uint64) {
	n.m.Open(cluster.Bucket(user), tenure)
	n.users.tenure.Store(tenure)
}

// deliver stores a message as the delivering proxy does: a UID from the
// writer, the body and the index record in Cassandra, then Confirm.
func deliver(ctx context.Context, st *cassandra.Store, s writer.Service, user, box string, body []byte) (mailbox.Placed, error) {
	a, err := s.Alloc(ctx, &writer.AllocRequest{User: user, Mailbox: box})
	if err != nil {
		return mailbox.Placed{}, err
	}
	pl := a.Place
	msg := mailbox.Message{UID: pl.UID, ID: fmt.Sprintf("m-%d-%d-%x", pl.UIDValidity, pl.UID, time.Now().UnixNano()), Size: int64(len(body)),
		Date: time.Now().UTC().Truncate(time.Millisecond), ModSeq: pl.ModSeq, Version: replica.Stamp{Clock: hlc.New().Now(), Node: "proxy"}}
	if _, err := st.PutBody(ctx, user, msg.ID, bytes.NewReader(body)); err != nil {
		return pl, err
	}
	if err := st.PutMessage(ctx, user, pl.UIDValidity, &msg); err != nil {
		return pl, err
	}
	return pl, s.Confirm(ctx, &writer.ConfirmRequest{Place: pl, Message: msg})
}

func uidsOfView(t *testing.T, s writer.Service, user string, id uint64) ([]uint32, *writer.MessagesReply) {
	t.Helper()
	r, err := s.Messages(context.Background(), &writer.MailboxRequest{User: user, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	var uids []uint32
	for _, vm := range r.Messages {
		uids = append(uids, vm.UID)
	}
	return uids, r
}

func indexUIDs(t *testing.T, st *cassandra.Store, user string, v uint32) map[uint32]mailbox.Message {
	t.Helper()
	all, err := st.AllMessages(context.Background(), user, v)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]mailbox.Message{}
	for _, m := range all {
		out[m.UID] = m
	}
	return out
}

// TestWriterOnCassandra: a writer's every kind of change, in the keyspace
// as quill migrate lays it out (the keyspace, a test's own, is migrated
// into a native data directory at the end, verified, and served), then a
// failover to a second writer and a clean handover to a third.
func TestWriterOnCassandra(t *testing.T) {
	keyspace := "quill_writer_" + randomName()
	st := openStore(t, keyspace)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user := "writer-" + randomName() + "@example.org"
	a := newNode(t, st, "a", user)
	a.take(user, 1)
	if _, err := a.s.Apply(ctx, &writer.ApplyRequest{Op: "add", Address: user, Hash: "x"}); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Mailboxes(ctx, user)
	if err != nil || len(recs) != len(mailbox.DefaultMailboxes) {
		t.Fatalf("mailbox records after add: %v, %v; want %d", recs, err, len(mailbox.DefaultMailboxes))
	}
	inbox := func(s writer.Service) mailbox.Mailbox {
		r, err := s.Messages(ctx, &writer.MailboxRequest{User: user, Name: "INBOX"})
		if err != nil {
			t.Fatal(err)
		}
		return r.Mailbox
	}
	in := inbox(a.s)
	bodies := map[uint32][]byte{}
	for i := range 5 {
		body := message(i, 2000+i)
		pl, err := deliver(ctx, st, a.s, user, "INBOX", body)
		if err != nil {
			t.Fatal(err)
		}
		bodies[pl.UID] = body
	}
	uids, r := uidsOfView(t, a.s, user, in.ID)
	if !slices.Equal(uids, []uint32{1, 2, 3, 4, 5}) || r.Mailbox.UIDNext != 6 {
		t.Fatalf("view after 5 deliveries: %v, UIDNEXT %d", uids, r.Mailbox.UIDNext)
	}
	f, err := st.Reservations(ctx, user, in.UIDValidity)
	if err != nil || f.Owner != a.store.Owner() || f.UIDReserved < 6 {
		t.Fatalf("fence after deliveries: %+v, %v (owner %s)", f, err, a.store.Owner())
	}

	// STORE: the index record's flags and MODSEQ.
	fr, err := a.s.StoreFlags(ctx, &writer.FlagsRequest{User: user, ID: in.ID, UIDs: []uint32{2, 3}, Op: mailbox.FlagsAdd, Flags: []string{`\Seen`}})
	if err != nil || len(fr.Updated) != 2 {
		t.Fatalf("store: %+v, %v", fr, err)
	}
	m2, err := st.Message(ctx, user, in.UIDValidity, 2)
	if err != nil || !slices.Contains(m2.Flags, `\Seen`) || m2.ModSeq != fr.Updated[0].ModSeq {
		t.Fatalf("uid 2 in Cassandra after STORE: %+v, %v; want \\Seen at MODSEQ %d", m2, err, fr.Updated[0].ModSeq)
	}

	// EXPUNGE: record and body gone, HIGHESTMODSEQ kept in the mailbox's
	// record for the next writer.
	if _, err := a.s.StoreFlags(ctx, &writer.FlagsRequest{User: user, ID: in.ID, UIDs: []uint32{3}, Op: mailbox.FlagsAdd, Flags: []string{`\Deleted`}}); err != nil {
		t.Fatal(err)
	}
	m3, _ := st.Message(ctx, user, in.UIDValidity, 3)
	ex, err := a.s.Expunge(ctx, &writer.FlagsRequest{User: user, ID: in.ID, UIDs: []uint32{1, 2, 3, 4, 5}, OnlyDeleted: true})
	if err != nil || !slices.Equal(ex.UIDs, []uint32{3}) {
		t.Fatalf("expunge: %+v, %v", ex, err)
	}
	if _, err := st.Message(ctx, user, in.UIDValidity, 3); !errors.Is(err, mailbox.ErrNoMessage) {
		t.Fatalf("uid 3 after expunge: %v", err)
	}
	if _, err := st.Body(ctx, user, m3.ID); err == nil {
		t.Fatal("an expunged message's body is still there")
	}
	afterExpunge := inbox(a.s)

	// COPY: a new message id with its own copy of the bytes; MOVE: the
	// same id at its new place, gone from the old.
	arch, err := a.s.Create(ctx, &writer.MailboxRequest{User: user, Name: "Saved"})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := a.s.Copy(ctx, &writer.CopyRequest{User: user, ID: in.ID, UIDs: []uint32{1}, Dest: "Saved"})
	if err != nil || !slices.Equal(cp.DstUIDs, []uint32{1}) {
		t.Fatalf("copy: %+v, %v", cp, err)
	}
	mv, err := a.s.Copy(ctx, &writer.CopyRequest{User: user, ID: in.ID, UIDs: []uint32{2}, Dest: "Saved", Move: true})
	if err != nil || !slices.Equal(mv.DstUIDs, []uint32{2}) {
		t.Fatalf("move: %+v, %v", mv, err)
	}
	src, dst := indexUIDs(t, st, user, in.UIDValidity), indexUIDs(t, st, user, arch.UIDValidity)
	if _, ok := src[2]; ok || len(src) != 3 || len(dst) != 2 {
		t.Fatalf("after copy and move: INBOX %v, Saved %v", src, dst)
	}
	if dst[1].ID == src[1].ID {
		t.Fatalf("the copy shares the original's id %s", dst[1].ID)
	}
	for uid, want := range map[uint32][]byte{1: bodies[1], 2: bodies[2]} {
		got, err := st.Body(ctx, user, dst[uid].ID)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Saved uid %d's bytes: %d bytes, %v; want %d", uid, len(got), err, len(want))
		}
	}
	if !slices.Contains(dst[2].Flags, `\Seen`) {
		t.Fatalf("the moved message lost its flags: %v", dst[2].Flags)
	}

	// CREATE, RENAME, DELETE in the mailboxes table.
	if _, err := a.s.Create(ctx, &writer.MailboxRequest{User: user, Name: "Work"}); err != nil {
		t.Fatal(err)
	}
	if err := a.s.Rename(ctx, &writer.MailboxRequest{User: user, Name: "Work", NewName: "Projects"}); err != nil {
		t.Fatal(err)
	}
	proj, err := st.MailboxByName(ctx, user, "Projects")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.MailboxByName(ctx, user, "Work"); !errors.Is(err, mailbox.ErrNoMailbox) {
		t.Fatalf("the old name is still a mailbox: %v", err)
	}
	if _, err := deliver(ctx, st, a.s, user, "Projects", message(9, 100)); err != nil {
		t.Fatal(err)
	}
	if err := a.s.Delete(ctx, &writer.MailboxRequest{User: user, Name: "Projects"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.MailboxByName(ctx, user, "Projects"); !errors.Is(err, mailbox.ErrNoMailbox) {
		t.Fatalf("a deleted mailbox's record: %v", err)
	}
	if left := indexUIDs(t, st, user, proj.UIDValidity); len(left) != 0 {
		t.Fatalf("a deleted mailbox's index: %v", left)
	}

	// A second node takes the bucket over (a failover: no handoff): it
	// shows what the first wrote and hands out UIDs past every block the
	// first reserved. The first, fenced, is refused at its next operation
	// (not only at its next block), and drops its state.
	f, _ = st.Reservations(ctx, user, in.UIDValidity)
	b := newNode(t, st, "b", user)
	b.take(user, 2)
	bin := inbox(b.s)
	if bin.UIDNext != afterExpunge.UIDNext || bin.HighestModSeq < afterExpunge.HighestModSeq {
		t.Fatalf("the next writer shows UIDNEXT %d, HIGHESTMODSEQ %d; the first showed %d, %d", bin.UIDNext, bin.HighestModSeq,
			afterExpunge.UIDNext, afterExpunge.HighestModSeq)
	}
	buids, _ := uidsOfView(t, b.s, user, in.ID)
	if !slices.Equal(buids, []uint32{1, 4, 5}) {
		t.Fatalf("the next writer's view: %v, want 1 4 5", buids)
	}
	pl, err := deliver(ctx, st, b.s, user, "INBOX", message(10, 100))
	if err != nil || pl.UID < f.UIDReserved {
		t.Fatalf("the next writer's first UID %d (%v), below the first writer's reserved end %d", pl.UID, err, f.UIDReserved)
	}
	if q, err := deliver(ctx, st, a.s, user, "INBOX", message(11, 100)); !errors.Is(err, writer.ErrFenced) {
		t.Fatalf("the fenced writer handed out UID %d (%v)", q.UID, err)
	}

	// A clean shutdown gives the rest of the block back: the writer after
	// it continues at the next UID.
	next, _ := deliver(ctx, st, b.s, user, "INBOX", message(12, 100))
	b.m.Release(ctx)
	c := newNode(t, st, "c", user)
	c.take(user, 3)
	got, err := deliver(ctx, st, c.s, user, "INBOX", message(13, 100))
	if err != nil || got.UID != next.UID+1 {
		t.Fatalf("after a release at UID %d the next writer handed out %d (%v), want %d", next.UID, got.UID, err, next.UID+1)
	}

	// What the writers wrote is a keyspace quill migrate reads: copied
	// into a new data directory with no difference, and served from it.
	want, err := c.s.Messages(ctx, &writer.MailboxRequest{User: user, Name: "INBOX"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() + "/native"
	url := "cassandra://" + strings.Join(cassandratest.Hosts(t), ",") + "/" + keyspace + "?rf=" + testRF()
	res, out, err := migrate(t, url, dir, false)
	if err != nil || len(res.Differences) != 0 {
		t.Fatalf("migrate the writers' keyspace: %v\n%s", err, out)
	}
	t.Logf("migrated: %d messages copied, %d verified", res.Copied.Messages, res.Verified)
	nc, s := openNode(t, dir)
	defer nc.Close()
	nin := inboxOf(t, s, user, "INBOX")
	if nin.UIDNext != want.Mailbox.UIDNext || nin.HighestModSeq < want.Mailbox.HighestModSeq {
		t.Fatalf("served natively: UIDNEXT %d, HIGHESTMODSEQ %d; the writer showed %d, %d", nin.UIDNext, nin.HighestModSeq,
			want.Mailbox.UIDNext, want.Mailbox.HighestModSeq)
	}
	var wantUIDs []uint32
	for _, vm := range want.Messages {
		wantUIDs = append(wantUIDs, vm.UID)
	}
	if got := uidsOf(t, s, user, nin); !slices.Equal(got, wantUIDs) {
		t.Fatalf("served natively: UIDs %v, the writer showed %v", got, wantUIDs)
	}
}

func TestWritersTakeOverOnCassandra(t *testing.T) {
	st := openStore(t, "quill_test")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	user := "takeover-" + randomName() + "@example.org"
	a, b := newNode(t, st, "a", user), newNode(t, st, "b", user)
	a.take(user, 1)
	if _, err := a.s.Apply(ctx, &writer.ApplyRequest{Op: "add", Address: user, Hash: "x"}); err != nil {
		t.Fatal(err)
	}
	r, err := a.s.Messages(ctx, &writer.MailboxRequest{User: user, Name: "INBOX"})
	if err != nil {
		t.Fatal(err)
	}
	v := r.Mailbox.UIDValidity

	var mu sync.Mutex
	handed := map[uint32]string{} // UID -> the node that handed it out
	stored := 0
	var failures []string
	deliverVia := func(n *node, name string, count int) {
		for i := 0; i < count && ctx.Err() == nil; i++ {
			pl, err := deliver(ctx, st, n.s, user, "INBOX", message(i, 300))
			mu.Lock()
			if pl.UID != 0 {
				if by, dup := handed[pl.UID]; dup {
					failures = append(failures, fmt.Sprintf("UID %d handed out by %s and again by %s", pl.UID, by, name))
				}
				handed[pl.UID] = name
				if err == nil {
					stored++
				}
			}
			mu.Unlock()
		}
	}
	// session polls a node's view of INBOX while it manages the bucket:
	// a UID once shown stays, UIDNEXT and HIGHESTMODSEQ never go down. A
	// UID that appears below one shown before (a delivery the other writer
	// allocated before it was fenced, confirmed after) is counted.
	var lateLower atomic.Int64
	session := func(n *node, name string, stop <-chan struct{}, done *sync.WaitGroup) {
		defer done.Done()
		seen := map[uint32]bool{}
		var uidNext uint32
		var modseq uint64
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			r, err := n.s.Messages(ctx, &writer.MailboxRequest{User: user, ID: uint64(v)})
			if err != nil {
				continue // fenced, or not the manager now
			}
			now := map[uint32]bool{}
			var top uint32
			for uid := range seen {
				top = max(top, uid)
			}
			for _, vm := range r.Messages {
				now[vm.UID] = true
				if !seen[vm.UID] && vm.UID < top {
					lateLower.Add(1)
				}
			}
			mu.Lock()
			for uid := range seen {
				if !now[uid] {
					failures = append(failures, fmt.Sprintf("session on %s: UID %d shown, then gone", name, uid))
				}
			}
			if r.Mailbox.UIDNext < uidNext || r.Mailbox.HighestModSeq < modseq {
				failures = append(failures, fmt.Sprintf("session on %s: UIDNEXT %d after %d, HIGHESTMODSEQ %d after %d", name,
					r.Mailbox.UIDNext, uidNext, r.Mailbox.HighestModSeq, modseq))
			}
			mu.Unlock()
			seen, uidNext, modseq = now, r.Mailbox.UIDNext, r.Mailbox.HighestModSeq
		}
	}
	run := func(phase string, fn func()) {
		stop := make(chan struct{})
		var sessions sync.WaitGroup
		sessions.Add(2)
		go session(a, "a", stop, &sessions)
		go session(b, "b", stop, &sessions)
		fn()
		close(stop)
		sessions.Wait()
		t.Logf("%s: %d UIDs handed out so far", phase, len(handed))
	}
	var wg sync.WaitGroup
	// 1. a manages; 2. b takes the bucket over mid-stream (a failover:
	// nothing handed over) while a, paused rather than dead, goes on
	// delivering as if it still managed, until the fence refuses it and
	// then whenever it claims the mailbox back; 3. b alone.
	run("a manages", func() { deliverVia(a, "a", 300) })
	run("b takes over while a goes on", func() {
		b.take(user, 2)
		wg.Add(4)
		for range 2 {
			go func() { defer wg.Done(); deliverVia(a, "a", 150) }()
			go func() { defer wg.Done(); deliverVia(b, "b", 150) }()
		}
		wg.Wait()
	})
	a.users.tenure.Store(0)
	run("b alone", func() { deliverVia(b, "b", 100) })

	index := indexUIDs(t, st, user, v)
	if len(index) != stored {
		failures = append(failures, fmt.Sprintf("%d messages in the index, %d confirmed stored", len(index), stored))
	}
	for uid := range index {
		if _, ok := handed[uid]; !ok {
			failures = append(failures, fmt.Sprintf("UID %d in the index was never handed out", uid))
		}
	}
	fence, _ := st.Reservations(ctx, user, v)
	for uid := range handed {
		if uid >= fence.UIDReserved {
			failures = append(failures, fmt.Sprintf("UID %d handed out past the reserved end %d", uid, fence.UIDReserved))
		}
	}
	// Deliveries a allocated before it learnt it was fenced and stored
	// after b loaded its view show in b's within the writer's
	// partialRetry (the view is read again at each use for a minute after
	// a takeover).
	var shown int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, br := uidsOfView(t, b.s, user, uint64(v))
		if shown = len(br.Messages); shown == stored || time.Now().After(deadline) {
			break
		}
	}
	if shown != stored {
		failures = append(failures, fmt.Sprintf("b's view has %d messages 5 s after the last delivery, %d stored", shown, stored))
	}
	t.Logf("%d UIDs handed out, %d messages stored, fence epoch %d, %d UIDs a session saw appear below one shown before, highest UID %d",
		len(handed), stored, fence.Epoch, lateLower.Load(),
		slices.Max(slices.Collect(func(yield func(uint32) bool) {
			for u := range handed {
				if !yield(u) {
					return
				}
			}
		})))
	if len(failures) > 0 {
		t.Fatalf("%d failures, the first: %v", len(failures), failures[:min(len(failures), 10)])
	}
}
