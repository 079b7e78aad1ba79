package replica_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
	"google.golang.org/grpc"
)

// A cluster of replication managers over real RPC, each with a real mailbox
// manager as the handler of message objects.
type testCluster struct {
	t      testing.TB
	mu     sync.Mutex
	nodes  map[cluster.NodeID]*node
	alive  map[cluster.NodeID]bool
	client *rpc.Client
}

type node struct {
	id    cluster.NodeID
	dir   string
	db    *store.DB
	boxes *mailbox.Manager
	repl  *replica.Manager
	hooks *hooks
	srv   *rpc.Server
	addr  string
}

type peers struct{ c *testCluster }

func (p peers) Alive() []cluster.MemberInfo {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	var out []cluster.MemberInfo
	for id, ok := range p.c.alive {
		if ok {
			out = append(out, cluster.MemberInfo{Member: cluster.Member{ID: id}, State: "alive"})
		}
	}
	return out
}

// Expected counts every node the test cluster has had, stopped or not.
func (p peers) Expected() int {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return len(p.c.alive)
}

func (p peers) Conn(id cluster.NodeID) (grpc.ClientConnInterface, error) {
	p.c.mu.Lock()
	n, up := p.c.nodes[id], p.c.alive[id]
	p.c.mu.Unlock()
	if n == nil || !up {
		return nil, rpc.ErrUnavailable
	}
	return p.c.client.Conn(n.addr)
}

func newCluster(t testing.TB) *testCluster {
	c := &testCluster{t: t, nodes: map[cluster.NodeID]*node{}, alive: map[cluster.NodeID]bool{}, client: rpc.NewClient()}
	t.Cleanup(func() {
		for id := range c.nodes {
			c.stop(id)
		}
		c.client.Close()
	})
	return c
}

// hooks stand in for the replication manager's collaborators (the writers
// and the balancer): each test sets what they do.
type hooks struct {
	mu       sync.Mutex
	rehome   func(ctx context.Context, u string, ms []replica.Move) error
	choose   func(exclude []cluster.NodeID, n int) []cluster.NodeID
	conflict func(ctx context.Context, object string) error
	room     func() bool
}

func (h *hooks) setRepair(rehome func(ctx context.Context, u string, ms []replica.Move) error, choose func(exclude []cluster.NodeID, n int) []cluster.NodeID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rehome, h.choose = rehome, choose
}

func (h *hooks) setConflict(fn func(ctx context.Context, object string) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conflict = fn
}

func (h *hooks) setRoom(fn func() bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.room = fn
}

func (h *hooks) Rehome(ctx context.Context, u string, ms []replica.Move) error {
	h.mu.Lock()
	fn := h.rehome
	h.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn(ctx, u, ms)
}

func (h *hooks) ResolveConflict(ctx context.Context, object string) error {
	h.mu.Lock()
	fn := h.conflict
	h.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn(ctx, object)
}

// May: the tests of this package run without islands.
func (h *hooks) May(uint8, cluster.NodeID) bool { return true }

func (h *hooks) Replicas(_ uint8, exclude []cluster.NodeID, n int) []cluster.NodeID {
	h.mu.Lock()
	fn := h.choose
	h.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn(exclude, n)
}

func (h *hooks) hasRoom() bool {
	h.mu.Lock()
	fn := h.room
	h.mu.Unlock()
	return fn == nil || fn()
}

func (c *testCluster) start(id cluster.NodeID, dir string) *node {
	if dir == "" {
		dir = c.t.TempDir()
	}
	db, err := store.Open(dir)
	if err != nil {
		c.t.Fatal(err)
	}
	n := &node{id: id, dir: dir, db: db, boxes: mailbox.New(db)}
	n.boxes.Self = id
	n.hooks = &hooks{}
	if n.repl, err = replica.New(id, db, hlc.New(), slog.New(slog.DiscardHandler), replica.Options{Peers: peers{c}, Room: n.hooks.hasRoom}); err != nil {
		c.t.Fatal(err)
	}
	n.repl.Handle(mailbox.ObjectKind, n.boxes)
	n.srv = rpc.NewServer(func() rpc.Load { return rpc.Load{} })
	n.repl.Register(n.srv.Registrar())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	n.addr = l.Addr().String()
	go n.srv.Serve(l)
	n.repl.Start(n.hooks, n.hooks)
	c.mu.Lock()
	c.nodes[id], c.alive[id] = n, true
	c.mu.Unlock()
	return n
}

