package clustersim

import (
	"context"
	"testing"
	"time"
)

// simNodes is the size of the CI simulation: enough for the user map to
// spread every node's buckets over several others, small enough to settle
// and detect a failure in seconds.
const simNodes = 16

// TestSimulatedFailureConverges starts 16 simulated nodes, checks that
// they agree on one user map, that simulated deliveries take the calls the
// placement implies, then crashes one node and checks that every survivor
// ends on one user map without it, its buckets moved and nothing else.
func TestSimulatedFailureConverges(t *testing.T) {
	c, err := Start(simNodes, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	before := c.Nodes[0].M.UserMap()

	const deliveries, users, replicas = 2000, 500, 2
	k, err := c.Deliver(deliveries, users, replicas, 1)
	if err != nil {
		t.Fatal(err)
	}
	if k.Deliveries != deliveries || k.Push != deliveries*(replicas-1) {
		t.Errorf("deliveries %d, pushes %d: want %d and one push each", k.Deliveries, k.Push, deliveries)
	}
	if k.Lookup != k.Alloc || k.Alloc != k.Confirm || k.Lookup == 0 || k.Lookup == deliveries {
		t.Errorf("manager calls lookup %d, alloc %d, confirm %d: want equal, some local and some remote", k.Lookup, k.Alloc, k.Confirm)
	}
	if k.SetMin < replicas || k.SetMax > replicas {
		t.Errorf("users' mail on %d to %d nodes: want %d (spread 2, %d replicas)", k.SetMin, k.SetMax, replicas, replicas)
	}

	victim := c.Nodes[simNodes-1]
	f, err := c.Kill(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	after := c.Live()[0].M.UserMap()
	moved := 0
	for b := range before.Node {
		switch {
		case before.Node[b] == victim.ID:
			moved++
			if after.Node[b] == victim.ID {
				t.Errorf("bucket %d still on the dead node", b)
			}
		case after.Node[b] != before.Node[b]:
			t.Errorf("bucket %d moved from %s to %s, though its manager lives", b, before.Node[b], after.Node[b])
		}
	}
	if moved == 0 || f.Moved != moved || f.Gainers == 0 || f.Scans != f.Gainers*(simNodes-2) {
		t.Errorf("failure report %+v: %d buckets were the victim's", f, moved)
	}
	if _, err := c.Deliver(200, users, replicas, 2); err != nil {
		t.Errorf("deliveries after the failure: %v", err)
	}
}
