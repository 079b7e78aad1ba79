// Package islandmgr changes the bucket→island table of a running cluster
// (Archipelago §3.1 and §4.1): it is the I/O side of internal/island, which
// decides everything. One node, the live node with the lowest id, looks at
// the islands every planInterval: when an island has appeared (nodes
// started with a new --island), one is being removed (quill island remove),
// or the bytes the islands hold have drifted past the threshold, it runs
// island.Rebalance over the bytes every live node holds per bucket and
// drives island.Coordinator for the new table, with the lowest-id live node
// of each island answering as that island's island.Participant. Messages
// travel over the Islands RPC service; the coordinator's commit record and
// each participant's prepared record are written to the node's store,
// fsync'd, before the messages that depend on them go out, as the
// two-phase protocol requires.
//
// Once committed, the coordinator publishes the table as the clusterwide
// object island/table (every node installs a higher epoch; nodes that were
// away learn it from anti-entropy), and each participant installs it when
// the Commit reaches it. Installing the table is the switch: the moved
// buckets' managers, writers and placement change island at once, and the
// replication manager's repair copies their mail to the new island before
// it drops the old copies, while the mail map still finds it where it was.
//
// A change aborts, leaving the table as it was, when any island of the old
// or new table cannot answer or refuses (the isolation Archipelago trades
// for: an island with no live node stops the change, not the service), and
// is tried again at the next plan once the islands are back.
package islandmgr

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/store"
	"google.golang.org/grpc"
)

const (
	// planInterval is how often the coordinator node looks at the islands:
	// a look is one Loads call per live node, cheap, and a new island
	// starts taking its users within seconds of settling.
	planInterval = 5 * time.Second
	// settleAfterChange is how long the live set must have been stable
	// before a plan: the nodes of a starting island arrive one by one, and
	// a plan per arrival would move buckets to an island of one node, then
	// again when its second node appears.
	settleAfterChange = 10 * time.Second
	// loadsTimeout bounds one Loads call; a node that does not answer
	// leaves the plan for the next round.
	loadsTimeout = 5 * time.Second
	// finishWait bounds how long Close waits for a change under way to
	// reach a point it can resume from (its records are durable at every
	// step, so stopping early loses nothing).
	finishWait = 5 * time.Second
)

// Store keys (kind store.KindNode): the two records the protocol keeps.
var (
	keyCoordinator = append([]byte{store.KindNode}, "island-coordinator"...)
	keyParticipant = append([]byte{store.KindNode}, "island-participant"...)
)

// Members is what the manager needs of the membership.
type Members interface {
	// Alive returns the live members, this node included.
	Alive() []cluster.MemberInfo
	// ChangedAt returns when the live set last changed.
	ChangedAt() time.Time
	// IslandTable returns the installed table, if any.
	IslandTable() (island.Table, bool)
	// SetIslandTable installs t if its epoch is higher than the
	// installed one's.
	SetIslandTable(t island.Table) bool
}

// Config wires a Manager to its node.
type Config struct {
	Self cluster.NodeID
	// Island is this node's island (island.Default without --island).
	Island  string
	DB      *store.DB
	Members Members
	// IslandOf returns a member's island.
	IslandOf func(cluster.MemberInfo) string
	// Conn returns a connection to a node's RPC server.
	Conn func(cluster.NodeID) (grpc.ClientConnInterface, error)
	// Loads returns the bytes this node holds per bucket (its last scan).
	Loads func() ([cluster.Buckets]int64, bool)
	// Publish writes a committed table to the cluster state (the
	// clusterwide object island/table).
	Publish func(ctx context.Context, t island.Table) error
	// Removals are the islands an administrator asked to remove, kept as
	// cluster state so that any node takes the request and the
	// coordinator, whichever node it is, sees it.
	Removals Removals
	// Threshold is Rebalance's band (island.DefaultThreshold if 0).
	Threshold float64
	Log       *slog.Logger
}

// Removals is the cluster's list of islands to remove.
type Removals interface {
	List() []string
	Add(ctx context.Context, name string) error
	Drop(ctx context.Context, name string) error
}