// stop ends a node as a crash would: nothing is flushed beyond what its
// writes already forced.
func (c *testCluster) stop(id cluster.NodeID) {
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	c.alive[id] = false
	c.mu.Unlock()
	if n == nil || n.repl == nil { // remote nodes are not ours to stop
		return
	}
	n.repl.Close()
	n.srv.Stop()
	n.db.Close()
}

func (c *testCluster) setAlive(id cluster.NodeID, up bool) {
	c.mu.Lock()
	c.alive[id] = up
	c.mu.Unlock()
}

const user = "r@example.org"

func message(id string, uid uint32, replicas ...cluster.NodeID) *mailbox.Object {
	return &mailbox.Object{User: user, ID: id, Mailbox: "INBOX", UIDValidity: 1700000000, UID: uid, ModSeq: uint64(uid),
		Size: 5, Date: time.Now().UTC(), Replicas: replicas, Want: len(replicas)}
}

func write(t *testing.T, n *node, policy replica.Policy, o *mailbox.Object, body []byte) (*replica.WriteReply, error) {
	t.Helper()
	u, err := o.Update(n.repl.Now(), o.Replicas, body)
	if err != nil {
		t.Fatal(err)
	}
	return n.repl.Write(context.Background(), &replica.WriteRequest{Updates: []*replica.Update{u}, Policy: policy})
}

// writeBatch writes messages m<from>..m<to> (UIDs from..to) through n in
// one write with the given replicas.
func writeBatch(tb testing.TB, n *node, policy replica.Policy, from, to int, replicas ...cluster.NodeID) {
	tb.Helper()
	req := &replica.WriteRequest{Policy: policy}
	for i := from; i <= to; i++ {
		o := message(fmt.Sprintf("m%d", i), uint32(i), replicas...)
		u, err := o.Update(n.repl.Now(), o.Replicas, []byte("body\n"))
		if err != nil {
			tb.Fatal(err)
		}
		req.Updates = append(req.Updates, u)
	}
	if _, err := n.repl.Write(context.Background(), req); err != nil {
		tb.Fatal(err)
	}
}

