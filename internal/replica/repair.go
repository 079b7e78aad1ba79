package replica

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/metrics"
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

// repairBatch bounds the objects planned for re-homing in one round, so
// the plan's memory is bounded and a node that lost a peer with much mail
// spreads the copying over rounds, each planned on a fresh scan.
const repairBatch = 10000

// repairRound bounds the time one round spends re-homing: after it no new
// chunk starts, and the next scan plans again with who is alive now.
const repairRound = 30 * time.Second

// rehomeChunk bounds the moves handed to a user's writer in one call: the
// writer holds the user's lock while it copies them, and the user's
// deliveries and sessions wait behind it. A round of 2000 in one call kept
// deliveries waiting for minutes after a wipe.
const rehomeChunk = 50

// rehomeWorkers is how many users' objects one node re-homes at once. Each
// user's moves go through that user's own writer, one chunk after
// another, so users do not wait for each other and their writes share
// fsyncs. One at a time (session 9) re-homed 150-280 objects/s: a wipe of
// a node holding 300k objects took 10-20 minutes to heal.
const rehomeWorkers = 4

// Held is an object this node holds a replica of.
type Held struct {
	Object   string
	User     string
	Replicas []cluster.NodeID
	Want     int
	// Bytes is the object's size here (the message's), for the figures
	// of what a node holds.
	Bytes int64
}

// Scanner is a Handler that can list what this node holds.
type Scanner interface {
	Scan(fn func(h Held) error) error
}

// Move gives an object a new replica set; Gone are replicas it leaves (they
// drop their copy if they ever return). From, when set, is the set the
// move was planned on (the rebalancer's moves, internal/rebalance): the
// writer skips the move if the object's set is another now, and since a
// node of Gone is then live and holding a copy, it first writes the object
// to the new replicas and waits for every one to hold it durably, and only
// then lets the leaving ones drop theirs.
type Move struct {
	Object   string           `json:"object"`
	Replicas []cluster.NodeID `json:"replicas"`
	Gone     []cluster.NodeID `json:"gone,omitempty"`
	From     []cluster.NodeID `json:"from,omitempty"`
}

type repairState struct {
	lastSeen  map[cluster.NodeID]time.Time
	started   time.Time
	stats     RepairStats
	scanTook  time.Duration // the last scan, without the re-homing after it
	roundTook time.Duration // the last round, scan and re-homing
	capped    bool          // the last round left work for the next
}

// RepairStats is what the last repair scan found.
type RepairStats struct {
	Objects         int `json:"objects"`
	UnderReplicated int `json:"under_replicated"`
	Rehomed         int `json:"rehomed"`
	// Misplaced counts objects with a live replica outside their user's
	// island (after an island table change, until repair moves them).
	Misplaced  int       `json:"misplaced,omitempty"`
	LastRepair time.Time `json:"last_repair,omitzero"`
	// Held is what the scan found here by object kind (mailbox.ObjectKind,
	// queue.Kind): the console's figures of what each node holds.
	Held map[string]HeldCount `json:"held,omitempty"`
}

// HeldCount is the objects of one kind held here and their bytes.
type HeldCount struct {
	Objects int   `json:"objects"`
	Bytes   int64 `json:"bytes"`
}

// Away returns how long node n has not been seen alive by the repair scan
// (since this process started, for a node never seen), the measure repair
// holds against ReplaceAfter; false before the first scan.
func (m *Manager) Away(n cluster.NodeID) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.repair.lastSeen == nil {
		return 0, false
	}
	if t, ok := m.repair.lastSeen[n]; ok {
		return time.Since(t), true
	}
	return time.Since(m.repair.started), true
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
		scan, round, capped := m.repair.scanTook, m.repair.roundTook, m.repair.capped
		m.mu.Unlock()
		wait = repairWait(scan, round, capped)
	}
}

