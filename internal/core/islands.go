package core

import (
	"cmp"
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/islandmgr"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

// The island table (Archipelago §3.1) is the clusterwide object
// cluster.IslandTableObject: every node installs the newest epoch it holds
// on its membership (cluster.Membership.SetIslandTable), which recomputes
// the user map and so moves every placement decision (cluster.Eligible).
// Changing the table is internal/islandmgr's (two-phase commit,
// island.Coordinator), wired here; the first table is made here.

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
		metrics.IslandEpoch.Set(float64(t.Epoch()))
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

// newIslandManager makes the node's island manager (internal/islandmgr):
// the membership is read through the core, since the manager's RPC
// service is registered before the membership starts.
func (c *Core) newIslandManager(id cluster.NodeID, isl string, db *store.DB, log *slog.Logger) *islandmgr.Manager {
	return islandmgr.New(islandmgr.Config{
		Self: id, Island: cmp.Or(isl, island.Default), DB: db, Members: islandMembers{c},
		IslandOf: func(mi cluster.MemberInfo) string { return mi.IslandOf() },
		Conn:     c.Peers.Conn,
		Loads:    c.Rebal.BucketBytes,
		Publish: func(ctx context.Context, t island.Table) error {
			_, err := c.Wide.Put(ctx, c.Repl, c.AliveIDs(), cluster.IslandTableObject, t.Encode(), false, replica.One)
			return err
		},
		Removals: islandRemovals{c},
		Log:      log,
	})
}

// islandRemovalPrefix names the clusterwide objects of islands an
// administrator asked to remove (islandmgr.Removals): one object per
// island, so two requests through two nodes both stand.
const islandRemovalPrefix = "island/remove/"

// islandRemovals keeps removal requests as clusterwide objects.
type islandRemovals struct{ c *Core }

func (r islandRemovals) List() []string {
	var out []string
	for _, o := range r.c.Wide.List(islandRemovalPrefix) {
		out = append(out, strings.TrimPrefix(o.Name, islandRemovalPrefix))
	}
	return out
}

func (r islandRemovals) Add(ctx context.Context, name string) error {
	_, err := r.c.Wide.Put(ctx, r.c.Repl, r.c.AliveIDs(), islandRemovalPrefix+name, []byte(name), false, replica.One)
	return err
}

func (r islandRemovals) Drop(ctx context.Context, name string) error {
	_, err := r.c.Wide.Put(ctx, r.c.Repl, r.c.AliveIDs(), islandRemovalPrefix+name, nil, true, replica.One)
	return err
}

// islandMembers is the membership as the island manager sees it.
type islandMembers struct{ c *Core }

func (m islandMembers) Alive() []cluster.MemberInfo       { return m.c.Members.Alive() }
func (m islandMembers) ChangedAt() time.Time              { return m.c.Members.ChangedAt() }
func (m islandMembers) IslandTable() (island.Table, bool) { return m.c.Members.IslandTable() }
func (m islandMembers) SetIslandTable(t island.Table) bool {
	if m.c.Members.SetIslandTable(t) {
		metrics.IslandEpoch.Set(float64(t.Epoch()))
		return true
	}
	return false
}
