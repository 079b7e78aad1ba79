package mailbox

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/store"
)

func newManager(t testing.TB) (*Manager, string) {
	dir := t.TempDir()
	db, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return New(db), dir
}

func inbox(t *testing.T, m *Manager, user string) *Mailbox {
	t.Helper()
	mb, err := m.Mailbox(user, "inbox")
	if err != nil {
		t.Fatal(err)
	}
	return mb
}

func TestDeliverAndRead(t *testing.T) {
	m, _ := newManager(t)
	raw := []byte("Subject: hi\r\n\r\n.dot line\r\n\xe9\r\n")
	got, err := m.Deliver([]string{"a@x.org", "b@x.org", "a@x.org"}, raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("delivered %d copies, want 2 (duplicate recipient collapsed)", len(got))
	}
	for _, u := range []string{"a@x.org", "b@x.org"} {
		mb := inbox(t, m, u)
		msgs, err := m.Messages(u, mb.ID)
		if err != nil || len(msgs) != 1 {
			t.Fatalf("%s: %v %v", u, msgs, err)
		}
		body, err := m.Body(u, msgs[0].ID)
		if err != nil || !bytes.Equal(body, raw) {
			t.Fatalf("%s: body %q err %v", u, body, err)
		}
		if msgs[0].UID != 1 || mb.UIDNext != 2 {
			t.Fatalf("uid %d uidnext %d", msgs[0].UID, mb.UIDNext)
		}
	}
}