// repairWait is the pause before the next round: repairInterval, longer
// when scans are long (scans take at most repairDuty of the time), and
// none while re-homing has work left beyond what the duty asks, since the
// time spent re-homing counts towards it (but a tenth of the interval,
// so a round cut short at once does not spin).
func repairWait(scan, round time.Duration, capped bool) time.Duration {
	duty := time.Duration(float64(scan) / repairDuty)
	if capped {
		return max(repairInterval/10, duty-round)
	}
	return max(repairInterval, duty)
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
	// Which nodes may hold each bucket's state, asked once per bucket and
	// node in a round (the scan reads every object).
	type bucketNode struct {
		b uint8
		n cluster.NodeID
	}
	mays := map[bucketNode]bool{}
	may := func(b uint8, n cluster.NodeID) bool {
		k := bucketNode{b, n}
		v, ok := mays[k]
		if !ok {
			v = placer.May(b, n)
			mays[k] = v
		}
		return v
	}

	var st RepairStats
	scanStart := time.Now()
	byUser := map[string][]Move{}
	planned := 0
	for kind, h := range m.handlers {
		sc, ok := h.(Scanner)
		if !ok {
			continue
		}
		var held HeldCount
		err := sc.Scan(func(o Held) error {
			st.Objects++
			held.Objects++
			held.Bytes += o.Bytes
			b := cluster.Bucket(o.User)
			d := judgeRepair(m.self, o, alive, func(n cluster.NodeID) bool { return may(b, n) },
				func(n cluster.NodeID) bool { return away(n) >= m.ReplaceAfter }, nodes)
			if d.short {
				st.UnderReplicated++
			}
			if d.misplaced {
				st.Misplaced++
			}
			if !d.act || planned >= repairBatch {
				return nil
			}
			var add []cluster.NodeID
			if d.add > 0 {
				add = placer.Replicas(b, o.Replicas, d.add)
				// Short, with nowhere to add: wait. Misplaced, the copies
				// in the user's island are what it can have (an island
				// smaller than R keeps fewer).
				if len(add) == 0 && (!d.copyFirst || len(d.keep) == 0) {
					return nil
				}
			}
			set := append(slices.Clone(d.keep), add...)
			sort.Slice(set, func(i, j int) bool { return set[i] < set[j] })
			mv := Move{Object: o.Object, Replicas: set, Gone: d.gone}
			if d.copyFirst {
				mv.From = o.Replicas
			}
			byUser[o.User] = append(byUser[o.User], mv)
			planned++
			return nil
		})
		if err != nil {
			m.log.Warn("repair scan failed", "kind", kind, "err", err)
		}
		if st.Held == nil {
			st.Held = map[string]HeldCount{}
		}
		st.Held[kind] = held
	}
	scanTook := time.Since(scanStart)
	var cut bool
	st.Rehomed, cut = m.rehome(ctx, writers, byUser)
	metrics.RepairRounds.Inc()
	metrics.RepairRehomed.Add(float64(st.Rehomed))
	if st.Rehomed > 0 || st.UnderReplicated > 0 {
		m.log.Info("repair", "objects", st.Objects, "under_replicated", st.UnderReplicated, "rehomed", st.Rehomed)
	}
	st.LastRepair = now
	m.mu.Lock()
	m.repair.stats, m.repair.scanTook = st, scanTook
	// Work left after a round that made progress goes on at once; a
	// round that re-homed nothing (writers unreachable) waits as usual.
	m.repair.roundTook, m.repair.capped = time.Since(scanStart), (planned >= repairBatch || cut) && st.Rehomed > 0
	m.mu.Unlock()
}

// repairJudgement is what repair decides for one object held here.
type repairJudgement struct {
	short     bool // fewer live replicas in place than wanted
	misplaced bool // a live replica outside the user's island
	act       bool // this node plans a move now
	keep      []cluster.NodeID
	add       int // new replicas to ask the placer for
	gone      []cluster.NodeID
	// copyFirst: the move leaves live replicas while adding new ones, so
	// it is planned on the current set (Move.From) and the writer copies
	// before the leaving ones drop theirs.
	copyFirst bool
}

