package islandmgr

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/store"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// world is a cluster of managers in one process: each with its own Pebble
// store and its own view of the installed table, talking through the real
// Islands service handlers (the transport is a direct call; the cluster
// test in tests/cluster runs it over gRPC between processes).
type world struct {
	mu    sync.Mutex
	nodes map[cluster.NodeID]*testNode
	wide  island.Table // the published table (the clusterwide object)
	pubs  int
	// removing is the removal requests (clusterwide objects in a node).
	removing map[string]bool
}

func (w *world) List() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return sortedKeys(w.removing)
}

func (w *world) Add(_ context.Context, name string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removing[name] = true
	return nil
}

func (w *world) Drop(_ context.Context, name string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.removing, name)
	return nil
}

type testNode struct {
	w      *world
	id     cluster.NodeID
	island string
	down   bool
	table  island.Table
	has    bool
	loads  [cluster.Buckets]int64
	mgr    *Manager
	db     *store.DB
}

func (n *testNode) Alive() []cluster.MemberInfo {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	var out []cluster.MemberInfo
	for _, o := range n.w.nodes {
		if !o.down {
			out = append(out, cluster.MemberInfo{Member: cluster.Member{ID: o.id}, NodeMeta: cluster.NodeMeta{RPC: o.island}})
		}
	}
	slices.SortFunc(out, func(a, b cluster.MemberInfo) int { return compare(a.ID, b.ID) })
	return out
}

func compare(a, b cluster.NodeID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (n *testNode) ChangedAt() time.Time { return time.Now().Add(-time.Hour) }

func (n *testNode) IslandTable() (island.Table, bool) {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	return n.table, n.has
}

func (n *testNode) SetIslandTable(t island.Table) bool {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	if n.has && t.Epoch() <= n.table.Epoch() {
		return false
	}
	n.table, n.has = t, true
	return true
}

// conn is a ClientConnInterface that calls the callee's service handlers.
type conn struct{ to *testNode }

func (c conn) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	c.to.w.mu.Lock()
	down := c.to.down
	c.to.w.mu.Unlock()
	if down {
		return fmt.Errorf("node %s: connection refused", c.to.id)
	}
	s := server{m: c.to.mgr}
	var out proto.Message
	var err error
	switch method {
	case nodepb.Islands_Step_FullMethodName:
		out, err = s.Step(ctx, args.(*nodepb.IslandMsg))
	case nodepb.Islands_Loads_FullMethodName:
		out, err = s.Loads(ctx, args.(*nodepb.Empty))
	default:
		return fmt.Errorf("no method %s", method)
	}
	if err != nil {
		return err
	}
	proto.Merge(reply.(proto.Message), out)
	return nil
}

func (c conn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

// newWorld starts nodes named island-i (ids sorted as listed) with the
// given table installed on every node, each node holding load bytes in
// each bucket its island owns.
func newWorld(t *testing.T, t0 island.Table, islands map[string]int, load int64) *world {
	t.Helper()
	w := &world{nodes: map[cluster.NodeID]*testNode{}, wide: t0, removing: map[string]bool{}}
	for isl, count := range islands {
		for i := range count {
			id := cluster.NodeID(fmt.Sprintf("n-%s-%d", isl, i))
			db, err := store.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			n := &testNode{w: w, id: id, island: isl, table: t0, has: true, db: db}
			for _, b := range t0.Owned(isl) {
				n.loads[b] = load
			}
			w.nodes[id] = n
		}
	}
	for _, n := range w.nodes {
		n.mgr = newManager(w, n)
	}
	return w
}

func newManager(w *world, n *testNode) *Manager {
	return New(Config{
		Self: n.id, Island: n.island, DB: n.db, Members: n,
		IslandOf: func(mi cluster.MemberInfo) string { return mi.RPC },
		Conn: func(id cluster.NodeID) (grpc.ClientConnInterface, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			o, ok := w.nodes[id]
			if !ok {
				return nil, fmt.Errorf("unknown node %s", id)
			}
			return conn{o}, nil
		},
		Loads:    func() ([cluster.Buckets]int64, bool) { return n.loads, true },
		Removals: w,
		Publish: func(_ context.Context, t island.Table) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			if t.Epoch() > w.wide.Epoch() {
				w.wide = t
			}
			w.pubs++
			return nil
		},
	})
}