// Status is what the manager shows (GET /api/islands).
type Status struct {
	// Coordinator says this node plans the changes.
	Coordinator bool `json:"coordinator"`
	// Change is the change under way ("" when none): its epoch and phase.
	Change string `json:"change,omitempty"`
	// Waiting says why no plan could be made.
	Waiting string `json:"waiting,omitempty"`
	// Removing are the islands an administrator asked to remove.
	Removing []string `json:"removing,omitempty"`
	// Last is the last change's outcome.
	Last     string    `json:"last,omitempty"`
	LastAt   time.Time `json:"last_at,omitzero"`
	Moved    int       `json:"moved_buckets"`
	Commits  int       `json:"commits"`
	Aborts   int       `json:"aborts"`
	Prepared string    `json:"prepared,omitempty"` // this node's participant, when in doubt
}

// Manager runs table changes on one node.
type Manager struct {
	cfg Config

	mu     sync.Mutex
	part   *island.Participant // nil until a table is installed here
	coord  *island.Coordinator // the change this node coordinates, if any
	status Status

	stop chan struct{}
	wg   sync.WaitGroup
}

// New returns a manager; Start runs it.
func New(cfg Config) *Manager {
	if cfg.Threshold == 0 {
		cfg.Threshold = island.DefaultThreshold
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, stop: make(chan struct{})}
}

// Register adds the Islands service to the node's RPC server.
func (m *Manager) Register(r grpc.ServiceRegistrar) {
	nodepb.RegisterIslandsServer(r, server{m: m})
}

// Start restores the records and runs the planning and in-doubt loops.
func (m *Manager) Start() error {
	rec, ok, err := m.readRecord(keyParticipant)
	if err != nil {
		return err
	}
	if ok {
		p, err := island.NewParticipant(m.cfg.Island, rec, m.check)
		if err != nil {
			return fmt.Errorf("island participant record: %w", err)
		}
		m.part = p
		m.cfg.Members.SetIslandTable(rec.Current)
	}
	m.wg.Add(1)
	go m.loop()
	return nil
}

// Close stops the loops; a change under way resumes from its record at the
// next start.
func (m *Manager) Close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(finishWait):
		m.cfg.Log.Warn("islands: a table change still running at shutdown; it resumes at the next start")
	}
}

// Status returns what the manager is doing.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.status
	s.Removing = m.cfg.Removals.List()
	if m.coord != nil {
		s.Change = fmt.Sprintf("epoch %d: %s", m.coord.Next().Epoch(), m.coord.Phase())
	}
	if m.part != nil && m.part.Phase() == island.Prepared {
		s.Prepared = "in doubt: waiting for the coordinator's outcome"
	}
	return s
}

// Remove asks that an island lose all its buckets at the coordinator's
// next plan (the administrator's `quill island remove`); its nodes must
// stay up until its users' mail has moved.
func (m *Manager) Remove(ctx context.Context, name string) error {
	if err := island.ValidName(name); err != nil {
		return err
	}
	t, ok := m.cfg.Members.IslandTable()
	if !ok {
		return errors.New("no island table: the cluster has one island")
	}
	if !t.Has(name) {
		return fmt.Errorf("island %s is not in the table (epoch %d)", name, t.Epoch())
	}
	removing := map[string]bool{name: true}
	for _, n := range m.cfg.Removals.List() {
		removing[n] = true
	}
	kept := 0
	for _, n := range t.Islands() {
		if !removing[n] {
			kept++
		}
	}
	if kept == 0 {
		return fmt.Errorf("island %s: removing it would leave no island", name)
	}
	return m.cfg.Removals.Add(ctx, name)
}

func (m *Manager) loop() {
	defer m.wg.Done()
	plan := time.NewTicker(planInterval)
	defer plan.Stop()
	doubt := time.NewTicker(island.QueryInterval)
	defer doubt.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-m.stop; cancel() }()
	if rec, ok, err := m.readRecord(keyCoordinator); err != nil {
		m.cfg.Log.Error("islands: coordinator record unreadable", "err", err)
	} else if ok {
		m.resume(ctx, rec)
	}
	for {
		select {
		case <-m.stop:
			return
		case <-plan.C:
			m.learn()
			m.plan(ctx)
		case <-doubt.C:
			m.learn()
			m.askOutcome(ctx)
		}
	}
}