func has(n *node, id string) bool {
	b, err := n.boxes.Body(user, id)
	return err == nil && string(b) == "body\n"
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestWriteAllReachesEveryReplica(t *testing.T) {
	c := newCluster(t)
	a, b, d := c.start("a", ""), c.start("b", ""), c.start("d", "")
	rep, err := write(t, a, replica.All, message("m1", 1, "a", "b", "d"), []byte("body\n"))
	if err != nil || len(rep.Acked) != 3 {
		t.Fatalf("write: %+v %v", rep, err)
	}
	for _, n := range []*node{a, b, d} {
		if !has(n, "m1") {
			t.Fatalf("%s lacks the message after an ALL write", n.id)
		}
	}
	waitFor(t, "the entry to complete", func() bool { s := a.repl.Stats(); return s.Pending == 0 && s.Done == 1 })
}

// A replica that is down when the message arrives gets it from the
// coordinator's log when it is back (Porcupine §4.4), and the policy says
// when the writer is answered.
func TestCatchUpFromTheLog(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", ""), c.start("b", "")
	c.setAlive("b", false)
	if _, err := write(t, a, replica.All, message("m0", 1, "a", "b"), []byte("body\n")); !errors.Is(err, replica.ErrPolicy) {
		t.Fatalf("ALL with a replica down: %v", err)
	}
	rep, err := write(t, a, replica.One, message("m1", 2, "a", "b"), []byte("body\n"))
	if err != nil || !slices.Equal(rep.Acked, []cluster.NodeID{"a"}) {
		t.Fatalf("ONE with a replica down: %+v %v", rep, err)
	}
	if s := a.repl.Stats(); s.Waiting != 2 {
		t.Fatalf("log %+v, want 2 entries waiting for b", s)
	}
	// The coordinator restarts (its log is on disk), then b comes back.
	dir := a.dir
	c.stop("a")
	a = c.start("a", dir)
	c.setAlive("b", true)
	waitFor(t, "b to catch up", func() bool { return has(b, "m0") && has(b, "m1") })
	waitFor(t, "the log to drain", func() bool { return a.repl.Stats().Pending == 0 })
}

// When the coordinator dies after one replica got the update, that replica
// finishes it for the others (§4.4).
func TestRemainingReplicaTakesOver(t *testing.T) {
	c := newCluster(t)
	a, b, d := c.start("a", ""), c.start("b", ""), c.start("d", "")
	c.setAlive("d", false)
	if _, err := write(t, a, replica.Quorum, message("m1", 1, "a", "b", "d"), []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	if !has(b, "m1") || has(d, "m1") {
		t.Fatal("setup: b should have it, d not")
	}
	if s := b.repl.Stats(); s.Waiting != 1 {
		t.Fatalf("b's log %+v: b must log an update others still miss", s)
	}
	c.stop("a")
	c.setAlive("d", true)
	waitFor(t, "d to get the update from b", func() bool { return has(d, "m1") })
}

// Updates are total and ordered by stamp: an older one arriving late
// changes nothing, a newer one replaces the replica.
func TestNewestUpdateWins(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", ""), c.start("b", "")
	o := message("m1", 1, "a", "b")
	if _, err := write(t, a, replica.All, o, []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	old := a.repl.Now()
	o.Flags = []string{`\Seen`}
	if _, err := write(t, b, replica.All, o, nil); err != nil { // no body: both have it
		t.Fatal(err)
	}
	o.Flags = []string{`\Deleted`}
	u, _ := o.Update(old, o.Replicas, nil)
	if _, err := a.repl.Write(context.Background(), &replica.WriteRequest{Updates: []*replica.Update{u}, Policy: replica.All}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{a, b} {
		d, _ := n.boxes.Fragment(user, 1700000000)
		if len(d.Messages) != 1 || !d.Messages[0].HasFlag(`\Seen`) || d.Messages[0].HasFlag(`\Deleted`) {
			t.Fatalf("%s: %+v", n.id, d.Messages)
		}
	}
}

// A replica that lacks the message's bytes (it was not a replica before)
// is sent them.
func TestNewReplicaIsSentTheBytes(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", ""), c.start("b", "")
	o := message("m1", 1, "a")
	if _, err := write(t, a, replica.One, o, []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	o.Replicas = []cluster.NodeID{"a", "b"}
	if _, err := write(t, a, replica.All, o, nil); err != nil {
		t.Fatal(err)
	}
	if !has(b, "m1") {
		t.Fatal("new replica did not get the bytes")
	}
}

// Repair asks for new replicas of objects whose replica has been away for
// longer than ReplaceAfter, and only then.
func TestRepairReplacesAnAbsentReplica(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", ""), c.start("b", "")
	c.start("d", "")
	if _, err := write(t, a, replica.All, message("m1", 1, "a", "b"), []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var moves []replica.Move
	a.repl.ReplaceAfter = 300 * time.Millisecond
	a.hooks.setRepair(func(ctx context.Context, u string, ms []replica.Move) error {
		mu.Lock()
		moves = append(moves, ms...)
		mu.Unlock()
		return nil
	}, func(exclude []cluster.NodeID, n int) []cluster.NodeID {
		if slices.Contains(exclude, "d") {
			return nil
		}
		return []cluster.NodeID{"d"}
	})
	a.repl.RepairOnce(context.Background())
	if st := a.repl.RepairStats(); st.Objects != 1 || st.UnderReplicated != 0 {
		t.Fatalf("all replicas up: %+v", st)
	}
	c.stop("b")
	_ = b
	a.repl.RepairOnce(context.Background())
	if st := a.repl.RepairStats(); st.UnderReplicated != 1 || len(moves) != 0 {
		t.Fatalf("just gone: %+v, moves %v", st, moves)
	}
	time.Sleep(400 * time.Millisecond)
	a.repl.RepairOnce(context.Background())
	if len(moves) != 1 || !slices.Equal(moves[0].Replicas, []cluster.NodeID{"a", "d"}) || !slices.Equal(moves[0].Gone, []cluster.NodeID{"b"}) {
		t.Fatalf("moves %+v", moves)
	}
}

// Pushes are input from the network: whatever they hold, a node answers
// with outcomes or an error and never crashes, and never stores a message
// under a name that is not its own.
func FuzzPush(f *testing.F) {
	o := message("m1", 1, "a")
	good, _ := o.Update(replica.Stamp{Clock: 1 << 20, Node: "b"}, o.Replicas, []byte("body\n"))
	seed, _ := json.Marshal(&replica.PushRequest{Entries: []*replica.Entry{{Update: *good}}})
	f.Add(seed)
	f.Add([]byte(`{"entries":[{"object":"m/x/","data":"bnVsbA=="}]}`))
	f.Add([]byte(`{"entries":[{"object":"p/a@b","data":"e30="},{"object":"zz/1"}]}`))
	f.Add([]byte(`{"entries":[null]}`))
	db, err := store.Open(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	boxes := mailbox.New(db)
	boxes.Self = "a"
	m, err := replica.New("a", db, hlc.New(), slog.New(slog.DiscardHandler), replica.Options{})
	if err != nil {
		f.Fatal(err)
	}
	m.Handle(mailbox.ObjectKind, boxes)
	m.Handle(userdb.ProfileKind, userdb.New(db))
	f.Fuzz(func(t *testing.T, b []byte) {
		var req replica.PushRequest
		if json.Unmarshal(b, &req) != nil {
			return
		}
		rep, err := m.Push(context.Background(), &req)
		if err == nil && len(rep.Outcomes) != len(req.Entries) {
			t.Fatalf("%d outcomes for %d entries", len(rep.Outcomes), len(req.Entries))
		}
	})
}

// The coordinator of an R=3 update that every replica acknowledged tells
// the others it is complete, so they retire their log entries instead of
// taking the update over (and pushing it again) once takeoverAfter passes.
func TestDoneRetiresTheOthersEntries(t *testing.T) {
	c := newCluster(t)
	a, b, d := c.start("a", ""), c.start("b", ""), c.start("d", "")
	if _, err := write(t, a, replica.Quorum, message("m1", 1, "a", "b", "d"), []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	// The peer that got the push first logged the update for the other.
	logged := 0
	for _, n := range []*node{b, d} {
		s := n.repl.Stats()
		logged += s.Pending + s.Done
	}
	if logged == 0 {
		t.Fatal("no peer logged the update: nothing for Done to retire")
	}
	// Within 10 s, far less than the 30 s before a peer takes over: only
	// the coordinator's Done can have completed the peers' entries.
	waitFor(t, "the peers' entries to be done", func() bool {
		for _, n := range []*node{a, b, d} {
			if s := n.repl.Stats(); s.Pending != 0 || s.Waiting != 0 {
				return false
			}
		}
		return true
	})
}

// logChildEnv names the data directory of the child process of
// TestLogSurvivesKill9, and logChildPeer the address of the replica it
// cannot reach.
const (
	logChildEnv  = "QUILL_REPLICA_TEST_CHILD_DIR"
	logChildPeer = "QUILL_REPLICA_TEST_CHILD_PEER"
	logChildMsgs = 20
)

// A coordinator killed with SIGKILL right after acknowledging updates at
// write policy ONE still has them in its log when it starts again, and
// pushes them to the replica that missed them (Porcupine §4.4: the log is
// what makes a ONE acknowledgement safe). The coordinator runs in a child
// process, so the kill is a real one.
func TestLogSurvivesKill9(t *testing.T) {
	if dir := os.Getenv(logChildEnv); dir != "" {
		logChild(t, dir)
		return
	}
	c := newCluster(t)
	b := c.start("b", "")
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLogSurvivesKill9$", "-test.v")
	cmd.Env = append(os.Environ(), logChildEnv+"="+dir, logChildPeer+"="+b.addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	acked := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ACKED" {
				acked <- true
				return
			}
		}
		acked <- false
	}()
	select {
	case ok := <-acked:
		if !ok {
			t.Fatal("the child coordinator ended without acknowledging its writes")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child coordinator did not acknowledge its writes in 30 s")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	for i := 1; i <= logChildMsgs; i++ {
		if has(b, fmt.Sprintf("m%d", i)) {
			t.Fatalf("b has m%d before the coordinator came back: the test proves nothing", i)
		}
	}
	a := c.start("a", dir)
	waitFor(t, "b to get every acknowledged update from the restarted coordinator's log", func() bool {
		for i := 1; i <= logChildMsgs; i++ {
			if !has(b, fmt.Sprintf("m%d", i)) {
				return false
			}
		}
		return true
	})
	for i := 1; i <= logChildMsgs; i++ {
		if !has(a, fmt.Sprintf("m%d", i)) {
			t.Fatalf("the coordinator lost its own copy of m%d in the kill", i)
		}
	}
	waitFor(t, "the coordinator's log to drain", func() bool { return a.repl.Stats().Pending == 0 })
}

// logChild is the coordinator of TestLogSurvivesKill9: it writes at policy
// ONE with its peer b marked down, says ACKED, and waits to be killed.
func logChild(t *testing.T, dir string) {
	c := newCluster(t)
	c.remote("b", os.Getenv(logChildPeer))
	c.setAlive("b", false)
	a := c.start("a", dir)
	for i := 1; i <= logChildMsgs; i++ {
		rep, err := write(t, a, replica.One, message(fmt.Sprintf("m%d", i), uint32(i), "a", "b"), []byte("body\n"))
		if err != nil || !slices.Equal(rep.Acked, []cluster.NodeID{"a"}) {
			t.Fatalf("write m%d: %+v %v", i, rep, err)
		}
	}
	fmt.Println("ACKED")
	time.Sleep(time.Minute) // the parent kills this process
	t.Fatal("not killed")
}

// remote adds a node that runs elsewhere (another process) at addr.
func (c *testCluster) remote(id cluster.NodeID, addr string) {
	c.mu.Lock()
	c.nodes[id], c.alive[id] = &node{id: id, addr: addr}, true
	c.mu.Unlock()
}

// BenchmarkRepairScan measures one repair scan over a node holding
// repairBenchObjects message replicas, all fully replicated: the cost a
// node pays every scan when nothing needs repair.
func BenchmarkRepairScan(b *testing.B) {
	const repairBenchObjects = 100_000
	c := newCluster(b)
	a := c.start("a", "")
	c.start("d", "")
	a.hooks.setRepair(func(ctx context.Context, u string, ms []replica.Move) error { return nil },
		func(exclude []cluster.NodeID, n int) []cluster.NodeID { return nil })
	for i := 0; i < repairBenchObjects; i += 1000 {
		writeBatch(b, a, replica.One, i+1, i+1000, "a", "d")
	}
	b.ResetTimer()
	for b.Loop() {
		a.repl.RepairOnce(context.Background())
	}
	if st := a.repl.RepairStats(); st.Objects != repairBenchObjects {
		b.Fatalf("scan saw %d objects, want %d", st.Objects, repairBenchObjects)
	}
}

// A node cut off from the others that holds single copies says they are
// short of their replicas (it counts the nodes away), though it cannot
// mend them until the others are back.
func TestCutOffNodeCountsSingleCopiesShort(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", "")
	c.start("b", "")
	c.setAlive("b", false)
	o := message("m1", 1, "a")
	o.Want = 2 // placed while a saw no other node: one copy of two
	if _, err := write(t, a, replica.One, o, []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	var moves []replica.Move
	a.hooks.setRepair(func(ctx context.Context, u string, ms []replica.Move) error {
		moves = append(moves, ms...)
		return nil
	}, func(exclude []cluster.NodeID, n int) []cluster.NodeID {
		if c.peersAlive("b") && !slices.Contains(exclude, "b") {
			return []cluster.NodeID{"b"}
		}
		return nil
	})
	a.repl.RepairOnce(context.Background())
	if st := a.repl.RepairStats(); st.UnderReplicated != 1 || len(moves) != 0 {
		t.Fatalf("cut off: %+v, moves %v; want 1 short and nothing to move it to", st, moves)
	}
	c.setAlive("b", true)
	a.repl.RepairOnce(context.Background())
	if len(moves) != 1 || !slices.Equal(moves[0].Replicas, []cluster.NodeID{"a", "b"}) {
		t.Fatalf("b back: moves %+v, want m1 on a and b", moves)
	}
}

func (c *testCluster) peersAlive(id cluster.NodeID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alive[id]
}

// A replica that holds another message under the UID an update names
// refuses it as a conflict, and the pusher asks the object's writer to
// resolve it: once, not at every retry of the push.
func TestConflictAsksTheWriter(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", ""), c.start("b", "")
	if _, err := write(t, b, replica.One, message("other", 1, "b"), []byte("body\n")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []string
	a.hooks.setConflict(func(ctx context.Context, object string) error {
		mu.Lock()
		asked = append(asked, object)
		mu.Unlock()
		return nil
	})
	rep, err := write(t, a, replica.One, message("m1", 1, "a", "b"), []byte("body\n"))
	if err != nil || !slices.Equal(rep.Acked, []cluster.NodeID{"a"}) {
		t.Fatalf("write: %+v %v (want acknowledged by a alone: b holds another message at UID 1)", rep, err)
	}
	time.Sleep(3 * time.Second) // the log worker pushes again every second
	mu.Lock()
	defer mu.Unlock()
	if want := mailbox.ObjectName(user, "m1"); !slices.Equal(asked, []string{want}) {
		t.Fatalf("writer asked about %v, want %s once", asked, want)
	}
	if s := a.repl.Stats(); s.Pending != 1 {
		t.Fatalf("log %+v: the refused update must wait for the writer", s)
	}
}

// A node whose disk is nearly full refuses pushes that carry content and
// takes those that do not; the coordinator keeps the refused update and
// delivers it once the node has room again.
func TestNoRoomRefusesContentUntilThereIsRoom(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", ""), c.start("b", "")
	var full sync.Mutex
	room := false
	b.hooks.setRoom(func() bool { full.Lock(); defer full.Unlock(); return room })
	// ALL waits for b's answer, so the refusal is in before the checks.
	rep, err := write(t, a, replica.All, message("m1", 1, "a", "b"), []byte("body\n"))
	if !errors.Is(err, replica.ErrPolicy) || !slices.Equal(rep.Acked, []cluster.NodeID{"a"}) {
		t.Fatalf("write: %+v %v, want a alone (b has no room)", rep, err)
	}
	if has(b, "m1") {
		t.Fatal("b took content with no room")
	}
	if _, err := write(t, b, replica.One, message("m2", 2, "b"), []byte("body\n")); !errors.Is(err, replica.ErrNoRoom) {
		t.Fatalf("a write with content on b itself: %v, want ErrNoRoom", err)
	}
	full.Lock()
	room = true
	full.Unlock()
	waitFor(t, "b to get m1 once it has room", func() bool { return has(b, "m1") })
}

// Repair hands a user's writer its moves in small chunks, so the writer's
// lock (which the user's deliveries wait on) is never held for a whole
// round of copying.
func TestRepairRehomesInChunks(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", "")
	c.start("b", "")
	c.start("d", "")
	writeBatch(t, a, replica.All, 1, 120, "a", "b")
	var calls []int
	a.repl.ReplaceAfter = 0
	a.hooks.setRepair(func(ctx context.Context, u string, ms []replica.Move) error {
		calls = append(calls, len(ms))
		return nil
	}, func(exclude []cluster.NodeID, n int) []cluster.NodeID { return []cluster.NodeID{"d"} })
	c.stop("b")
	a.repl.RepairOnce(context.Background())
	total := 0
	for _, n := range calls {
		if n > 50 {
			t.Fatalf("a call with %d moves (calls %v)", n, calls)
		}
		total += n
	}
	if total != 120 || a.repl.RepairStats().Rehomed != 120 {
		t.Fatalf("calls %v, stats %+v: want all 120 re-homed", calls, a.repl.RepairStats())
	}
}
