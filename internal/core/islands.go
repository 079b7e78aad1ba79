package core

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/replica"
)

// The island table (Archipelago §3.1) is the clusterwide object
// cluster.IslandTableObject: every node installs the newest epoch it holds
// on its membership (cluster.Membership.SetIslandTable), which recomputes
// the user map and so moves every placement decision (cluster.Eligible).
// Changing the table is the rebalance driver's (two-phase commit,
// island.Coordinator); here only the first table is made.

// initialCheckInterval is how often a node looks whether the first island
// table is due (cluster.NeedInitial): short beside cluster.InitialStable,
// so the table follows a stable membership within a few seconds.
const initialCheckInterval = time.Second

// initialPutTimeout bounds writing the first table.
const initialPutTimeout = 10 * time.Second

// watchIslandTable installs the table the clusterwide objects hold now
// and every newer one applied later.
func (c *Core) watchIslandTable() {
	c.Wide.OnChange(func(o clusterwide.Object) {
		if o.Name == cluster.IslandTableObject && !o.Deleted {
			// Not on the applying goroutine (a peer's push): installing
			// recomputes the user map and runs its consumers.
			go c.installIslandTable(o)
		}
	})
	if o, ok := c.Wide.Get(cluster.IslandTableObject); ok {
		c.installIslandTable(o)
	}
}

// installIslandTable decodes a table object and installs it if newer.
// Bad data is logged and ignored: the node keeps the table it has.
func (c *Core) installIslandTable(o clusterwide.Object) {
	t, err := island.Decode(o.Data)
	if err != nil {
		c.log.Error("island table object unreadable; keeping the installed table", "object", o.Name, "origin", o.Stamp.Node, "err", err)
		return
	}
	if c.Members == nil {
		return
	}
	if c.Members.SetIslandTable(t) {
		c.log.Info("island table in force", "epoch", t.Epoch(), "table", t.String())
	}
}

// makeInitialIslandTable makes the first table when cluster.NeedInitial
// says this node should, until one exists.
func (c *Core) makeInitialIslandTable() {
	tick := time.NewTicker(initialCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		_, installed := c.Members.IslandTable()
		_, held := c.Wide.Get(cluster.IslandTableObject)
		if installed || held {
			continue // checked again: a driver may delete and remake it
		}
		names, ok := cluster.NeedInitial(c.ID, c.Members.Alive(), false, time.Since(c.Members.ChangedAt()))
		if !ok {
			continue
		}
		t, err := island.Initial(names)
		if err != nil {
			c.log.Error("first island table not made", "islands", names, "err", err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), initialPutTimeout)
		_, err = c.Wide.Put(ctx, c.Repl, c.AliveIDs(), cluster.IslandTableObject, t.Encode(), false, replica.One)
		cancel()
		if err != nil {
			c.log.Warn("first island table not stored; trying again", "islands", names, "err", err)
			continue
		}
		c.log.Info("first island table made", "islands", names)
	}
}