func (w *world) lowest() *testNode {
	var best *testNode
	for _, n := range w.nodes {
		if !n.down && (best == nil || n.id < best.id) {
			best = n
		}
	}
	return best
}

func (w *world) epochs() map[cluster.NodeID]uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[cluster.NodeID]uint64{}
	for id, n := range w.nodes {
		out[id] = n.table.Epoch()
	}
	return out
}

func initial(t *testing.T, names ...string) island.Table {
	t.Helper()
	tb, err := island.Initial(names)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestAddedIslandGetsItsShare(t *testing.T) {
	t0 := initial(t, "a", "b")
	w := newWorld(t, t0, map[string]int{"a": 2, "b": 2, "c": 2}, 1000)
	coord := w.lowest()
	coord.mgr.plan(context.Background())

	st := coord.mgr.Status()
	if st.Commits != 1 || st.Aborts != 0 {
		t.Fatalf("status after the plan: %+v", st)
	}
	// The Commit goes to each island's lowest node; the others install
	// from the cluster state (the published table).
	for id, e := range w.epochs() {
		if w.nodes[id].id == cluster.NodeID("n-"+w.nodes[id].island+"-0") && e != t0.Epoch()+1 {
			t.Errorf("node %s answered for its island but is at epoch %d", id, e)
		}
	}
	if w.wide.Epoch() != t0.Epoch()+1 {
		t.Fatalf("published epoch %d, want %d", w.wide.Epoch(), t0.Epoch()+1)
	}
	next := w.wide
	if got := len(next.Owned("c")); got < 80 || got > 90 {
		t.Errorf("island c owns %d buckets after joining three equal islands, want about 85", got)
	}
	for _, isl := range []string{"a", "b"} {
		for _, b := range next.Owned(isl) {
			if t0.Island(b) != isl {
				t.Errorf("bucket %d moved to %s from %s: an island that loses may not gain", b, isl, t0.Island(b))
			}
		}
	}
	if _, ok, err := coord.mgr.readRecord(keyCoordinator); err != nil || ok {
		t.Errorf("coordinator record after every Done: present %v, err %v", ok, err)
	}
	for _, n := range w.nodes {
		if n.mgr.part != nil && n.mgr.part.Phase() != island.Idle {
			t.Errorf("node %s left %s", n.id, n.mgr.part.Phase())
		}
	}
	// Balanced now: the next plan changes nothing.
	for _, n := range w.nodes {
		n.loads = [cluster.Buckets]int64{}
		for _, b := range next.Owned(n.island) {
			n.loads[b] = 1000
		}
	}
	coord.mgr.plan(context.Background())
	if st := coord.mgr.Status(); st.Commits != 1 {
		t.Errorf("a second plan over balanced islands changed the table: %+v", st)
	}
}

func TestUnreachableIslandAborts(t *testing.T) {
	t0 := initial(t, "a", "b")
	w := newWorld(t, t0, map[string]int{"a": 1, "b": 1, "c": 1}, 1000)
	coord := w.lowest() // n-a-0
	// b's node answers Loads but its Step fails: take it down after the
	// loads are gathered by failing the transport at the Prepare.
	b := w.nodes["n-b-0"]
	loads, why := coord.mgr.gather(context.Background(), coord.Alive())
	if why != "" {
		t.Fatal(why)
	}
	alive := coord.Alive()
	b.down = true
	in, _ := Inputs(t0, alive, func(mi cluster.MemberInfo) string { return mi.RPC }, nil)
	next, _, err := island.Rebalance(t0, in, loads, island.DefaultThreshold)
	if err != nil {
		t.Fatal(err)
	}
	c, eff, err := island.NewCoordinator(string(coord.id), t0, next, union(t0.Islands(), next.Islands()))
	if err != nil {
		t.Fatal(err)
	}
	coord.mgr.drive(context.Background(), c, eff, 1)
	if st := coord.mgr.Status(); st.Aborts != 1 || st.Commits != 0 {
		t.Fatalf("status: %+v", st)
	}
	for id, e := range w.epochs() {
		if e != t0.Epoch() {
			t.Errorf("node %s installed epoch %d after an abort", id, e)
		}
	}
	if w.pubs != 0 {
		t.Errorf("an aborted change was published %d times", w.pubs)
	}
	for _, n := range w.nodes {
		if n.mgr.part != nil && n.mgr.part.Phase() == island.Prepared {
			t.Errorf("node %s still prepared after the abort", n.id)
		}
	}
	// b back: the next plan commits.
	b.down = false
	coord.mgr.plan(context.Background())
	if st := coord.mgr.Status(); st.Commits != 1 {
		t.Fatalf("after b came back: %+v", st)
	}
}

func TestNoPlanWhileAnIslandIsDown(t *testing.T) {
	t0 := initial(t, "a", "b")
	w := newWorld(t, t0, map[string]int{"a": 1, "b": 1, "c": 1}, 1000)
	w.nodes["n-b-0"].down = true
	coord := w.lowest()
	coord.mgr.plan(context.Background())
	st := coord.mgr.Status()
	if st.Commits+st.Aborts != 0 || st.Waiting != "island b has no live node" {
		t.Fatalf("status: %+v", st)
	}
}

func TestRemovedIslandEmpties(t *testing.T) {
	t0 := initial(t, "a", "b", "c")
	w := newWorld(t, t0, map[string]int{"a": 1, "b": 1, "c": 1}, 1000)
	coord := w.lowest()
	ctx := context.Background()
	// Asked through a node that does not coordinate: the request is
	// cluster state, and the coordinator acts on it.
	if err := w.nodes["n-c-0"].mgr.Remove(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := coord.mgr.Remove(ctx, "zz"); err == nil {
		t.Error("removing an island not in the table was accepted")
	}
	coord.mgr.plan(ctx)
	if got := w.wide.Owned("c"); len(got) != 0 || w.wide.Has("c") {
		t.Fatalf("island c after its removal: owns %d buckets, in table %v", len(got), w.wide.Has("c"))
	}
	// c's node still runs: the removal stands, so c is not added back.
	for _, n := range w.nodes {
		n.loads = [cluster.Buckets]int64{}
		for _, b := range w.wide.Owned(n.island) {
			n.loads[b] = 1000
		}
	}
	coord.mgr.plan(ctx)
	if w.wide.Has("c") || coord.mgr.Status().Commits != 1 {
		t.Fatalf("a removed island whose node still runs was added back: %+v", coord.mgr.Status())
	}
	// c's node stopped: the removal is over, and dropped.
	w.nodes["n-c-0"].down = true
	coord.mgr.plan(ctx)
	if st := coord.mgr.Status(); len(st.Removing) != 0 {
		t.Errorf("removal still pending after island c's table entry and nodes are gone: %+v", st)
	}
	if err := coord.mgr.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := coord.mgr.Remove(ctx, "b"); err == nil {
		t.Error("removing the last island was accepted")
	}
}

// A coordinator that logged its commit and stopped before any Commit went
// out resumes at its next start: the table is published and reaches every
// island.
func TestCommittedChangeResumesAfterRestart(t *testing.T) {
	t0 := initial(t, "a", "b")
	w := newWorld(t, t0, map[string]int{"a": 1, "b": 1}, 1000)
	coord := w.lowest()
	var owners [cluster.Buckets]string
	for b := range owners {
		owners[b] = t0.Island(uint8(b))
	}
	owners[7] = "b"
	if t0.Island(7) == "b" {
		owners[7] = "a"
	}
	next, err := island.New(t0.Epoch()+1, owners, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Both islands prepared (their records durable), then the coordinator
	// logged the commit and died.
	for _, n := range w.nodes {
		n.mgr.mu.Lock()
		p, err := n.mgr.participant()
		if err != nil {
			t.Fatal(err)
		}
		eff, _ := p.Step(island.Msg{Kind: island.Prepare, From: string(coord.id), To: n.island, Epoch: next.Epoch(), Base: t0.Epoch(), Table: next})
		if err := n.mgr.applyParticipant(eff); err != nil {
			t.Fatal(err)
		}
		n.mgr.mu.Unlock()
	}
	if err := coord.mgr.writeRecord(keyCoordinator, island.Record{Phase: island.Committed, Proposal: next}); err != nil {
		t.Fatal(err)
	}
	// Restart every manager from its store.
	for _, n := range w.nodes {
		n.mgr = newManager(w, n)
		if err := n.mgr.Start(); err != nil {
			t.Fatal(err)
		}
		if n.mgr.part == nil || n.mgr.part.Phase() != island.Prepared {
			t.Fatalf("node %s did not restore its prepared record", n.id)
		}
	}
	defer func() {
		for _, n := range w.nodes {
			n.mgr.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for _, e := range w.epochs() {
			done = done && e == next.Epoch()
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("epochs after the restart: %v, want %d", w.epochs(), next.Epoch())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if w.wide.Epoch() != next.Epoch() {
		t.Errorf("published epoch %d, want %d", w.wide.Epoch(), next.Epoch())
	}
}

// A participant in doubt whose coordinator has no record (it crashed
// before deciding) learns the abort by presumption.
func TestInDoubtParticipantPresumesAbort(t *testing.T) {
	t0 := initial(t, "a", "b")
	w := newWorld(t, t0, map[string]int{"a": 1, "b": 1}, 1000)
	coord, other := w.nodes["n-a-0"], w.nodes["n-b-0"]
	var owners [cluster.Buckets]string
	for b := range owners {
		owners[b] = "a"
	}
	next, _ := island.New(t0.Epoch()+1, owners, []string{"a", "b"})
	other.mgr.mu.Lock()
	p, _ := other.mgr.participant()
	eff, _ := p.Step(island.Msg{Kind: island.Prepare, From: string(coord.id), To: "b", Epoch: next.Epoch(), Base: t0.Epoch(), Table: next})
	if err := other.mgr.applyParticipant(eff); err != nil {
		t.Fatal(err)
	}
	other.mgr.mu.Unlock()
	other.mgr.askOutcome(context.Background())
	if other.mgr.part.Phase() != island.Idle {
		t.Fatalf("participant in doubt still %s after asking a coordinator with no record", other.mgr.part.Phase())
	}
	if e := w.epochs()[other.id]; e != t0.Epoch() {
		t.Errorf("participant installed epoch %d after a presumed abort", e)
	}
	rec, ok, err := other.mgr.readRecord(keyParticipant)
	if err != nil || !ok || rec.Phase != island.Idle {
		t.Errorf("participant record after the abort: %+v %v %v", rec, ok, err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	t0 := initial(t, "a", "b")
	t1, _ := island.New(t0.Epoch()+1, t0.Owners(), []string{"a", "b", "c"})
	for _, r := range []island.Record{
		{Phase: island.Idle, Current: t0},
		{Phase: island.Prepared, Coordinator: "node-1", Current: t0, Proposal: t1},
		{Phase: island.Committed, Proposal: t1},
	} {
		b := EncodeRecord(r)
		got, err := DecodeRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Phase != r.Phase || got.Coordinator != r.Coordinator || !got.Current.Equal(r.Current) && len(r.Current.Islands()) > 0 ||
			!got.Proposal.Equal(r.Proposal) && len(r.Proposal.Islands()) > 0 {
			t.Errorf("round trip of %+v gave %+v", r, got)
		}
		for i := range len(b) {
			if _, err := DecodeRecord(b[:i]); err == nil {
				t.Errorf("record cut to %d of %d bytes decoded", i, len(b))
			}
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	t0, _ := island.Initial([]string{"a", "b"})
	f.Add(EncodeRecord(island.Record{Phase: island.Prepared, Coordinator: "x", Current: t0, Proposal: t0}))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			return
		}
		if _, err := DecodeRecord(EncodeRecord(r)); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
	})
}
