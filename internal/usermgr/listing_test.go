package usermgr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/userdb"
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

// A stale answer's user is left out when its bucket's manager answered
// fresh (a user deleted since, or a bucket that moved there); of two
// stale answers for one user the newer wins.
func TestMergeListingPrefersFreshAndNewer(t *testing.T) {
	now := time.Now()
	p := func(a string) userdb.Profile { return userdb.Profile{Address: a} }
	managers := map[string]cluster.NodeID{"kept@x": "c", "gone@x": "a", "both@x": "c"}
	l := mergeListing([]cluster.Answer[[]userdb.Profile]{
		{Node: "a", Value: []userdb.Profile{p("fresh@x")}},
		{Node: "b", Err: errors.New("late"), Stale: cluster.StaleSince(now.Add(-time.Minute), now),
			Value: []userdb.Profile{p("gone@x"), p("both@x")}},
		{Node: "c", Err: errors.New("late"), Stale: cluster.StaleSince(now.Add(-time.Second), now),
			Value: []userdb.Profile{p("kept@x"), p("both@x")}},
	}, func(a string) cluster.NodeID { return managers[a] })
	var got []string
	for _, lp := range l.Profiles {
		got = append(got, fmt.Sprintf("%s/%v", lp.Address, lp.Stale != nil))
	}
	if want := "both@x/true fresh@x/false kept@x/true"; strings.Join(got, " ") != want {
		t.Fatalf("listing %v, want %s", got, want)
	}
	if b := l.Profiles[0]; b.Stale.Age != 1 {
		t.Fatalf("both@x from the answer %vs old, want c's (1s)", b.Stale.Age)
	}
	if len(l.Unreachable) != 2 || l.PerNode["a"].Users != 1 || l.PerNode["b"].Stale == nil {
		t.Fatalf("listing %+v", l)
	}
}
