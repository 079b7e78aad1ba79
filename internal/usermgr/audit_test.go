package usermgr

import (
	"testing"
	"time"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/writer"
)

// auditUser starts two nodes and a user with three messages stored on both
// nodes, and returns the user's writer and the messages' UIDs.
func auditUser(t *testing.T, u string) (*testCluster, *testNode, []uint32) {
	t.Helper()
	c := newTestCluster(t)
	a, b := c.start("a", "", 1), c.start("b", "", 1)
	c.setAlive("a", "b")
	if _, err := a.mgr.AddUser(ctx(t), u, "pw"); err != nil {
		t.Fatal(err)
	}
	w := c.nodes[c.um.Manager(u)]
	var uids []uint32
	for i, n := range []*testNode{a, b, a} {
		pl := alloc(t, w.mgr, u)
		storeAndConfirmTo(t, n, w.mgr, pl, "audit "+string(rune('1'+i)))
		uids = append(uids, pl.UID)
	}
	waitInbox(t, w.mgr, u, 3, time.Second)
	return c, w, uids
}

// A message hidden on purpose (taken out of the writer's view, as a missed
// trigger would leave it) is found by the audit running at its production
// interval and shown again within 60 s; the round that repairs it counts it.
func TestAuditHealsAHiddenMessageWithin60s(t *testing.T) {
	t.Parallel()
	u := "hidden@example.org"
	_, w, uids := auditUser(t, u)
	if !w.mgr.writers.HideForTest(u, uids[1]) {
		t.Fatal("could not hide the message")
	}
	if got := inbox(t, w.mgr, u); len(got.Messages) != 2 {
		t.Fatalf("after hiding: %+v", got.Messages)
	}
	start := time.Now()
	w.mgr.writers.StartAudit(writer.DefaultAuditInterval)
	waitInbox(t, w.mgr, u, 3, 60*time.Second)
	t.Logf("the hidden message was shown again %v after the audit started (interval %v)", time.Since(start).Round(time.Second), writer.DefaultAuditInterval)
}

// The audit finds nothing to repair in a cluster whose views are right, a
// hidden message once, and a fragment missing from the mail map only when
// it is still missing a round later (its note may be on its way).
func TestAuditRepairsOnlyWhatDiffers(t *testing.T) {
	t.Parallel()
	u := "steady@example.org"
	c, w, uids := auditUser(t, u)
	time.Sleep(writer.AuditSettle + 500*time.Millisecond) // the messages are settled
	if r := w.mgr.writers.AuditOnce(ctx(t)); r.Total() != 0 {
		t.Fatalf("audit of a correct view repaired %+v", r)
	}
	w.mgr.writers.HideForTest(u, uids[0])
	if r := w.mgr.writers.AuditOnce(ctx(t)); r.Hidden != 1 || r.Total() != 1 {
		t.Fatalf("audit of a view missing a message: %+v", r)
	}
	if got := inbox(t, w.mgr, u); len(got.Messages) != 3 {
		t.Fatalf("after the audit: %+v", got.Messages)
	}
	if r := w.mgr.writers.AuditOnce(ctx(t)); r.Total() != 0 {
		t.Fatalf("second audit repaired %+v", r)
	}
	// A delivery stored whose confirmation never comes: its allocation
	// hides the next message until the audit sees it stored, old enough.
	lostConfirm := alloc(t, w.mgr, u)
	if err := c.nodes["a"].boxes.StoreAt([]mailbox.Placed{lostConfirm}, c.nodes["a"].boxes.NewMessageID(), []byte("Subject: unconfirmed\r\n\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
	after := alloc(t, w.mgr, u)
	storeAndConfirmTo(t, c.nodes["a"], w.mgr, after, "after the unconfirmed one")
	if got := inbox(t, w.mgr, u); len(got.Messages) != 3 {
		t.Fatalf("before the audit: %+v, want the 3 below the allocation in flight", got.Messages)
	}
	time.Sleep(writer.AuditSettle + 500*time.Millisecond)
	if r := w.mgr.writers.AuditOnce(ctx(t)); r.Total() != 0 {
		t.Fatalf("audit of a young allocation in flight repaired %+v", r)
	}
	if !w.mgr.writers.AgeAllocationForTest(u, lostConfirm.UID, writer.AuditAllocAge) {
		t.Fatal("no allocation in flight to age")
	}
	if r := w.mgr.writers.AuditOnce(ctx(t)); r.Allocs != 1 {
		t.Fatalf("audit of an old allocation whose message is stored: %+v", r)
	}
	if got := inbox(t, w.mgr, u); len(got.Messages) != 5 {
		t.Fatalf("after the audit: %+v, want all 5", got.Messages)
	}
	// A fragment on b that the mail map does not name.
	other := "unnoted@example.org"
	if _, err := c.nodes["a"].mgr.AddUser(ctx(t), other, "pw"); err != nil {
		t.Fatal(err)
	}
	storeFragment(t, c.nodes["b"], other)
	mgr := c.nodes[c.um.Manager(other)].mgr
	if r := mgr.writers.AuditOnce(ctx(t)); r.MailMap != 0 {
		t.Fatalf("first round repaired the mail map at once: %+v", r)
	}
	if r := mgr.writers.AuditOnce(ctx(t)); r.MailMap != 1 {
		t.Fatalf("second round: %+v, want the mail map repaired", r)
	}
	if _, mm, _ := mgr.Lookup(ctx(t), other); len(mm) != 1 || mm[0] != "b" {
		t.Fatalf("mail map after the audit: %v", mm)
	}
}