// check vets a proposal before this island votes yes: every island it
// names must be one the membership knows or the current table has, so a
// table from a confused coordinator cannot send buckets to an island that
// does not exist.
func (m *Manager) check(t island.Table) error {
	known := map[string]bool{}
	for _, mi := range m.cfg.Members.Alive() {
		known[m.cfg.IslandOf(mi)] = true
	}
	if cur, ok := m.cfg.Members.IslandTable(); ok {
		for _, n := range cur.Islands() {
			known[n] = true
		}
	}
	return t.Validate(sortedKeys(known))
}

// participant returns this node's participant, made from the installed
// table on first use and kept level with it (a table committed while this
// node did not answer for its island reaches it through the cluster state).
// Call with m.mu held.
func (m *Manager) participant() (*island.Participant, error) {
	t, ok := m.cfg.Members.IslandTable()
	if m.part == nil {
		if !ok {
			return nil, errors.New("no island table installed here yet")
		}
		p, err := island.NewParticipant(m.cfg.Island, island.Record{Phase: island.Idle, Current: t}, m.check)
		if err != nil {
			return nil, err
		}
		m.part = p
		return p, nil
	}
	if ok && t.Epoch() > m.part.Current().Epoch() {
		eff, _ := m.part.Step(island.Msg{Kind: island.Learn, Table: t})
		if err := m.applyParticipant(eff); err != nil {
			return nil, err
		}
	}
	return m.part, nil
}

// learn brings the participant level with the installed table.
func (m *Manager) learn() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.participant(); err != nil && m.part != nil {
		m.cfg.Log.Warn("islands: learning the installed table", "err", err)
	}
}

// applyParticipant does a participant step's I/O: the record durably, then
// the table installed. Call with m.mu held.
func (m *Manager) applyParticipant(eff island.Effects) error {
	if eff.Persist != nil {
		if err := m.writeRecord(keyParticipant, *eff.Persist); err != nil {
			return err
		}
	}
	if eff.Install != nil {
		if m.cfg.Members.SetIslandTable(*eff.Install) {
			m.cfg.Log.Info("islands: table installed", "epoch", eff.Install.Epoch())
		}
	}
	return nil
}

// askOutcome sends a participant in doubt's Query to its coordinator.
func (m *Manager) askOutcome(ctx context.Context) {
	m.mu.Lock()
	if m.part == nil || m.part.Phase() != island.Prepared {
		m.mu.Unlock()
		return
	}
	eff, _ := m.part.Step(island.Msg{Kind: island.Timeout})
	m.mu.Unlock()
	for _, q := range eff.Send {
		replies, err := m.send(ctx, q)
		if err != nil {
			m.cfg.Log.Info("islands: in doubt, coordinator not reachable", "epoch", q.Epoch, "coordinator", q.To, "err", err)
			continue
		}
		m.mu.Lock()
		for _, r := range replies {
			if e, err := m.part.Step(r); err == nil {
				if err := m.applyParticipant(e); err != nil {
					m.cfg.Log.Error("islands: participant record", "err", err)
				}
			}
		}
		m.mu.Unlock()
	}
}

// answerer returns the node answering for a participant (an island: its
// lowest-id live node) or the coordinator (a node id).
func (m *Manager) answerer(to string) (cluster.NodeID, error) {
	var best cluster.NodeID
	for _, mi := range m.cfg.Members.Alive() {
		if mi.ID == cluster.NodeID(to) {
			return mi.ID, nil
		}
		if m.cfg.IslandOf(mi) == to && (best == "" || mi.ID < best) {
			best = mi.ID
		}
	}
	if best == "" {
		return "", fmt.Errorf("%s: no live node", to)
	}
	return best, nil
}

