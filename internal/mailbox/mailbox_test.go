package mailbox

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

func newManager(t testing.TB) (*Manager, string) {
	dir := t.TempDir()
	db, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	m := New(db)
	m.Self = "n-test"
	return m, dir
}

const v1 = 1700000000 // a UIDVALIDITY

// reopen closes m's store and returns a manager on the store reopened.
func reopen(t *testing.T, m *Manager, dir string) *Manager {
	t.Helper()
	m.db.Close()
	db, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	n := New(db)
	n.Self = m.Self
	return n
}

func place(user, name string, v uint32, uid uint32, modseq uint64) Placed {
	return Placed{User: user, Mailbox: name, UIDValidity: v, UID: uid, ModSeq: modseq}
}

func fragment(t *testing.T, m *Manager, user string, v uint32) *FragmentDigest {
	t.Helper()
	d, err := m.Fragment(user, v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestStoreAtAndRead(t *testing.T) {
	m, dir := newManager(t)
	raw := []byte("Subject: hi\r\n\r\n.dot line\r\n\xe9\r\n")
	id := m.NewMessageID()
	err := m.StoreAt([]Placed{place("a@x.org", "INBOX", v1, 7, 9), place("b@x.org", "INBOX", v1+1, 1, 2)}, id, raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user string
		v    uint32
		uid  uint32
	}{{"a@x.org", v1, 7}, {"b@x.org", v1 + 1, 1}} {
		d := fragment(t, m, c.user, c.v)
		if len(d.Messages) != 1 || d.Messages[0].UID != c.uid || d.UIDNext != c.uid+1 {
			t.Fatalf("%s: %+v", c.user, d)
		}
		body, err := m.Body(c.user, id)
		if err != nil || !bytes.Equal(body, raw) {
			t.Fatalf("%s: body %q err %v", c.user, body, err)
		}
	}
	// Under the same name, INBOX is found by the POP3/SMTP readers too.
	if mb, err := m.Mailbox("a@x.org", "inbox"); err != nil || mb.UIDValidity != v1 {
		t.Fatalf("INBOX record %+v %v", mb, err)
	}
	// Durable across a reopen.
	m = reopen(t, m, dir)
	if d := fragment(t, m, "a@x.org", v1); len(d.Messages) != 1 || d.HighestModSeq != 9 {
		t.Fatalf("after reopen %+v", d)
	}
}

// A UID names one message for ever: storing another message under a UID
// this fragment already holds is refused.
func TestStoreAtRefusesTakenUID(t *testing.T) {
	m, _ := newManager(t)
	p := place("a@x.org", "INBOX", v1, 3, 3)
	if err := m.StoreAt([]Placed{p}, "id-1", []byte("one\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
	// The same message again (a retried store) is fine.
	if err := m.StoreAt([]Placed{p}, "id-1", []byte("one\r\n"), time.Now()); err != nil {
		t.Fatalf("idempotent store refused: %v", err)
	}
	if err := m.StoreAt([]Placed{p}, "id-2", []byte("two\r\n"), time.Now()); !errors.Is(err, ErrUIDTaken) {
		t.Fatalf("overwrite: %v", err)
	}
	if b, _ := m.Body("a@x.org", "id-1"); string(b) != "one\r\n" {
		t.Fatalf("first message changed: %q", b)
	}
}

// Out-of-order stores (concurrent deliveries) keep UIDNEXT at the highest.
func TestStoreAtConcurrent(t *testing.T) {
	m, _ := newManager(t)
	var wg sync.WaitGroup
	for i := 1; i <= 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := m.StoreAt([]Placed{place("u@x.org", "INBOX", v1, uint32(i), uint64(i))}, fmt.Sprintf("id-%02d", i), []byte("x\r\n"), time.Now())
			if err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	d := fragment(t, m, "u@x.org", v1)
	if len(d.Messages) != 50 || d.UIDNext != 51 || d.HighestModSeq != 50 {
		t.Fatalf("%d messages, uidnext %d, modseq %d", len(d.Messages), d.UIDNext, d.HighestModSeq)
	}
	for i, msg := range d.Messages {
		if msg.UID != uint32(i+1) {
			t.Fatalf("message %d has uid %d", i, msg.UID)
		}
	}
}

func TestFlagsExpungeCopyDrop(t *testing.T) {
	m, _ := newManager(t)
	u := "u@x.org"
	for i := uint32(1); i <= 3; i++ {
		if err := m.StoreAt([]Placed{place(u, "INBOX", v1, i, uint64(i))}, fmt.Sprintf("m%d", i), []byte(fmt.Sprintf("body %d\r\n", i)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// Messages change as replicated objects: each change is a new whole
	// version with a newer stamp.
	clock := hlc.Timestamp(time.Now().UnixMilli()) << 16
	apply := func(o *Object, body []byte) replica.Outcome {
		t.Helper()
		clock++
		o.User, o.Replicas = u, []cluster.NodeID{m.Self}
		up, err := o.Update(replica.Stamp{Clock: clock}, o.Replicas, body)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := m.Apply([]*replica.Update{up}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return outs[0]
	}
	d := fragment(t, m, u, v1)
	m2 := d.Messages[1]
	m2.Flags, m2.ModSeq = []string{`\Seen`, `\Recent`, "$Label"}, 10
	if o := apply(ObjectFrom(u, "INBOX", v1, &m2), nil); o != replica.Applied {
		t.Fatalf("flags: outcome %d", o)
	}
	d = fragment(t, m, u, v1)
	if !d.Messages[1].HasFlag(`\seen`) || !d.Messages[1].HasFlag("$label") || d.Messages[1].HasFlag(`\Recent`) || d.Messages[1].ModSeq != 10 || d.HighestModSeq != 10 {
		t.Fatalf("after flags %+v", d)
	}
	// An older version arriving late changes nothing.
	stale := d.Messages[1]
	stale.Flags = nil
	up, _ := ObjectFrom(u, "INBOX", v1, &stale).Update(replica.Stamp{Clock: 1}, []cluster.NodeID{m.Self}, nil)
	if outs, err := m.Apply([]*replica.Update{up}, nil); err != nil || outs[0] != replica.Stale {
		t.Fatalf("older update: %v %v", outs, err)
	}
	if o := apply(&Object{ID: "m1", Deleted: true, ModSeq: 11}, nil); o != replica.Applied {
		t.Fatalf("expunge: outcome %d", o)
	}
	// The body stays for ExpungedBodyGrace (sessions that still number
	// the message may fetch it), then the sweep removes it.
	if _, err := m.Body(u, "m1"); err != nil {
		t.Fatalf("expunged body gone before its grace: %v", err)
	}
	if n, err := m.SweepExpunged(time.Now()); err != nil || n != 0 {
		t.Fatalf("sweep within the grace: %d, %v", n, err)
	}
	if n, err := m.SweepExpunged(time.Now().Add(ExpungedBodyGrace + time.Second)); err != nil || n != 1 {
		t.Fatalf("sweep after the grace: %d, %v", n, err)
	}
	if _, err := m.Body(u, "m1"); !errors.Is(err, ErrNoMessage) {
		t.Fatal("expunged body still there after the sweep")
	}
	// A create that arrives after the expunge does not bring it back.
	up, _ = (&Object{User: u, ID: "m1", Mailbox: "INBOX", UIDValidity: v1, UID: 1, Replicas: []cluster.NodeID{m.Self}}).Update(replica.Stamp{Clock: 2}, nil, []byte("x"))
	if outs, _ := m.Apply([]*replica.Update{up}, nil); outs[0] != replica.Stale {
		t.Fatal("expunged message came back")
	}
	// Copy 2 into Archive (its bytes from m2 here), move 3 into Trash.
	const arch, trash = v1 + 10, v1 + 11
	if o := apply(&Object{ID: "copy-of-2", Mailbox: "Archive", UIDValidity: arch, UID: 1, ModSeq: 11, Flags: []string{`\Seen`}, BodyFrom: "m2"}, nil); o != replica.Applied {
		t.Fatalf("copy: outcome %d", o)
	}
	if o := apply(&Object{ID: "copy-missing", Mailbox: "Archive", UIDValidity: arch, UID: 2, ModSeq: 12}, nil); o != replica.NeedContent {
		t.Fatalf("an object without its bytes: outcome %d", o)
	}
	m3 := d.Messages[2]
	m3.UID, m3.ModSeq = 5, 12
	if o := apply(ObjectFrom(u, "Trash", trash, &m3), nil); o != replica.Applied {
		t.Fatalf("move: outcome %d", o)
	}
	if d := fragment(t, m, u, v1); len(d.Messages) != 1 || d.Messages[0].UID != 2 {
		t.Fatalf("inbox after copy and move %+v", d.Messages)
	}
	a := fragment(t, m, u, arch)
	if len(a.Messages) != 1 || a.Messages[0].ID != "copy-of-2" || !a.Messages[0].HasFlag(`\Seen`) {
		t.Fatalf("archive %+v", a.Messages)
	}
	if b, err := m.Body(u, "copy-of-2"); err != nil || string(b) != "body 2\r\n" {
		t.Fatalf("copy body %q %v", b, err)
	}
	tr := fragment(t, m, u, trash)
	if len(tr.Messages) != 1 || tr.Messages[0].UID != 5 || tr.Messages[0].ID != "m3" {
		t.Fatalf("trash %+v", tr.Messages)
	}
	// A move within one mailbox (renumbering) keeps UIDNEXT past both.
	m2 = fragment(t, m, u, v1).Messages[0]
	m2.UID, m2.ModSeq = 20, 13
	if o := apply(ObjectFrom(u, "INBOX", v1, &m2), nil); o != replica.Applied {
		t.Fatalf("renumber: outcome %d", o)
	}
	if d := fragment(t, m, u, v1); len(d.Messages) != 1 || d.Messages[0].UID != 20 || d.UIDNext != 21 {
		t.Fatalf("after renumbering %+v", d)
	}
	// A replica set that no longer names this node: the copy goes.
	m2 = fragment(t, m, u, v1).Messages[0]
	o2 := ObjectFrom(u, "INBOX", v1, &m2)
	clock++
	o2.Replicas = []cluster.NodeID{"elsewhere"}
	up, _ = o2.Update(replica.Stamp{Clock: clock}, nil, nil)
	if outs, err := m.Apply([]*replica.Update{up}, nil); err != nil || outs[0] != replica.Applied {
		t.Fatalf("re-homed away: %v %v", outs, err)
	}
	if d := fragment(t, m, u, v1); len(d.Messages) != 0 {
		t.Fatalf("copy kept after its replica set left this node: %+v", d.Messages)
	}
	// A renamed mailbox keeps its UIDVALIDITY and gets its new name here
	// at the next store into it.
	if err := m.StoreAt([]Placed{place(u, "Old Trash", trash, 6, 14)}, "m4", []byte("x\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if mb, err := m.Mailbox(u, "Old Trash"); err != nil || mb.UIDValidity != trash {
		t.Fatalf("renamed record %+v %v", mb, err)
	}
	if err := m.DropMailbox(u, trash); err != nil {
		t.Fatal(err)
	}
	if d := fragment(t, m, u, trash); len(d.Messages) != 0 {
		t.Fatal("dropped mailbox still has messages")
	}
	// A mailbox made again under an old name (new UIDVALIDITY) replaces
	// the stale local record and its messages.
	if err := m.StoreAt([]Placed{place(u, "Archive", arch+100, 1, 1)}, "m5", []byte("x\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if d := fragment(t, m, u, arch); len(d.Messages) != 0 {
		t.Fatal("stale fragment of a deleted mailbox survived its name's reuse")
	}
	var users []string
	m.FragmentUsers(-1, func(user string, n int) error { users = append(users, fmt.Sprint(user, n)); return nil })
	if len(users) != 1 || users[0] != "u@x.org1" {
		t.Fatalf("fragment scan %v", users)
	}
	if err := m.DeleteUser(u); err != nil {
		t.Fatal(err)
	}
	users = nil
	m.FragmentUsers(-1, func(user string, n int) error { users = append(users, user); return nil })
	if len(users) != 0 {
		t.Fatalf("users after delete %v", users)
	}
}

func TestNotifier(t *testing.T) {
	m, _ := newManager(t)
	ch, cancel := m.Subscribe("u@x.org")
	defer cancel()
	m.StoreAt([]Placed{place("u@x.org", "INBOX", v1, 1, 1)}, "id", []byte("x\r\n"), time.Now())
	select {
	case c := <-ch:
		if c.User != "u@x.org" {
			t.Fatal(c)
		}
	case <-time.After(time.Second):
		t.Fatal("no change event")
	}
}

func TestFlagHelpers(t *testing.T) {
	got := ApplyFlags([]string{`\Seen`}, FlagsAdd, []string{`\seen`, "$A", `\Recent`})
	if len(got) != 2 || !SameFlags(got, []string{"$a", `\SEEN`}) {
		t.Fatalf("add: %v", got)
	}
	if got := ApplyFlags(got, FlagsRemove, []string{`\SEEN`}); len(got) != 1 || got[0] != "$A" {
		t.Fatalf("remove: %v", got)
	}
	if got := ApplyFlags(nil, FlagsSet, []string{"x", "X"}); len(got) != 1 {
		t.Fatalf("set: %v", got)
	}
}

// Message records are read from disk in bulk; a damaged one must give an
// error, never a crash, and a good one must read back as written.
func FuzzMessageRecord(f *testing.F) {
	f.Add(encodeMessage(&Message{ID: "id", Size: 5, Flags: []string{`\Seen`}, ModSeq: 3,
		Version: replica.Stamp{Clock: 7, Node: "n"}, Replicas: []cluster.NodeID{"a", "b"}, Want: 2}))
	f.Add(encodeMessage(&Message{ID: "old"})[:12])
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		if decodeMessage(b, &m) != nil {
			return
		}
		var again Message
		if err := decodeMessage(encodeMessage(&m), &again); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if again.ID != m.ID || again.Version != m.Version || len(again.Replicas) != len(m.Replicas) || len(again.Flags) != len(m.Flags) {
			t.Fatalf("round trip: %+v != %+v", again, m)
		}
	})
}
