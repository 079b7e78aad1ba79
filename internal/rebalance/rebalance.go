// Package rebalance moves existing mail from over-full nodes to under-full
// ones (issue 17 item 6). Porcupine's load balancer (§5) places only new
// mail: a node that joins, or comes back empty after --replace-after, gets
// its share of new messages at once but would hold none of the old ones
// for ever, and the nodes that were there keep serving all of them. Here
// each node gossips the message bytes and copies it holds
// (cluster.NodeMeta.Held); when a node is outside DefaultBand of the mean,
// every node above the mean moves some of its own messages, as its writer
// orders them, to the nodes below it: each move is a rehome through the
// user's mailbox writer (writer/rebalance.go), which writes the message to
// the new replica durably before the leaving node drops its copy, so the
// copies never number fewer than R, and which skips a message whose
// replica set changed since it was planned (an expunge, a repair, another
// node's move). Moves are paced by --rebalance-rate.
//
// The decisions are pure functions (decide.go); this file is the loop
// around them: scan, plan with the gossiped figures, move, wait.
package rebalance

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/replica"
)

// DefaultRate is how many messages a node moves per second when it
// rebalances: at 100 a node hands a new one 360,000 copies an hour, while
// each move (two writes of the message's record and one copy of its bytes)
// costs about as much as a delivery, a small share of what a node takes.
const DefaultRate = 100

// Timings of the loop. Each is deliberate:
const (
	// scanInterval is how often a node scans what it holds, for its
	// gossiped figures and its plan. A scan reads every message record
	// (about 0.3 s per million, replica.BenchmarkRepairScan).
	scanInterval = 5 * time.Second
	// settleWait is how long a node waits after a round that moved mail
	// before it plans again: a scan interval for the receivers to count
	// what they got, and two gossip rounds (cluster metaUpdateInterval) for
	// the figures to come back; planned on older figures, a node would
	// send again what it just sent.
	settleWait = scanInterval + 4*time.Second
	// roundLimit bounds the moving of one round; the next round plans on
	// fresh figures (nodes joining or leaving meanwhile).
	roundLimit = time.Minute
	// moveChunk bounds the moves handed to a user's writer in one call:
	// the user's deliveries and sessions wait behind its lock meanwhile
	// (as repair's rehomeChunk).
	moveChunk = 50
	// moveWorkers is how many users' moves go on at once: each waits for
	// its writer and every new replica's fsync, so one at a time would not
	// reach the rate.
	moveWorkers = 4
	// moveTimeout bounds one call to a writer.
	moveTimeout = 30 * time.Second
)

// Members is what the rebalancer needs of the membership: the live
// members and the island table (with one, a node rebalances only within
// its island: Confine).
type Members interface {
	Alive() []cluster.MemberInfo
	IslandTable() (island.Table, bool)
}

// Writers moves messages to new replica sets (writer.Manager.Rehome).
type Writers interface {
	Rehome(ctx context.Context, user string, moves []replica.Move) error
}

// Status is the rebalancer's progress (GET /api/replication).
type Status struct {
	// Rate is the pace in messages per second (0: off).
	Rate float64 `json:"rate"`
	// Active says a rebalance is on (a node is outside the band).
	Active bool `json:"active"`
	// HeldBytes and HeldMessages are what this node's last scan found.
	HeldBytes    int64 `json:"held_bytes"`
	HeldMessages int   `json:"held_messages"`
	// MeanBytes is the live nodes' mean; SurplusBytes what this node
	// holds above it.
	MeanBytes    int64 `json:"mean_bytes"`
	SurplusBytes int64 `json:"surplus_bytes"`
	// Planned is the moves of the current round; Moved and MovedBytes the
	// moves handed to writers since the node started.
	Planned    int       `json:"planned"`
	Moved      int64     `json:"moved"`
	MovedBytes int64     `json:"moved_bytes"`
	LastRound  time.Time `json:"last_round,omitzero"`
	// Waiting names why no plan was made (a node's figures unknown).
	Waiting string `json:"waiting,omitempty"`
}

