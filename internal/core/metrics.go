package core

import (
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/store"
)

// MetricsState is what the node's managers report when Prometheus scrapes
// (metrics.AddNode): membership, user map, update log, repair, disk and
// Pebble, each read at that moment.
func (c *Core) MetricsState() metrics.NodeState {
	return metrics.NodeState{
		Boot: c.Boot,
		Members: func() map[string]int {
			by := map[string]int{}
			for _, mi := range c.Members.Members() {
				by[mi.State]++
			}
			return by
		},
		Buckets: func() metrics.Buckets {
			managed, ready := c.Users.Reconstruction()
			return metrics.Buckets{Epoch: c.Members.UserMap().Epoch, Managed: managed, Ready: ready}
		},
		Log: func() metrics.Log {
			s := c.Repl.Stats()
			return metrics.Log{Pending: s.Pending, Waiting: s.Waiting, Done: s.Done}
		},
		Repair: func() metrics.Repair {
			s := c.Repl.RepairStats()
			return metrics.Repair{Objects: s.Objects, UnderReplicated: s.UnderReplicated, Last: s.LastRepair}
		},
		Disk: func() (metrics.Disk, error) {
			free, size, err := store.DiskSpace(c.dataDir)
			return metrics.Disk{Free: free, Size: size, MinFree: c.Opts.MinFree, Full: c.full.Load(), Critical: c.critical.Load()}, err
		},
		PendingDiskOps: c.Boxes.Pending,
		RedoEntries:    c.Writers.RedoEntries,
		Pebble:         c.DB.Metrics,
	}
}