func TestUIDsAscendAndNeverReused(t *testing.T) {
	m, dir := newManager(t)
	u := "u@x.org"
	if err := m.EnsureUser(u); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := m.Deliver([]string{u}, []byte(fmt.Sprintf("n: %d\r\n\r\n", i)), time.Now()); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	mb := inbox(t, m, u)
	msgs, _ := m.Messages(u, mb.ID)
	if len(msgs) != 50 {
		t.Fatalf("%d messages", len(msgs))
	}
	for i, msg := range msgs {
		if msg.UID != uint32(i+1) {
			t.Fatalf("message %d has uid %d", i, msg.UID)
		}
	}
	// Expunge the last message; the next delivery must not reuse its UID,
	// also after a reopen of the store.
	if _, err := m.Expunge(u, mb.ID, []uint32{50}); err != nil {
		t.Fatal(err)
	}
	m.db.Close()
	db, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m = New(db)
	defer db.Close()
	d, err := m.Deliver([]string{u}, []byte("x\r\n"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if d[0].Message.UID != 51 {
		t.Fatalf("uid after expunge+reopen = %d, want 51", d[0].Message.UID)
	}
	if inbox(t, m, u).UIDValidity != mb.UIDValidity {
		t.Fatal("UIDVALIDITY changed across reopen")
	}
}

func TestFlagsModSeqAndCondStore(t *testing.T) {
	m, _ := newManager(t)
	u := "u@x.org"
	d, _ := m.Deliver([]string{u}, []byte("a\r\n"), time.Now())
	mb := inbox(t, m, u)
	ms0 := d[0].Message.ModSeq
	up, failed, err := m.StoreFlags(u, mb.ID, []uint32{1}, FlagsAdd, []string{`\Seen`, "$Label", `\Recent`}, 0)
	if err != nil || len(failed) != 0 || len(up) != 1 {
		t.Fatal(up, failed, err)
	}
	if !up[0].HasFlag(`\seen`) || !up[0].HasFlag("$label") || up[0].HasFlag(`\Recent`) {
		t.Fatalf("flags %v", up[0].Flags)
	}
	if up[0].ModSeq <= ms0 {
		t.Fatal("modseq did not grow")
	}
	// UNCHANGEDSINCE below the current modseq fails.
	_, failed, _ = m.StoreFlags(u, mb.ID, []uint32{1}, FlagsRemove, []string{`\Seen`}, ms0)
	if len(failed) != 1 {
		t.Fatal("conditional store did not fail")
	}
	up, _, _ = m.StoreFlags(u, mb.ID, []uint32{1}, FlagsRemove, []string{`\SEEN`}, 0)
	if up[0].HasFlag(`\Seen`) || len(up[0].Flags) != 1 {
		t.Fatalf("flags after remove %v", up[0].Flags)
	}
}

func TestMailboxLifecycle(t *testing.T) {
	m, _ := newManager(t)
	u := "u@x.org"
	if err := m.EnsureUser(u); err != nil {
		t.Fatal(err)
	}
	boxes, _ := m.Mailboxes(u)
	if len(boxes) != len(DefaultMailboxes) {
		t.Fatalf("%d default mailboxes", len(boxes))
	}
	if _, err := m.CreateMailbox(u, "Work", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateMailbox(u, "Work/Projects", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateMailbox(u, "Work", ""); !errors.Is(err, ErrMailboxExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	old, _ := m.Mailbox(u, "Work/Projects")
	if err := m.RenameMailbox(u, "Work", "Job"); err != nil {
		t.Fatal(err)
	}
	moved, err := m.Mailbox(u, "Job/Projects")
	if err != nil || moved.ID != old.ID || moved.UIDValidity != old.UIDValidity {
		t.Fatalf("child not renamed with its identity: %v %v", moved, err)
	}
	// Renaming INBOX moves its mail and leaves a fresh INBOX.
	m.Deliver([]string{u}, []byte("a\r\n"), time.Now())
	oldInbox := inbox(t, m, u)
	if err := m.RenameMailbox(u, "INBOX", "Old"); err != nil {
		t.Fatal(err)
	}
	ni := inbox(t, m, u)
	if ni.ID == oldInbox.ID || ni.UIDValidity == oldInbox.UIDValidity {
		t.Fatal("INBOX after rename keeps the old identity")
	}
	oldBox, _ := m.Mailbox(u, "Old")
	if msgs, _ := m.Messages(u, oldBox.ID); len(msgs) != 1 {
		t.Fatal("messages did not move with renamed INBOX")
	}
	if err := m.DeleteMailbox(u, "inbox"); err == nil {
		t.Fatal("INBOX deleted")
	}
	if err := m.DeleteMailbox(u, "Old"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Mailbox(u, "Old"); !errors.Is(err, ErrNoMailbox) {
		t.Fatal("deleted mailbox still there")
	}
	// Recreate: new UIDVALIDITY.
	nb, _ := m.CreateMailbox(u, "Old", "")
	if nb.UIDValidity == oldBox.UIDValidity {
		t.Fatal("recreated mailbox reuses UIDVALIDITY")
	}
}

func TestCopyMove(t *testing.T) {
	m, _ := newManager(t)
	u := "u@x.org"
	m.EnsureUser(u)
	m.Deliver([]string{u}, []byte("one\r\n"), time.Now())
	m.Deliver([]string{u}, []byte("two\r\n"), time.Now())
	in := inbox(t, m, u)
	res, err := m.Copy(u, in.ID, []uint32{1, 2}, "Archive", false)
	if err != nil || len(res.DstUIDs) != 2 {
		t.Fatal(res, err)
	}
	res, err = m.Copy(u, in.ID, []uint32{2}, "Trash", true)
	if err != nil || len(res.DstUIDs) != 1 {
		t.Fatal(res, err)
	}
	msgs, _ := m.Messages(u, in.ID)
	if len(msgs) != 1 {
		t.Fatalf("inbox has %d after move", len(msgs))
	}
	tr, _ := m.Mailbox(u, "Trash")
	tm, _ := m.Messages(u, tr.ID)
	body, err := m.Body(u, tm[0].ID)
	if err != nil || string(body) != "two\r\n" {
		t.Fatalf("moved body %q %v", body, err)
	}
	var users []string
	m.FragmentUsers(-1, func(user string, n int) error { users = append(users, fmt.Sprint(user, n)); return nil })
	if len(users) != 1 || users[0] != "u@x.org4" {
		t.Fatalf("fragment scan %v", users)
	}
}

func TestSubscribe(t *testing.T) {
	m, _ := newManager(t)
	ch, cancel := m.Subscribe("u@x.org")
	defer cancel()
	m.Deliver([]string{"u@x.org"}, []byte("x\r\n"), time.Now())
	select {
	case c := <-ch:
		if c.User != "u@x.org" {
			t.Fatal(c)
		}
	case <-time.After(time.Second):
		t.Fatal("no change event")
	}
}