// judgeRepair decides what repair does with object o held here: alive is
// the live set, in whether a node may hold the user's state (its island,
// cluster.Eligible), replaced whether a node has been away for
// ReplaceAfter, nodes the cluster's size. An object is short when fewer
// of its live replicas are in place than it wants (or than the cluster
// has nodes), and misplaced when a live replica is outside the user's
// island (an island table change moved the user). The lowest live replica
// plans. A replica away for less than ReplaceAfter may come back and
// catch up, so the object waits for it; one away longer leaves. Then:
//
//   - enough replicas in place: the misplaced ones leave (the others hold
//     the message durably already);
//   - short, nothing misplaced: new replicas are added (the repair of
//     Porcupine's lost nodes);
//   - short and misplaced: new replicas in the island are added and the
//     misplaced ones leave, copy first (Move.From), so the copies never
//     number fewer than before; if a replica is also away the writer
//     could not have every node of the old set hold the first write, so
//     this round only adds (keeping the misplaced copies) and drops the
//     away ones, and the next round drops the misplaced.
func judgeRepair(self cluster.NodeID, o Held, alive map[cluster.NodeID]bool, in, replaced func(cluster.NodeID) bool, nodes int) repairJudgement {
	var j repairJudgement
	var live, placed, misplaced, away []cluster.NodeID
	for _, n := range o.Replicas {
		switch {
		case !alive[n]:
			away = append(away, n)
		case in(n):
			live = append(live, n)
			placed = append(placed, n)
		default:
			live = append(live, n)
			misplaced = append(misplaced, n)
		}
	}
	j.misplaced = len(misplaced) > 0
	want := min(max(o.Want, 1), nodes)
	j.short = len(placed) < want
	if !j.short && !j.misplaced {
		return j
	}
	if len(live) == 0 || slices.Min(live) != self {
		return j // another live replica plans it
	}
	for _, n := range away {
		if !replaced(n) {
			return j // may still come back and catch up
		}
	}
	j.act = true
	j.add = max(0, want-len(placed))
	switch {
	case j.add == 0:
		j.keep, j.gone = placed, append(misplaced, away...)
	case !j.misplaced:
		j.keep, j.gone = placed, away
	case len(away) == 0:
		j.keep, j.gone, j.copyFirst = placed, misplaced, true
	default:
		j.keep, j.gone = live, away
	}
	return j
}

// rehome hands the planned moves to the users' writers, rehomeWorkers
// users at a time and rehomeChunk moves per call, until repairRound has
// passed or the node stops; it returns how many objects were re-homed and
// whether time ran out with moves left.
func (m *Manager) rehome(ctx context.Context, writers Writers, byUser map[string][]Move) (int, bool) {
	deadline := time.Now().Add(repairRound)
	users := make(chan string)
	var mu sync.Mutex
	done, cut := 0, false
	var wg sync.WaitGroup
	for range min(rehomeWorkers, len(byUser)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for user := range users {
				moves := byUser[user]
				for len(moves) > 0 && time.Now().Before(deadline) && !m.stopping() {
					chunk := moves[:min(len(moves), rehomeChunk)]
					moves = moves[len(chunk):]
					if err := writers.Rehome(ctx, user, chunk); err != nil {
						m.log.Warn("repair: could not re-home objects", "user", user, "objects", len(chunk), "err", err)
						break
					}
					mu.Lock()
					done += len(chunk)
					mu.Unlock()
				}
				if len(moves) > 0 && !time.Now().Before(deadline) {
					mu.Lock()
					cut = true
					mu.Unlock()
				}
			}
		}()
	}
	for user := range byUser {
		users <- user
	}
	close(users)
	wg.Wait()
	return done, cut
}

func (m *Manager) stopping() bool {
	select {
	case <-m.stop:
		return true
	default:
		return false
	}
}