// Rebalancer is one node's rebalancer.
type Rebalancer struct {
	self    cluster.NodeID
	scan    replica.Scanner
	members Members
	writers Writers
	rate    float64
	band    Band
	log     *slog.Logger
	// island is this node's island, as its own meta says (figures).
	island string

	known atomic.Bool
	held  atomic.Int64
	msgs  atomic.Int64
	// buckets is the last scan's bytes per user-map bucket: what the
	// islands' coordinator sums to weigh buckets (internal/islandmgr).
	buckets atomic.Pointer[[cluster.Buckets]int64]

	mu     sync.Mutex
	status Status
	active bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// New returns the rebalancer of node self over the messages scan lists;
// rate is messages per second (0: it only counts and gossips what it holds).
func New(self cluster.NodeID, scan replica.Scanner, members Members, writers Writers, rate float64, log *slog.Logger) *Rebalancer {
	r := &Rebalancer{self: self, scan: scan, members: members, writers: writers, rate: rate, band: DefaultBand, log: log,
		stop: make(chan struct{})}
	r.status.Rate = rate
	return r
}

// Holds returns the bytes and copies of messages this node's last scan
// found, for gossip; ok is false before the first scan (a node that
// gossiped 0 then would be taken for an empty one and sent mail).
func (r *Rebalancer) Holds() (bytes int64, messages int, ok bool) {
	return r.held.Load(), int(r.msgs.Load()), r.known.Load()
}

// BucketBytes returns the bytes of mail this node held per user-map bucket
// at its last scan; ok is false before the first.
func (r *Rebalancer) BucketBytes() (b [cluster.Buckets]int64, ok bool) {
	if p := r.buckets.Load(); p != nil {
		return *p, true
	}
	return b, false
}

// Status returns the progress.
func (r *Rebalancer) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Start runs the loop until Close.
func (r *Rebalancer) Start() {
	r.wg.Add(1)
	go r.loop()
}

// Close stops the loop and waits for the round under way to stop.
func (r *Rebalancer) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
}

func (r *Rebalancer) loop() {
	defer r.wg.Done()
	wait := time.Duration(0)
	for {
		select {
		case <-r.stop:
			return
		case <-time.After(wait):
		}
		wait = scanInterval
		if r.Round(context.Background()) > 0 {
			wait = settleWait
		}
	}
}

// Round scans, plans and moves once; it returns the moves handed to
// writers.
func (r *Rebalancer) Round(ctx context.Context) int {
	var bytes int64
	count := 0
	perBucket := new([cluster.Buckets]int64)
	err := r.scan.Scan(func(h replica.Held) error {
		bytes += h.Bytes
		count++
		perBucket[cluster.Bucket(h.User)] += h.Bytes
		return nil
	})
	if err != nil {
		r.log.Warn("rebalance: scan failed", "err", err)
		return 0
	}
	r.buckets.Store(perBucket)
	r.held.Store(bytes)
	r.msgs.Store(int64(count))
	r.known.Store(true)

	table, islands := r.members.IslandTable()
	nodes, live, waiting := r.figures(bytes, count, table, islands)
	m := int64(mean(nodes))
	metrics.RebalanceSurplus.Set(float64(max(0, bytes-m)))
	r.mu.Lock()
	r.status.HeldBytes, r.status.HeldMessages, r.status.MeanBytes = bytes, count, m
	r.status.SurplusBytes, r.status.Waiting, r.status.LastRound = max(0, bytes-m), waiting, time.Now()
	active := r.active
	r.mu.Unlock()
	if waiting != "" || r.rate <= 0 {
		return 0
	}
	sends, on := Plan(r.self, nodes, r.band, active)
	var held []Held
	if len(sends) > 0 {
		// Only a node with mail to send keeps its messages in memory for
		// the choice: a second scan, rather than every node holding a
		// list of all it holds every scanInterval.
		err := r.scan.Scan(func(h replica.Held) error {
			if Confine(table, islands, r.island, h.User) {
				held = append(held, h)
			}
			return nil
		})
		if err != nil {
			r.log.Warn("rebalance: scan failed", "err", err)
			return 0
		}
	}
	moves := Choose(r.self, held, sends, live)
	r.mu.Lock()
	r.active, r.status.Active, r.status.Planned = on, on, len(moves)
	r.mu.Unlock()
	if len(moves) == 0 {
		return 0
	}
	size := map[string]int64{}
	users := map[string]string{}
	for _, h := range held {
		size[h.Object], users[h.Object] = h.Bytes, h.User
	}
	r.log.Info("rebalance: moving messages", "moves", len(moves), "held_bytes", bytes, "mean_bytes", m, "sends", sends)
	return r.move(ctx, moves, users, size)
}

