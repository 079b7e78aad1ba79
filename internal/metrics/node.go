package metrics

import (
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/prometheus/client_golang/prometheus"
)

// NodeState is what one node reports about itself when Prometheus scrapes:
// each func is called once per scrape, so the figures are those of that
// moment and no loop keeps gauges up to date. A nil func reports nothing.
// The funcs return plain values so this package needs none of the
// managers' (which count their events here).
type NodeState struct {
	// Boot is the node's boot incarnation (Porcupine Fig. 6).
	Boot uint64
	// Members counts the members of the node's membership view by state
	// (alive, suspect, dead, left), the node itself included.
	Members func() map[string]int
	// Buckets is the node's user map and its share of it.
	Buckets func() Buckets
	// Log counts the update log's entries (replica.LogStats).
	Log func() Log
	// Repair is what the last repair scan found (replica.RepairStats).
	Repair func() Repair
	// Disk is the data directory's file system and the node's limits.
	Disk func() (Disk, error)
	// PendingDiskOps is the node's load as the balancer sees it: disk
	// operations in progress (Porcupine §5).
	PendingDiskOps func() int
	// Pebble is the store's DB.Metrics.
	Pebble func() (*pebble.Metrics, error)
	// Connections is the client connections open now (internal/guard).
	Connections func() int
	// RedoEntries is the length of the writers' REDO log (0 on a node
	// that keeps none; negative: not reported).
	RedoEntries func() int
	// Workers are the node's SNS worker pools.
	Workers func() []WorkerPool
}

// Buckets is a node's view of the user map (Porcupine §3.2).
type Buckets struct {
	Epoch   uint64
	Managed int // buckets this node manages
	Ready   int // of those, the ones whose soft state is rebuilt
}

// Log counts update log entries by state: pending (a live target still to
// be told), waiting (only absent targets left), done (kept until retired).
type Log struct{ Pending, Waiting, Done int }

// Repair is the last repair scan's figures.
type Repair struct {
	Objects, UnderReplicated int
	Last                     time.Time // zero before the first scan
}

// Disk is the data directory's file system: free (for an unprivileged
// writer) and total bytes, the free space under which the node takes no
// new mail (MinFree), and whether it is under it (Full) or under half of it
// (Critical: no replica writes either).
type Disk struct {
	Free, Size, MinFree int64
	Full, Critical      bool
}

// WorkerPool is one SNS worker pool (sns.Status).
type WorkerPool struct {
	Class                           string
	Max, Alive, Load                int
	Launches, Restarts, RemoteTasks int
}

// nodes is the collector of every node's NodeState in this process.
var nodes = &nodeCollector{states: map[string]*NodeState{}}

// AddNode makes the node's state part of every scrape, its series labelled
// node=id, until the returned func is called. Several nodes may run in one
// process (tests do): each reports its own series under its own id. A
// second AddNode for an id that is still there replaces the first (a node
// started again on the same data directory); the first's remove then does
// nothing. Nothing here can fail or panic at registration.
func AddNode(id string, s NodeState) (remove func()) {
	st := &s
	nodes.mu.Lock()
	nodes.states[id] = st
	nodes.mu.Unlock()
	return func() {
		nodes.mu.Lock()
		defer nodes.mu.Unlock()
		if nodes.states[id] == st {
			delete(nodes.states, id)
		}
	}
}

type nodeCollector struct {
	mu     sync.Mutex
	states map[string]*NodeState
}

// desc makes the description of a node series: node first, then labels.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"node"}, labels...), nil)
}

