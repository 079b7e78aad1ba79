package usermgr

import (
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/writer"
)

func alloc(t *testing.T, m *Manager, user string) mailbox.Placed {
	t.Helper()
	a, err := m.writers.Local().Alloc(ctx(t), &writer.AllocRequest{User: user, Mailbox: "INBOX"})
	if err != nil {
		t.Fatal(err)
	}
	return a.Place
}

func storeAndConfirm(t *testing.T, n *testNode, pl mailbox.Placed, subject string) {
	storeAndConfirmTo(t, n, n.mgr, pl, subject)
}

// storeAndConfirmTo stores on node n and confirms to the writer mgr.
func storeAndConfirmTo(t *testing.T, n *testNode, mgr *Manager, pl mailbox.Placed, subject string) {
	t.Helper()
	id := n.boxes.NewMessageID()
	raw := []byte("Subject: " + subject + "\r\n\r\n")
	if err := n.boxes.StoreAt([]mailbox.Placed{pl}, id, raw, time.Now()); err != nil {
		t.Fatal(err)
	}
	msg := mailbox.Message{UID: pl.UID, ID: id, Size: int64(len(raw)), ModSeq: pl.ModSeq}
	// Confirm the version stored, as the delivering proxy does.
	if d, err := n.boxes.Fragment(pl.User, pl.UIDValidity); err == nil {
		for _, m := range d.Messages {
			if m.ID == id {
				msg.Version = m.Version
			}
		}
	}
	if err := mgr.writers.Local().Confirm(ctx(t), &writer.ConfirmRequest{Place: pl, Message: msg, Nodes: []cluster.NodeID{n.id}}); err != nil {
		t.Fatal(err)
	}
}

// twoNodesOneUser starts nodes a and b, adds user u, and stores a first
// message on a through the user's writer; it returns the nodes, the
// writer's node and the first message's place.
func twoNodesOneUser(t *testing.T, u, subject string) (c *testCluster, a, b, w *testNode, pl mailbox.Placed) {
	t.Helper()
	c = newTestCluster(t)
	a = c.start("a", "", 1)
	b = c.start("b", "", 1)
	c.setAlive("a", "b")
	a.mgr.AddUser(ctx(t), u, "pw")
	w = c.nodes[c.um.Manager(u)]
	pl = alloc(t, w.mgr, u)
	storeAndConfirmTo(t, a, w.mgr, pl, subject)
	return c, a, b, w, pl
}

