package usermgr

import (
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/writer"
)

// A user's spread is kept in the profile and handed to every delivery's
// placement with its allocation; 0 goes back to the cluster's, and a
// negative or absurd one is refused with the user named.
func TestSpreadSetting(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("a", "", 1)
	c.setAlive("a")
	u := "spread@example.org"
	if _, err := n.mgr.AddUser(ctx(t), u, "pw"); err != nil {
		t.Fatal(err)
	}
	if err := n.mgr.SetSpread(ctx(t), u, 3); err != nil {
		t.Fatal(err)
	}
	if p, _, err := n.mgr.Lookup(ctx(t), u); err != nil || p.Spread != 3 {
		t.Fatalf("profile spread = %v (%v), want 3", p, err)
	}
	a, err := n.mgr.writers.Local().Alloc(ctx(t), &writer.AllocRequest{User: u, Mailbox: "INBOX"})
	if err != nil || a.Spread != 3 {
		t.Fatalf("allocation's spread = %v (%v), want 3", a, err)
	}
	n.mgr.writers.Local().Confirm(ctx(t), &writer.ConfirmRequest{Place: a.Place, Cancel: true, Unused: true})
	for _, bad := range []int{-1, maxSpread + 1} {
		err := n.mgr.SetSpread(ctx(t), u, bad)
		if err == nil || !strings.Contains(err.Error(), u) {
			t.Errorf("spread %d: error %v, want one naming the user", bad, err)
		}
	}
	if err := n.mgr.SetSpread(ctx(t), u, 0); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := n.mgr.Lookup(ctx(t), u); p.Spread != 0 {
		t.Fatalf("spread after reset = %d, want 0", p.Spread)
	}
}
