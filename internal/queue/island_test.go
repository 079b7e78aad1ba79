package queue

import (
	"fmt"
	"testing"

	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/replica"
)

// view is a membership view with an island table (cluster.Eligible over
// fixed members), what balance.Placer reads.
type view struct {
	alive []cluster.MemberInfo
	table island.Table
}

func (v view) Eligible(b uint8) ([]cluster.MemberInfo, error) {
	return cluster.Eligible(b, v.alive, v.table, true)
}

// A new queue entry's replicas are in its user's island: this node and
// others of the island when this node is of it, else the island's nodes
// only; with the island down the entry is refused for now.
func TestPlaceKeepsEntriesInTheUsersIsland(t *testing.T) {
	table, err := island.Initial([]string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	var alive []cluster.MemberInfo
	for _, id := range []string{"a1", "a2", "b1", "b2"} {
		mi := cluster.MemberInfo{Member: cluster.Member{ID: cluster.NodeID(id)}, State: "alive"}
		mi.Island = id[:1]
		alive = append(alive, mi)
	}
	placer := balance.NewPlacer(view{alive: alive, table: table}, balance.NewTracker(), 0)
	r := &Replicated{Self: "a1", Placer: placer}
	for i := range 64 {
		user := fmt.Sprintf("user%d@example.org", i)
		want := table.Island(cluster.Bucket(user))
		set, err := r.Place(user, 2, replica.One)
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		if len(set) != 2 {
			t.Fatalf("%s of island %s: set %v", user, want, set)
		}
		for _, n := range set {
			if string(n[:1]) != want {
				t.Fatalf("%s of island %s: set %v", user, want, set)
			}
		}
	}
	down := &Replicated{Self: "a1", Placer: balance.NewPlacer(view{alive: alive[:2], table: table}, balance.NewTracker(), 0)}
	for i := range 64 {
		user := fmt.Sprintf("user%d@example.org", i)
		if _, err := down.Place(user, 2, replica.One); (table.Island(cluster.Bucket(user)) == "b") != (err != nil) {
			t.Fatalf("%s of island %s with island b down: %v", user, table.Island(cluster.Bucket(user)), err)
		}
	}
}
