package usermgr

import (
	"fmt"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// The user listing does not wait for a node that is counted live but does
// not answer (down, before the membership notices): within about
// cluster.FanOutWait it answers with that node's users from its last
// answer, marked stale, and names it unreachable.
func TestUserListingStandsInForASilentNode(t *testing.T) {
	c := newTestCluster(t)
	n1 := c.start("n1", "", 1)
	n2 := c.start("n2", "", 1)
	c.setAlive("n1", "n2")
	um := c.um
	managed := map[cluster.NodeID]int{}
	for i := 0; managed["n1"] < 2 || managed["n2"] < 2; i++ {
		u := fmt.Sprintf("u%d@example.org", i)
		if _, err := n1.mgr.AddUser(ctx(t), u, "pw"); err != nil {
			t.Fatal(err)
		}
		managed[um.Manager(u)]++
	}
	total := managed["n1"] + managed["n2"]
	l := n1.mgr.Users(ctx(t))
	if len(l.Profiles) != total || len(l.Unreachable) != 0 || l.PerNode["n2"].Users != managed["n2"] || l.PerNode["n2"].Stale != nil {
		t.Fatalf("listing with both nodes answering: %+v", l)
	}

	n2.srv.Stop() // down, still counted live
	start := time.Now()
	l = n1.mgr.Users(ctx(t))
	if took := time.Since(start); took > 5*cluster.FanOutWait {
		t.Fatalf("listing waited %v for the silent node", took)
	}
	if len(l.Profiles) != total || l.Unreachable["n2"] == "" || l.PerNode["n2"].Stale == nil || l.PerNode["n1"].Stale != nil {
		t.Fatalf("listing with n2 silent: %+v", l)
	}
	for _, p := range l.Profiles {
		if stale := p.Stale != nil; stale != (um.Manager(p.Address) == "n2") {
			t.Errorf("%s (manager %s) marked stale: %v", p.Address, um.Manager(p.Address), stale)
		}
	}
}
