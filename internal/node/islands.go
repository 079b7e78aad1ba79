package node

import (
	"context"
	"errors"
	"sort"

	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/cluster"
)

// nodeIslands is the admin API's view of the islands (/api/islands, the
// console's island grid).
type nodeIslands struct{ n *Node }

func (a nodeIslands) IslandStatus() admin.IslandStatus {
	n := a.n
	var st admin.IslandStatus
	t, ok := n.Members.IslandTable()
	live := map[string][]string{}
	for _, mi := range n.Members.Alive() {
		live[mi.IslandOf()] = append(live[mi.IslandOf()], string(mi.ID))
	}
	seen := map[string]bool{}
	if ok {
		st.Table, st.Epoch = true, t.Epoch()
		st.Owners = make([]string, cluster.Buckets)
		for b := range cluster.Buckets {
			st.Owners[b] = t.Island(uint8(b))
		}
		for _, name := range t.Islands() {
			seen[name] = true
			st.Islands = append(st.Islands, admin.IslandSummary{Name: name, Buckets: len(t.Owned(name)), Nodes: live[name], InTable: true})
		}
	}
	for name, nodes := range live {
		if seen[name] {
			continue
		}
		buckets := 0
		if !ok {
			buckets = cluster.Buckets // one island: it owns every bucket
		}
		st.Islands = append(st.Islands, admin.IslandSummary{Name: name, Nodes: nodes, Buckets: buckets})
	}
	for _, isl := range st.Islands {
		sort.Strings(isl.Nodes)
	}
	sort.Slice(st.Islands, func(i, j int) bool { return st.Islands[i].Name < st.Islands[j].Name })
	if n.Islands != nil {
		ms := n.Islands.Status()
		st.Manager = &ms
	}
	return st
}

func (a nodeIslands) RemoveIsland(ctx context.Context, name string) error {
	if a.n.Islands == nil {
		return errors.New("islands are not kept on this node (Cassandra store)")
	}
	return a.n.Islands.Remove(ctx, name)
}
