package usermgr

import (
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/writer"
)

// mailMapOf is the user's mail map as its manager answers it.
func mailMapOf(t *testing.T, via *Manager, user string) []cluster.NodeID {
	t.Helper()
	_, mm, err := via.Lookup(ctx(t), user)
	if err != nil {
		t.Fatal(err)
	}
	return mm
}

// waitMailMap waits until the user's mail map is want.
func waitMailMap(t *testing.T, via *Manager, user string, want ...cluster.NodeID) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := mailMapOf(t, via, user)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("mail map of %s = %v, want %v", user, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func expunge(t *testing.T, w *Manager, pl mailbox.Placed) {
	t.Helper()
	rep, err := w.writers.Local().Expunge(ctx(t), &writer.FlagsRequest{User: pl.User, ID: uint64(pl.UIDValidity), UIDs: []uint32{pl.UID}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.UIDs, []uint32{pl.UID}) {
		t.Fatalf("expunged %v, want %d", rep.UIDs, pl.UID)
	}
}

// mailOnAAndB makes user u with a message on a and one on b (returned),
// through the user's writer on w.
func mailOnAAndB(t *testing.T, u string) (c *testCluster, a, b, w *testNode, onB mailbox.Placed) {
	t.Helper()
	c, a, b, w, _ = twoNodesOneUser(t, u, "on a")
	onB = alloc(t, w.mgr, u)
	storeAndConfirmTo(t, b, w.mgr, onB, "on b")
	waitMailMap(t, a.mgr, u, "a", "b")
	return c, a, b, w, onB
}

// A node whose fragment of a user empties (the last message it held is
// expunged) leaves the user's mail map, and a rebuild of the soft state
// from the nodes' scans gives the same map (Porcupine §3.3: the map is the
// nodes holding the user's mail).
func TestEmptiedFragmentLeavesTheMailMap(t *testing.T) {
	u := "leaver@example.org"
	c, a, b, w, onB := mailOnAAndB(t, u)

	expunge(t, w.mgr, onB)
	waitMailMap(t, a.mgr, u, "a")
	if held, err := b.boxes.HoldsMail(u); err != nil || held {
		t.Fatalf("b holds mail of %s after the expunge: %v %v", u, held, err)
	}

	w.mgr.Rebuild(c.um, c.alive, time.Now())
	waitMailMap(t, a.mgr, u, "a")
	if got := len(inbox(t, w.mgr, u).Messages); got != 1 {
		t.Fatalf("INBOX after the rebuild has %d messages, want 1", got)
	}
}

// A node is not taken out of the mail map while a delivery is between its
// allocation and its confirmation (it may be storing there, and notes the
// node only when it confirms), nor while it holds mail: the map may name
// more nodes than hold mail, never fewer.
func TestMailMapKeepsANodeADeliveryMayStoreOn(t *testing.T) {
	u := "busy@example.org"
	_, a, b, w, onB := mailOnAAndB(t, u)

	flying := alloc(t, w.mgr, u) // a delivery to b, not yet stored
	expunge(t, w.mgr, onB)
	gone, busy, err := w.mgr.writers.Vacate(ctx(t), u)
	if err != nil || !busy || len(gone) != 0 {
		t.Fatalf("vacate with an allocation in flight: gone %v, busy %v, err %v; want nothing, busy", gone, busy, err)
	}
	if got := mailMapOf(t, a.mgr, u); !slices.Equal(got, []cluster.NodeID{"a", "b"}) {
		t.Fatalf("mail map with a delivery in flight = %v, want a b", got)
	}
	storeAndConfirmTo(t, b, w.mgr, flying, "late on b")
	gone, busy, err = w.mgr.writers.Vacate(ctx(t), u)
	if err != nil || busy || len(gone) != 0 {
		t.Fatalf("vacate with b holding the delivery: gone %v, busy %v, err %v; want nothing", gone, busy, err)
	}
	waitMailMap(t, a.mgr, u, "a", "b")
	if got := len(inbox(t, w.mgr, u).Messages); got != 2 {
		t.Fatalf("INBOX has %d messages, want 2 (on a, late on b)", got)
	}

	expunge(t, w.mgr, flying)
	waitMailMap(t, a.mgr, u, "a")
}