// figures returns the live nodes' holdings (this node's from its scan),
// the live set, and why no plan can be made (a live node whose figures are
// not known yet), if so.
func (r *Rebalancer) figures(bytes int64, count int, table island.Table, islands bool) ([]Node, map[cluster.NodeID]bool, string) {
	var nodes []Node
	live := map[cluster.NodeID]bool{}
	waiting := ""
	alive := r.members.Alive()
	for _, mi := range alive {
		if mi.ID == r.self {
			r.island = mi.IslandOf()
		}
	}
	for _, mi := range alive {
		if mi.State != "alive" || (islands && mi.IslandOf() != r.island) {
			continue // with islands, the band is judged among the island's nodes
		}
		live[mi.ID] = true
		n := Node{ID: mi.ID, Bytes: mi.Held, Messages: mi.Messages, DiskFull: mi.DiskFull}
		if mi.ID == r.self {
			n.Bytes, n.Messages = bytes, count
		} else if !mi.HeldKnown {
			waiting = "figures of node " + string(mi.ID) + " not known yet"
		}
		nodes = append(nodes, n)
	}
	if !live[r.self] {
		waiting = "this node is not alive in the membership"
	}
	return nodes, live, waiting
}

// move hands the moves to the users' writers, moveWorkers users at a time
// and moveChunk moves per call, paced by the rate, until roundLimit.
func (r *Rebalancer) move(ctx context.Context, moves []replica.Move, users map[string]string, size map[string]int64) int {
	byUser := map[string][]replica.Move{}
	var order []string
	for _, mv := range moves {
		u := users[mv.Object]
		if byUser[u] == nil {
			order = append(order, u)
		}
		byUser[u] = append(byUser[u], mv)
	}
	chunk := max(1, min(moveChunk, int(r.rate)))
	lim := rate.NewLimiter(rate.Limit(r.rate), chunk)
	ctx, cancel := context.WithTimeout(ctx, roundLimit)
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	work := make(chan string)
	var done atomic.Int64
	var wg sync.WaitGroup
	for range min(moveWorkers, len(order)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range work {
				r.moveUser(ctx, lim, u, byUser[u], chunk, size, &done)
			}
		}()
	}
	for _, u := range order {
		select {
		case work <- u:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	return int(done.Load())
}

// moveUser moves one user's messages, chunk by chunk.
func (r *Rebalancer) moveUser(ctx context.Context, lim *rate.Limiter, user string, moves []replica.Move, chunk int, size map[string]int64, done *atomic.Int64) {
	for len(moves) > 0 {
		c := moves[:min(len(moves), chunk)]
		moves = moves[len(c):]
		if err := lim.WaitN(ctx, len(c)); err != nil {
			return // the round's time is up, or the node stops
		}
		cctx, cancel := context.WithTimeout(ctx, moveTimeout)
		err := r.writers.Rehome(cctx, user, c)
		cancel()
		if err != nil {
			r.log.Warn("rebalance: messages not moved", "user", user, "messages", len(c), "err", err)
			return // the rest of the user's waits for a plan on a fresh scan
		}
		var b int64
		for _, mv := range c {
			b += size[mv.Object]
		}
		done.Add(int64(len(c)))
		// What this node gossips goes down as it moves, not at its next
		// scan a round later: the other nodes plan on it meanwhile.
		r.held.Add(-b)
		r.msgs.Add(-int64(len(c)))
		metrics.RebalanceMoved.Add(float64(len(c)))
		metrics.RebalanceMovedBytes.Add(float64(b))
		r.mu.Lock()
		r.status.Moved += int64(len(c))
		r.status.MovedBytes += b
		r.mu.Unlock()
	}
}