var (
	descInfo = desc("quill_node_info", "Always 1: names the node id of the instance scraped.")
	descBoot = desc("quill_node_boot_incarnation", "The node's boot incarnation, one more at each start.")
	// The states a member can be in; each is reported, 0 when empty, so a
	// dashboard's series do not come and go.
	memberStates = []string{"alive", "suspect", "dead", "left"}
	descMembers  = desc("quill_members", "Members of this node's membership view by state (alive, suspect, dead, left), itself included.", "state")
	descEpoch    = desc("quill_usermap_epoch", "Epoch of the user map this node holds.")
	descManaged  = desc("quill_buckets_managed", "User map buckets this node manages.")
	descReady    = desc("quill_buckets_ready", "Buckets this node manages whose soft state is rebuilt.")
	descLog      = desc("quill_replication_log_entries", "Update log entries on this node by state: pending (live targets to tell), waiting (only absent targets left), done (to retire).", "state")
	descObjects  = desc("quill_repair_objects", "Objects (messages, queue entries) this node held at its last repair scan.")
	descUnder    = desc("quill_repair_under_replicated_objects", "Objects held here with fewer live replicas than wanted, at the last repair scan.")
	descLastRep  = desc("quill_repair_last_timestamp_seconds", "When the last repair scan ran (Unix time).")
	descFree     = desc("quill_disk_free_bytes", "Free bytes of the data directory's file system (for an unprivileged writer).")
	descSize     = desc("quill_disk_size_bytes", "Size of the data directory's file system in bytes.")
	descMinFree  = desc("quill_disk_min_free_bytes", "Free bytes under which the node takes no new mail (--min-free).")
	descFull     = desc("quill_disk_full", "1 while free space is under --min-free: the node takes no new mail.")
	descCritical = desc("quill_disk_critical", "1 while free space is under half of --min-free: the node takes no replica copies either.")
	descPending  = desc("quill_pending_disk_operations", "Disk operations in progress: the load the balancer weighs (Porcupine §5).")
	descConns    = desc("quill_connections_open", "Client connections open on every listener.")
	descRedo     = desc("quill_redo_entries", "Entries in the mailbox writers' REDO log held here, as of its last sweep.")
	descWorkers  = desc("quill_sns_workers", "SNS worker processes alive, by class.", "class")
	descWMax     = desc("quill_sns_workers_max", "SNS worker processes this node may run, by class.", "class")
	descWLoad    = desc("quill_sns_worker_load", "Tasks in progress on this node's SNS workers, by class.", "class")
	descWLaunch  = desc("quill_sns_worker_launches_total", "SNS worker processes launched, by class.", "class")
	descWRestart = desc("quill_sns_worker_restarts_total", "SNS worker processes restarted after dying, by class.", "class")
	descWRemote  = desc("quill_sns_remote_tasks_total", "Tasks of this node handed to other nodes' SNS workers, by class.", "class")
)

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInfo, descBoot, descMembers, descEpoch, descManaged, descReady, descLog,
		descObjects, descUnder, descLastRep, descFree, descSize, descMinFree, descFull, descCritical, descPending,
		descConns, descRedo, descWorkers, descWMax, descWLoad, descWLaunch, descWRestart, descWRemote} {
		ch <- d
	}
	describePebble(ch)
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ids := make([]string, 0, len(c.states))
	for id := range c.states {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	states := make([]*NodeState, len(ids))
	for i, id := range ids {
		states[i] = c.states[id]
	}
	c.mu.Unlock()
	for i, id := range ids {
		states[i].collect(id, ch)
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func flag(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collect reports one node's state.
func (s *NodeState) collect(id string, ch chan<- prometheus.Metric) {
	gauge(ch, descInfo, 1, id)
	gauge(ch, descBoot, float64(s.Boot), id)
	if s.Members != nil {
		by := s.Members()
		for _, st := range memberStates {
			gauge(ch, descMembers, float64(by[st]), id, st)
		}
	}
	if s.Buckets != nil {
		b := s.Buckets()
		gauge(ch, descEpoch, float64(b.Epoch), id)
		gauge(ch, descManaged, float64(b.Managed), id)
		gauge(ch, descReady, float64(b.Ready), id)
	}
	if s.Log != nil {
		l := s.Log()
		gauge(ch, descLog, float64(l.Pending), id, "pending")
		gauge(ch, descLog, float64(l.Waiting), id, "waiting")
		gauge(ch, descLog, float64(l.Done), id, "done")
	}
	if s.Repair != nil {
		r := s.Repair()
		gauge(ch, descObjects, float64(r.Objects), id)
		gauge(ch, descUnder, float64(r.UnderReplicated), id)
		if !r.Last.IsZero() {
			gauge(ch, descLastRep, float64(r.Last.UnixNano())/1e9, id)
		}
	}
	if s.Disk != nil {
		if d, err := s.Disk(); err == nil {
			gauge(ch, descFree, float64(d.Free), id)
			gauge(ch, descSize, float64(d.Size), id)
			gauge(ch, descMinFree, float64(d.MinFree), id)
			gauge(ch, descFull, flag(d.Full), id)
			gauge(ch, descCritical, flag(d.Critical), id)
		}
	}
	if s.PendingDiskOps != nil {
		gauge(ch, descPending, float64(s.PendingDiskOps()), id)
	}
	if s.RedoEntries != nil {
		if n := s.RedoEntries(); n >= 0 {
			gauge(ch, descRedo, float64(n), id)
		}
	}
	if s.Connections != nil {
		gauge(ch, descConns, float64(s.Connections()), id)
	}
	if s.Workers != nil {
		for _, p := range s.Workers() {
			gauge(ch, descWorkers, float64(p.Alive), id, p.Class)
			gauge(ch, descWMax, float64(p.Max), id, p.Class)
			gauge(ch, descWLoad, float64(p.Load), id, p.Class)
			counter(ch, descWLaunch, float64(p.Launches), id, p.Class)
			counter(ch, descWRestart, float64(p.Restarts), id, p.Class)
			counter(ch, descWRemote, float64(p.RemoteTasks), id, p.Class)
		}
	}
	if s.Pebble != nil {
		// A store closed under a scrape (the node shutting down) reports
		// nothing rather than failing the scrape.
		if m, err := s.Pebble(); err == nil && m != nil {
			collectPebble(id, m, ch)
		}
	}
}