func inbox(t *testing.T, m *Manager, user string) *writer.MessagesReply {
	t.Helper()
	rep, err := m.writers.Local().Messages(ctx(t), &writer.MailboxRequest{User: user, Name: "INBOX"})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// No session sees UID n+1 before n: a message stored under a later UID
// stays hidden while an earlier allocation is still being stored.
func TestWriterHidesUIDsAboveAllocationsInFlight(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("a", "", 1)
	c.setAlive("a")
	u := "w@example.org"
	if _, err := n.mgr.AddUser(ctx(t), u, "pw"); err != nil {
		t.Fatal(err)
	}
	first, second := alloc(t, n.mgr, u), alloc(t, n.mgr, u)
	if second.UID != first.UID+1 || second.ModSeq <= first.ModSeq {
		t.Fatalf("allocations %+v then %+v", first, second)
	}
	storeAndConfirm(t, n, second, "second")
	if got := inbox(t, n.mgr, u); len(got.Messages) != 0 {
		t.Fatalf("UID %d visible while UID %d is in flight", second.UID, first.UID)
	}
	storeAndConfirm(t, n, first, "first")
	got := inbox(t, n.mgr, u)
	if len(got.Messages) != 2 || got.Messages[0].UID != first.UID || got.Mailbox.UIDNext != second.UID+1 {
		t.Fatalf("view %+v", got)
	}
	// A cancelled allocation stops hiding at once.
	third, fourth := alloc(t, n.mgr, u), alloc(t, n.mgr, u)
	storeAndConfirm(t, n, fourth, "fourth")
	n.mgr.writers.Local().Confirm(ctx(t), &writer.ConfirmRequest{Place: third, Cancel: true})
	if got := inbox(t, n.mgr, u); len(got.Messages) != 3 || got.Messages[2].UID != fourth.UID {
		t.Fatalf("after cancel: %+v", got.Messages)
	}
}

// A new writer (a restart without a clean shutdown, or a failover) starts
// past every UID the old one reserved, and UIDNEXT as clients see it does
// not move until a message is added.
func TestWriterNeverReusesUIDsAfterCrash(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("a", "", 1)
	c.setAlive("a")
	u := "w@example.org"
	n.mgr.AddUser(ctx(t), u, "pw")
	var last mailbox.Placed
	for i := 0; i < 3; i++ {
		last = alloc(t, n.mgr, u)
		storeAndConfirm(t, n, last, "before")
	}
	// One more allocated and stored but never confirmed: the crash hit.
	lost := alloc(t, n.mgr, u)
	n.boxes.StoreAt([]mailbox.Placed{lost}, n.boxes.NewMessageID(), []byte("Subject: lost\r\n\r\n"), time.Now())
	before := inbox(t, n.mgr, u).Mailbox
	dir := n.dir
	c.kill("a") // no Release: like kill -9
	n = c.start("a", dir, 2)
	c.setAlive("a")
	got := inbox(t, n.mgr, u)
	if got.Mailbox.UIDValidity != before.UIDValidity {
		t.Fatal("UIDVALIDITY changed across a restart")
	}
	if len(got.Messages) != 4 {
		t.Fatalf("after restart %d messages, want 4 (the unconfirmed one is on disk)", len(got.Messages))
	}
	next := alloc(t, n.mgr, u)
	if next.UID <= lost.UID {
		t.Fatalf("new writer handed out UID %d, old one had reached %d", next.UID, lost.UID)
	}
	if next.ModSeq <= lost.ModSeq {
		t.Fatalf("MODSEQ went back: %d after %d", next.ModSeq, lost.ModSeq)
	}
}

// Two fragments claiming one UID for different messages both get new UIDs.
func TestWriterRenumbersClashingUIDs(t *testing.T) {
	u := "w@example.org"
	c, _, b, mgr, pl := twoNodesOneUser(t, u, "on a")
	// The same place stored on b too, as a writer cut off from the
	// reservation might have done.
	b.boxes.StoreAt([]mailbox.Placed{pl}, b.boxes.NewMessageID(), []byte("Subject: on b\r\n\r\n"), time.Now())
	if err := note(t, b.mgr, u, "b"); err != nil {
		t.Fatal(err)
	}
	c.setAlive("a", "b") // reconcile: views reload
	got := inbox(t, mgr.mgr, u)
	if len(got.Messages) != 2 {
		t.Fatalf("view %+v", got.Messages)
	}
	for _, m := range got.Messages {
		if m.UID == pl.UID {
			t.Fatalf("UID %d still names one of two messages", pl.UID)
		}
	}
}

// A fragment the mail map did not know of, found by the manager's periodic
// scan (a store whose confirmation never came, such as a delivery attempt
// that failed after its coordinator stored it), makes the user's views
// load again: its message is shown, and a UID it shares with a later
// message is renumbered. Before, the views stayed as they were until the
// next membership change, and the hidden message's replica pushes were
// refused for its UID over and over.
func TestRefreshedMailMapReloadsViews(t *testing.T) {
	u := "orphan@example.org"
	c, _, b, mgr, pl := twoNodesOneUser(t, u, "confirmed on a")
	if got := inbox(t, mgr.mgr, u); len(got.Messages) != 1 {
		t.Fatalf("view before: %+v", got.Messages)
	}
	// The same place stored on b, never confirmed.
	b.boxes.StoreAt([]mailbox.Placed{pl}, b.boxes.NewMessageID(), []byte("Subject: orphan on b\r\n\r\n"), time.Now())
	mgr.mgr.Refresh(c.alive)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := inbox(t, mgr.mgr, u)
		if len(got.Messages) == 2 {
			if got.Messages[0].UID == got.Messages[1].UID {
				t.Fatalf("UID %d names two messages: %+v", got.Messages[0].UID, got.Messages)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message on b is still hidden after the refresh found its fragment: %+v", got.Messages)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A replica's conflict report makes the writer load the views again even
// though nothing it knows of changed: the two messages sharing a UID are
// both shown, under different UIDs.
func TestResolveConflictRenumbers(t *testing.T) {
	u := "conflict@example.org"
	_, _, b, mgr, pl := twoNodesOneUser(t, u, "confirmed on a")
	// b holds the user's mail already (so the mail map has it), and then
	// gets another message under the same UID, as a writer cut off from
	// the first would have placed it.
	pl2 := alloc(t, mgr.mgr, u)
	storeAndConfirmTo(t, b, mgr.mgr, pl2, "second, on b")
	if got := inbox(t, mgr.mgr, u); len(got.Messages) != 2 {
		t.Fatalf("view before: %+v", got.Messages)
	}
	id := b.boxes.NewMessageID()
	b.boxes.StoreAt([]mailbox.Placed{pl}, id, []byte("Subject: clash on b\r\n\r\n"), time.Now())
	if got := inbox(t, mgr.mgr, u); len(got.Messages) != 2 {
		t.Fatalf("the view changed by itself: %+v", got.Messages)
	}
	if err := b.mgr.writers.ResolveConflict(ctx(t), mailbox.ObjectName(u, id)); err != nil {
		t.Fatal(err)
	}
	got := inbox(t, mgr.mgr, u)
	if len(got.Messages) != 3 {
		t.Fatalf("after the conflict report: %+v, want 3 messages", got.Messages)
	}
	seen := map[uint32]bool{}
	for _, m := range got.Messages {
		if seen[m.UID] {
			t.Fatalf("UID %d names two messages: %+v", m.UID, got.Messages)
		}
		seen[m.UID] = true
	}
}
