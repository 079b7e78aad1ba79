package node

import (
	"context"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/mailbox"
	quillmetrics "github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/sns"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/telemetry"
)

// newReporter makes the node's reporter; its figures read n, which the
// caller fills in before the first report is asked for.
func newReporter(n **Node) *telemetry.Reporter {
	return &telemetry.Reporter{
		Figures: func(r *telemetry.Report) {
			if *n != nil {
				(*n).figures(r)
			}
		},
		Counters: telemetry.Counters{
			// Deliveries and failures are counted per process (one
			// node per process outside tests); logins per node.
			Deliveries: func() float64 { return quillmetrics.Total(quillmetrics.Delivered) },
			Errors:     func() float64 { return quillmetrics.Total(quillmetrics.DeliveryFailures) },
			Logins: func() float64 {
				if *n == nil || (*n).Guard == nil {
					return 0
				}
				ok, _ := (*n).Guard.LoginCounts()
				return float64(ok)
			},
			LoginFailures: func() float64 {
				if *n == nil || (*n).Guard == nil {
					return 0
				}
				_, failed := (*n).Guard.LoginCounts()
				return float64(failed)
			},
		},
	}
}

// figures fills a report with what the node's managers say now.
func (n *Node) figures(r *telemetry.Report) {
	r.Node, r.Hostname, r.Boot, r.Started = string(n.ID), n.cfg.Hostname, n.Boot, n.started
	if n.cfg.Island != island.Default {
		r.Island = n.cfg.Island // the console shows an island when there are islands
	}
	rs := n.Repl.RepairStats()
	held := rs.Held[mailbox.ObjectKind]
	r.Messages, r.MessageBytes = int64(held.Objects), held.Bytes
	r.Queued = int64(rs.Held[queue.Kind].Objects)
	r.Objects, r.UnderReplicated, r.Rehomed, r.LastRepair = int64(rs.Objects), int64(rs.UnderReplicated), int64(rs.Rehomed), rs.LastRepair
	if n.Rebal != nil {
		st := n.Rebal.Status()
		r.Rebalancing, r.RebalanceSurplus, r.RebalanceMoved = st.Active, st.SurplusBytes, st.Moved
	}
	r.DiskFree, r.DiskTotal, _ = store.DiskSpace(n.cfg.DataDir)
	r.DiskFull = n.DiskFull()
	r.Pending = n.Boxes.Pending()
	r.LoadAverage = loadAverage()
	ls := n.Repl.Stats()
	r.LogPending, r.LogWaiting, r.LogDone = ls.Pending, ls.Waiting, ls.Done
	r.BucketsManaged, r.BucketsReady = n.Users.Reconstruction()
	r.Users = n.Users.ManagedUsers()
	if n.Guard != nil {
		r.Connections, _ = n.Guard.Open()
	}
	r.HeapBytes = heapBytes()
	for _, p := range []*sns.Pool{n.relays, n.filters} {
		if p == nil {
			continue
		}
		st := p.Status()
		wp := telemetry.WorkerPool{Class: st.Class, Max: st.Max}
		for _, w := range st.Workers {
			wp.Workers++
			wp.Load += w.Load
		}
		r.Workers = append(r.Workers, wp)
	}
}

// newView is the console's picture of the cluster, asked of every member.
func (n *Node) newView() *telemetry.View {
	return telemetry.NewView(telemetry.Sources{
		Self:    n.ID,
		Members: n.Members.Members,
		Local:   n.reporter.Report,
		Ask: func(ctx context.Context, id cluster.NodeID) (telemetry.Report, error) {
			cc, err := n.Peers.Conn(id)
			if err != nil {
				return telemetry.Report{}, err
			}
			return telemetry.Ask(ctx, cc)
		},
		Away:         n.Repl.Away,
		ReplaceAfter: n.Repl.ReplaceAfter,
	})
}

// loadAverage is the host's one-minute load average (0 where /proc has
// none).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return f
}

// heapBytes reads the live heap without stopping the world (unlike
// runtime.ReadMemStats).
func heapBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}