// send delivers one message and returns the answers to it.
func (m *Manager) send(ctx context.Context, msg island.Msg) ([]island.Msg, error) {
	node, err := m.answerer(msg.To)
	if err != nil {
		return nil, err
	}
	if node == m.cfg.Self {
		return m.step(msg)
	}
	cc, err := m.cfg.Conn(node)
	if err != nil {
		return nil, fmt.Errorf("%s (node %s): %w", msg.To, node, err)
	}
	ctx, cancel := context.WithTimeout(ctx, island.PrepareTimeout)
	defer cancel()
	rep, err := nodepb.NewIslandsClient(cc).Step(ctx, toPB(msg))
	if err != nil {
		return nil, fmt.Errorf("%s (node %s): %w", msg.To, node, err)
	}
	out := make([]island.Msg, 0, len(rep.Msgs))
	for _, p := range rep.Msgs {
		r, err := fromPB(p)
		if err != nil {
			return nil, fmt.Errorf("%s (node %s): %w", msg.To, node, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// step takes a message addressed to this node and returns its answers.
func (m *Manager) step(msg island.Msg) ([]island.Msg, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch msg.Kind {
	case island.Prepare, island.Commit, island.Abort:
		if msg.To != m.cfg.Island {
			return nil, fmt.Errorf("node %s answers for island %s, not %s", m.cfg.Self, m.cfg.Island, msg.To)
		}
		p, err := m.participant()
		if err != nil {
			return nil, fmt.Errorf("island %s: %w", m.cfg.Island, err)
		}
		eff, err := p.Step(msg)
		if err != nil {
			return nil, err
		}
		if err := m.applyParticipant(eff); err != nil {
			return nil, fmt.Errorf("island %s: %w", m.cfg.Island, err)
		}
		return eff.Send, nil
	case island.Query:
		if m.coord != nil && m.coord.Next().Epoch() == msg.Epoch {
			eff, err := m.coord.Step(msg)
			return eff.Send, err
		}
		if rec, ok, err := m.readRecord(keyCoordinator); err == nil && ok && rec.Proposal.Epoch() == msg.Epoch {
			return []island.Msg{{Kind: island.Commit, From: string(m.cfg.Self), To: msg.From, Epoch: msg.Epoch}}, nil
		}
		if t, ok := m.cfg.Members.IslandTable(); ok && t.Epoch() >= msg.Epoch {
			// Committed by a coordinator that has finished and forgotten
			// it, or by another: the table in force answers.
			return []island.Msg{{Kind: island.Learn, Table: t}}, nil
		}
		return []island.Msg{island.Presume(string(m.cfg.Self), msg)}, nil
	}
	return nil, fmt.Errorf("islands: node %s cannot take a %s message", m.cfg.Self, msg.Kind)
}

// coordinatorNode reports whether this node plans: the live node with the
// lowest id.
func (m *Manager) coordinatorNode(alive []cluster.MemberInfo) bool {
	for _, mi := range alive {
		if mi.ID < m.cfg.Self {
			return false
		}
	}
	return true
}

func (m *Manager) setWaiting(why string) {
	m.mu.Lock()
	m.status.Waiting = why
	m.mu.Unlock()
}

// plan looks at the islands once and runs a change if one is due.
func (m *Manager) plan(ctx context.Context) {
	alive := m.cfg.Members.Alive()
	isCoord := m.coordinatorNode(alive)
	m.mu.Lock()
	m.status.Coordinator = isCoord
	m.mu.Unlock()
	if !isCoord {
		return
	}
	t, ok := m.cfg.Members.IslandTable()
	if !ok {
		m.setWaiting("no island table yet")
		return
	}
	if since := time.Since(m.cfg.Members.ChangedAt()); since < settleAfterChange {
		m.setWaiting(fmt.Sprintf("membership changed %s ago", since.Round(time.Second)))
		return
	}
	removing := m.removals(ctx, t, alive)
	in, why := Inputs(t, alive, m.cfg.IslandOf, removing)
	if why != "" {
		m.setWaiting(why)
		return
	}
	loads, why := m.gather(ctx, alive)
	if why != "" {
		m.setWaiting(why)
		return
	}
	next, moves, err := island.Rebalance(t, in, loads, m.cfg.Threshold)
	if err != nil {
		m.setWaiting(err.Error())
		return
	}
	m.setWaiting("")
	if next.Epoch() == t.Epoch() {
		return
	}
	parts := union(t.Islands(), next.Islands())
	c, eff, err := island.NewCoordinator(string(m.cfg.Self), t, next, parts)
	if err != nil {
		m.cfg.Log.Error("islands: cannot start a table change", "err", err)
		return
	}
	var bytes int64
	for _, mv := range moves {
		bytes += mv.Bytes
	}
	m.cfg.Log.Info("islands: changing the table", "from_epoch", t.Epoch(), "to_epoch", next.Epoch(),
		"islands", next.Islands(), "moved_buckets", len(moves), "moved_bytes", bytes)
	m.drive(ctx, c, eff, len(moves))
}

// removals returns the islands being removed. A removal stays while the
// island is in the table or any of its nodes runs (so a removed island
// whose nodes are still up is not added back); it is dropped once both
// are over, and nodes started later with that island add it anew.
func (m *Manager) removals(ctx context.Context, t island.Table, alive []cluster.MemberInfo) map[string]bool {
	out := map[string]bool{}
	for _, n := range m.cfg.Removals.List() {
		up := false
		for _, mi := range alive {
			up = up || m.cfg.IslandOf(mi) == n
		}
		if !up && !t.Has(n) {
			if err := m.cfg.Removals.Drop(ctx, n); err != nil {
				m.cfg.Log.Warn("islands: dropping a finished removal", "island", n, "err", err)
			}
			continue
		}
		out[n] = true
	}
	return out
}

// Inputs returns the islands Rebalance should keep, with their capacities
// (their live nodes), or why no plan can be made: an island of the table
// with no live node can neither give nor take buckets, and its bytes are
// unknown, so the plan waits for it.
func Inputs(t island.Table, alive []cluster.MemberInfo, islandOf func(cluster.MemberInfo) string, removing map[string]bool) ([]island.Island, string) {
	nodes := map[string]int{}
	for _, mi := range alive {
		nodes[islandOf(mi)]++
	}
	for _, n := range t.Islands() {
		if nodes[n] == 0 {
			return nil, fmt.Sprintf("island %s has no live node", n)
		}
	}
	var out []island.Island
	for _, n := range sortedKeys(nodes) {
		if !removing[n] {
			out = append(out, island.Island{Name: n, Capacity: float64(nodes[n])})
		}
	}
	if len(out) == 0 {
		return nil, "every island is being removed"
	}
	return out, ""
}

// gather sums the bytes every live node holds per bucket.
func (m *Manager) gather(ctx context.Context, alive []cluster.MemberInfo) (island.Loads, string) {
	var loads island.Loads
	for _, mi := range alive {
		var b [cluster.Buckets]int64
		if mi.ID == m.cfg.Self {
			var ok bool
			if b, ok = m.cfg.Loads(); !ok {
				return loads, "this node has not scanned what it holds yet"
			}
		} else {
			got, err := m.remoteLoads(ctx, mi.ID)
			if err != nil {
				return loads, err.Error()
			}
			b = got
		}
		for i := range b {
			loads[i] += b[i]
		}
	}
	return loads, ""
}

func (m *Manager) remoteLoads(ctx context.Context, id cluster.NodeID) ([cluster.Buckets]int64, error) {
	var b [cluster.Buckets]int64
	cc, err := m.cfg.Conn(id)
	if err != nil {
		return b, fmt.Errorf("node %s: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(ctx, loadsTimeout)
	defer cancel()
	rep, err := nodepb.NewIslandsClient(cc).Loads(ctx, &nodepb.Empty{})
	if err != nil {
		return b, fmt.Errorf("node %s: loads: %w", id, err)
	}
	if !rep.Known || len(rep.Bytes) != cluster.Buckets {
		return b, fmt.Errorf("node %s has not scanned what it holds yet", id)
	}
	copy(b[:], rep.Bytes)
	return b, nil
}

// resume finishes a change whose commit this node logged before it
// stopped: the table is published again (idempotent) and the Commits
// resent until every island has applied it.
func (m *Manager) resume(ctx context.Context, rec island.Record) {
	parts := rec.Proposal.Islands()
	if cur, ok := m.cfg.Members.IslandTable(); ok {
		parts = union(parts, cur.Islands())
	}
	c, eff, err := island.RestoreCoordinator(string(m.cfg.Self), rec, parts)
	if err != nil {
		m.cfg.Log.Error("islands: cannot resume the logged table change", "err", err)
		return
	}
	m.cfg.Log.Info("islands: resuming a committed table change", "epoch", rec.Proposal.Epoch())
	m.publish(ctx, rec.Proposal)
	m.drive(ctx, c, eff, 0)
}

// publish installs a committed table here and writes it to the cluster
// state, retrying until it is written or the node stops: a participant
// that missed its Commit learns the table from there.
func (m *Manager) publish(ctx context.Context, t island.Table) {
	m.cfg.Members.SetIslandTable(t)
	for {
		err := m.cfg.Publish(ctx, t)
		if err == nil {
			return
		}
		m.cfg.Log.Warn("islands: publishing the committed table", "epoch", t.Epoch(), "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(island.OutcomeRetry):
		}
	}
}

// drive runs a coordinator to its end: the sends in parallel, their
// answers (or Unreachable) stepped in, the commit logged and published
// before any Commit goes out, the outcome resent every OutcomeRetry until
// every island has applied it.
func (m *Manager) drive(ctx context.Context, c *island.Coordinator, eff island.Effects, moved int) {
	m.mu.Lock()
	m.coord = c
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.coord = nil
		m.mu.Unlock()
	}()
	for {
		if eff.Persist != nil {
			if err := m.writeRecord(keyCoordinator, *eff.Persist); err != nil {
				// Not logged, so not decided: the participants learn the
				// abort by presumption when they ask.
				m.cfg.Log.Error("islands: logging the commit failed; the change is abandoned", "err", err)
				return
			}
			m.publish(ctx, eff.Persist.Proposal)
		}
		var in []island.Msg
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, msg := range eff.Send {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies, err := m.send(ctx, msg)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					m.cfg.Log.Info("islands: no answer", "kind", msg.Kind, "to", msg.To, "epoch", msg.Epoch, "err", err)
					in = append(in, island.Msg{Kind: island.Unreachable, From: msg.To, To: msg.From, Epoch: msg.Epoch})
					return
				}
				in = append(in, replies...)
			}()
		}
		wg.Wait()
		eff = island.Effects{}
		m.mu.Lock()
		for _, r := range in {
			if r.Kind == island.Learn {
				continue // a participant already has a newer table: no answer to step
			}
			e, err := c.Step(r)
			if err != nil {
				m.cfg.Log.Warn("islands: dropped a message", "err", err)
				continue
			}
			if e.Persist != nil {
				eff.Persist = e.Persist
			}
			eff.Send = append(eff.Send, e.Send...)
		}
		finished := c.Finished()
		m.mu.Unlock()
		if eff.Persist != nil || len(eff.Send) > 0 {
			continue
		}
		if finished {
			m.finish(c, moved)
			return
		}
		select {
		case <-ctx.Done():
			return // the record stays: the next start resumes
		case <-time.After(island.OutcomeRetry):
		}
		m.mu.Lock()
		eff, _ = c.Step(island.Msg{Kind: island.Timeout, Epoch: c.Next().Epoch()})
		m.mu.Unlock()
	}
}

// finish records a change's outcome and forgets its record.
func (m *Manager) finish(c *island.Coordinator, moved int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.status.LastAt = time.Now()
	if c.Phase() == island.Committed {
		if err := m.cfg.DB.DeleteAll([][]byte{keyCoordinator}, store.Sync); err != nil {
			m.cfg.Log.Warn("islands: dropping the finished commit record", "err", err)
		}
		metrics.IslandChanges.WithLabelValues("committed").Inc()
		m.status.Commits++
		m.status.Moved += moved
		m.status.Last = fmt.Sprintf("epoch %d committed, %d buckets moved", c.Next().Epoch(), moved)
		m.cfg.Log.Info("islands: table change committed", "epoch", c.Next().Epoch(), "moved_buckets", moved)
		return
	}
	metrics.IslandChanges.WithLabelValues("aborted").Inc()
	m.status.Aborts++
	m.status.Last = fmt.Sprintf("epoch %d aborted: %s", c.Next().Epoch(), c.Reason())
	m.cfg.Log.Warn("islands: table change aborted", "epoch", c.Next().Epoch(), "reason", c.Reason())
}

// Record encoding: version, phase, then the coordinator's name and the two
// tables, each length-prefixed (0: absent).
const recordV1 = 1

// EncodeRecord returns a record's stored form.
func EncodeRecord(r island.Record) []byte {
	out := []byte{recordV1, byte(r.Phase)}
	field := func(b []byte) {
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	field([]byte(r.Coordinator))
	for _, t := range []island.Table{r.Current, r.Proposal} {
		if len(t.Islands()) == 0 {
			field(nil)
		} else {
			field(t.Encode())
		}
	}
	return out
}

// DecodeRecord parses EncodeRecord's output.
func DecodeRecord(b []byte) (island.Record, error) {
	var r island.Record
	if len(b) < 2 || b[0] != recordV1 {
		return r, fmt.Errorf("island record: %d bytes, version %v: not a record this node reads", len(b), b[:min(1, len(b))])
	}
	r.Phase = island.Phase(b[1])
	p := b[2:]
	field := func(what string) ([]byte, error) {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, fmt.Errorf("island record: %s truncated", what)
		}
		v := p[k : k+int(n)]
		p = p[k+int(n):]
		return v, nil
	}
	c, err := field("coordinator")
	if err != nil {
		return r, err
	}
	r.Coordinator = string(c)
	for _, t := range []*island.Table{&r.Current, &r.Proposal} {
		v, err := field("table")
		if err != nil {
			return r, err
		}
		if len(v) > 0 {
			if *t, err = island.Decode(v); err != nil {
				return r, fmt.Errorf("island record: %w", err)
			}
		}
	}
	if len(p) != 0 {
		return r, fmt.Errorf("island record: %d bytes left over", len(p))
	}
	return r, nil
}

func (m *Manager) readRecord(key []byte) (island.Record, bool, error) {
	v, closer, err := m.cfg.DB.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return island.Record{}, false, nil
	}
	if err != nil {
		return island.Record{}, false, fmt.Errorf("reading %s: %w", key[1:], err)
	}
	defer closer.Close()
	rec, err := DecodeRecord(v)
	if err != nil {
		return island.Record{}, false, fmt.Errorf("reading %s: %w", key[1:], err)
	}
	return rec, true, nil
}

// writeRecord stores a record fsync'd: the protocol sends nothing that
// depends on a record before it is durable.
func (m *Manager) writeRecord(key []byte, r island.Record) error {
	if err := m.cfg.DB.Set(key, EncodeRecord(r), store.Sync); err != nil {
		return fmt.Errorf("writing %s: %w", key[1:], err)
	}
	return nil
}

// server is the Islands RPC service.
type server struct {
	nodepb.UnimplementedIslandsServer
	m *Manager
}

func (s server) Step(_ context.Context, p *nodepb.IslandMsg) (*nodepb.IslandMsgs, error) {
	msg, err := fromPB(p)
	if err != nil {
		return nil, err
	}
	out, err := s.m.step(msg)
	if err != nil {
		return nil, err
	}
	rep := &nodepb.IslandMsgs{}
	for _, r := range out {
		rep.Msgs = append(rep.Msgs, toPB(r))
	}
	return rep, nil
}

func (s server) Loads(context.Context, *nodepb.Empty) (*nodepb.IslandLoads, error) {
	b, ok := s.m.cfg.Loads()
	if !ok {
		return &nodepb.IslandLoads{}, nil
	}
	return &nodepb.IslandLoads{Bytes: b[:], Known: true}, nil
}

func toPB(m island.Msg) *nodepb.IslandMsg {
	p := &nodepb.IslandMsg{Kind: uint32(m.Kind), From: m.From, To: m.To, Epoch: m.Epoch, Base: m.Base, Yes: m.Yes, Reason: m.Reason}
	if len(m.Table.Islands()) > 0 {
		p.Table = m.Table.Encode()
	}
	return p
}

func fromPB(p *nodepb.IslandMsg) (island.Msg, error) {
	m := island.Msg{Kind: island.Kind(p.Kind), From: p.From, To: p.To, Epoch: p.Epoch, Base: p.Base, Yes: p.Yes, Reason: p.Reason}
	if m.Kind < island.Prepare || m.Kind > island.Learn {
		return m, fmt.Errorf("island message of unknown kind %d", p.Kind)
	}
	if len(p.Table) > 0 {
		t, err := island.Decode(p.Table)
		if err != nil {
			return m, err
		}
		m.Table = t
	}
	return m, nil
}

func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
