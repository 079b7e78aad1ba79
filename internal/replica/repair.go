package replica

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// Repair brings objects back to their number of replicas. Porcupine's update
// log only reaches replicas that come back; a node that never returns (a
// wiped disk comes back as a new node) would leave its objects one copy
// short for ever. So each node scans the objects it holds, and for those
// with fewer live replicas than wanted, the lowest-named live replica asks
// for new ones once the missing nodes have been away for ReplaceAfter. The
// new replica set is written by the object's ordered writer (the user's
// mailbox writer), so it is ordered with every other change of the object.

// DefaultReplaceAfter is how long a replica may be away before its objects
// get a replica elsewhere: longer than a restart or a pause, so a node that
// comes back quickly catches up from the logs instead of being copied anew.
const DefaultReplaceAfter = time.Minute

// repairInterval is how often a node scans what it holds.
const repairInterval = 5 * time.Second

// repairDuty bounds the share of time scans take: after a scan that took
// d, the next one waits at least d/repairDuty. A scan reads every message
// record (about 0.3 s per million here: BenchmarkRepairScan), so a node
// holding millions scans less often rather than all the time.
const repairDuty = 0.05

// repairBatch bounds the objects re-homed in one round, so a node that
// lost a peer with much mail spreads the copying over rounds.
const repairBatch = 2000

// rehomeChunk bounds the moves handed to a user's writer in one call: the
// writer holds the user's lock while it copies them, and the user's
// deliveries and sessions wait behind it. A round of 2000 in one call kept
// deliveries waiting for minutes after a wipe.
const rehomeChunk = 50

// Held is an object this node holds a replica of.
type Held struct {
	Object   string
	User     string
	Replicas []cluster.NodeID
	Want     int
}

// Scanner is a Handler that can list what this node holds.
type Scanner interface {
	Scan(fn func(h Held) error) error
}

// Move gives an object a new replica set; Gone are replicas it leaves (they
// drop their copy if they ever return).
type Move struct {
	Object   string           `json:"object"`
	Replicas []cluster.NodeID `json:"replicas"`
	Gone     []cluster.NodeID `json:"gone,omitempty"`
}

type repairState struct {
	lastSeen map[cluster.NodeID]time.Time
	started  time.Time
	stats    RepairStats
	scanTook time.Duration // the last scan, without the re-homing after it
}

// RepairStats is what the last repair scan found.
type RepairStats struct {
	Objects         int       `json:"objects"`
	UnderReplicated int       `json:"under_replicated"`
	Rehomed         int       `json:"rehomed"`
	LastRepair      time.Time `json:"last_repair,omitzero"`
}

// RepairStats returns the last scan's figures.
func (m *Manager) RepairStats() RepairStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.repair.stats
}

func (m *Manager) repairLoop() {
	defer m.wg.Done()
	wait := repairInterval
	for {
		select {
		case <-m.stop:
			return
		case <-time.After(wait):
		}
		m.RepairOnce(context.Background())
		m.mu.Lock()
		took := m.repair.scanTook
		m.mu.Unlock()
		wait = max(repairInterval, time.Duration(float64(took)/repairDuty))
	}
}

// RepairOnce scans the objects held here once and re-homes those whose
// missing replicas have been away long enough.
func (m *Manager) RepairOnce(ctx context.Context) {
	peers := m.getPeers()
	m.mu.Lock()
	writers, placer := m.writers, m.placer
	if m.repair.lastSeen == nil {
		m.repair.lastSeen = map[cluster.NodeID]time.Time{}
		m.repair.started = time.Now()
	}
	m.mu.Unlock()
	if peers == nil || writers == nil || placer == nil {
		return
	}
	now := time.Now()
	alive := m.alive()
	// An object is short when it has fewer live replicas than its R, or
	// than the cluster's nodes if there are fewer. The nodes away count:
	// a node cut off from the others (or restarted alone) holding single
	// copies must say they are short, though it cannot mend them yet.
	nodes := max(len(alive), peers.Expected())
	m.mu.Lock()
	for n := range alive {
		m.repair.lastSeen[n] = now
	}
	away := func(n cluster.NodeID) time.Duration {
		if t, ok := m.repair.lastSeen[n]; ok {
			return now.Sub(t)
		}
		return now.Sub(m.repair.started)
	}
	m.mu.Unlock()

	var st RepairStats
	scanStart := time.Now()
	byUser := map[string][]Move{}
	planned := 0
	for kind, h := range m.handlers {
		sc, ok := h.(Scanner)
		if !ok {
			continue
		}
		err := sc.Scan(func(o Held) error {
			st.Objects++
			var live, gone []cluster.NodeID
			for _, n := range o.Replicas {
				if alive[n] {
					live = append(live, n)
				} else {
					gone = append(gone, n)
				}
			}
			want := min(max(o.Want, 1), nodes)
			if len(live) >= want {
				return nil
			}
			st.UnderReplicated++
			if !slices.Contains(live, m.self) || slices.Min(live) != m.self || planned >= repairBatch {
				return nil // another live replica repairs it
			}
			for _, n := range gone {
				if away(n) < m.ReplaceAfter {
					return nil // may still come back and catch up
				}
			}
			add := placer.Replicas(o.Replicas, want-len(live))
			if len(add) == 0 {
				return nil
			}
			set := append(slices.Clone(live), add...)
			sort.Slice(set, func(i, j int) bool { return set[i] < set[j] })
			byUser[o.User] = append(byUser[o.User], Move{Object: o.Object, Replicas: set, Gone: gone})
			planned++
			return nil
		})
		if err != nil {
			m.log.Warn("repair scan failed", "kind", kind, "err", err)
		}
	}
	scanTook := time.Since(scanStart)
	for user, moves := range byUser {
		for len(moves) > 0 {
			chunk := moves[:min(len(moves), rehomeChunk)]
			moves = moves[len(chunk):]
			if err := writers.Rehome(ctx, user, chunk); err != nil {
				m.log.Warn("repair: could not re-home objects", "user", user, "objects", len(chunk), "err", err)
				break
			}
			st.Rehomed += len(chunk)
		}
	}
	if st.Rehomed > 0 || st.UnderReplicated > 0 {
		m.log.Info("repair", "objects", st.Objects, "under_replicated", st.UnderReplicated, "rehomed", st.Rehomed)
	}
	st.LastRepair = now
	m.mu.Lock()
	m.repair.stats, m.repair.scanTook = st, scanTook
	m.mu.Unlock()
}
