package usermgr

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
	"github.com/xdg-go/scram"
	"google.golang.org/grpc"
)

// testCluster is N user managers on real stores, talking over real RPC on
// loopback, with a membership the test sets by hand.
type testCluster struct {
	t     *testing.T
	mu    sync.Mutex
	alive []cluster.MemberInfo
	um    cluster.UserMap
	// views are what each node was last told (setAliveTell can leave a
	// node out, as a paused process hears nothing).
	views  map[cluster.NodeID]nodeView
	epoch  uint64
	nodes  map[cluster.NodeID]*testNode
	client *rpc.Client
}

type testNode struct {
	id    cluster.NodeID
	dir   string
	db    *store.DB
	boxes *mailbox.Manager
	repl  *replica.Manager
	mgr   *Manager
	srv   *rpc.Server
	addr  string
	boot  uint64
}

type nodeView struct {
	um    cluster.UserMap
	alive []cluster.MemberInfo
}

type peers struct {
	c    *testCluster
	self cluster.NodeID
}

func (p peers) UserMap() cluster.UserMap {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	if v, ok := p.c.views[p.self]; ok {
		return v.um
	}
	return p.c.um
}
func (p peers) Alive() []cluster.MemberInfo {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	if v, ok := p.c.views[p.self]; ok {
		return append([]cluster.MemberInfo(nil), v.alive...)
	}
	return append([]cluster.MemberInfo(nil), p.c.alive...)
}

// Eligible is the membership's rule over this view (no island table: the
// tests of this package run without islands).
func (p peers) Eligible(b uint8) ([]cluster.MemberInfo, error) {
	return cluster.Eligible(b, p.Alive(), island.Table{}, false)
}
func (p peers) Expected() int {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return len(p.c.nodes)
}
func (p peers) Degraded() bool {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return len(p.c.alive) != len(p.c.nodes)
}
func (p peers) Domains() map[string]bool {
	out := map[string]bool{}
	for _, n := range p.c.nodes {
		for _, d := range n.mgr.LocalDomains() {
			out[d] = true
		}
	}
	return out
}
func (p peers) Conn(node cluster.NodeID) (grpc.ClientConnInterface, error) {
	p.c.mu.Lock()
	n := p.c.nodes[node]
	p.c.mu.Unlock()
	if n == nil {
		return nil, rpc.ErrUnavailable
	}
	return p.c.client.Conn(n.addr)
}

func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t, nodes: map[cluster.NodeID]*testNode{}, client: rpc.NewClient(), views: map[cluster.NodeID]nodeView{}}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.repl.Close()
			n.mgr.Close()
			n.srv.Stop()
			n.db.Close()
		}
		c.client.Close()
	})
	return c
}

func (c *testCluster) start(id cluster.NodeID, dir string, boot uint64) *testNode {
	if dir == "" {
		dir = c.t.TempDir()
	}
	db, err := store.Open(dir)
	if err != nil {
		c.t.Fatal(err)
	}
	n := &testNode{id: id, dir: dir, db: db, boxes: mailbox.New(db), boot: boot}
	n.boxes.Self = id
	clock, log := hlc.New(), slog.New(slog.DiscardHandler)
	if n.repl, err = replica.New(id, db, clock, log, replica.Options{Peers: peers{c, id}}); err != nil {
		c.t.Fatal(err)
	}
	n.repl.Handle(mailbox.ObjectKind, n.boxes)
	profiles := userdb.New(db)
	n.repl.Handle(userdb.ProfileKind, profiles)
	n.mgr = New(Config{Self: id, Users: profiles, Boxes: n.boxes, Clock: clock, Log: log, Repl: n.repl, Peers: peers{c, id}})
	n.srv = rpc.NewServer(func() rpc.Load { return rpc.Load{} })
	n.mgr.Register(n.srv.Registrar())
	n.boxes.Register(n.srv.Registrar())
	n.repl.Register(n.srv.Registrar())
	// The writers resolve conflicts; repair (which needs a balancer) is
	// left out.
	n.repl.Start(n.mgr.Writers(), nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	n.addr = l.Addr().String()
	go n.srv.Serve(l)
	c.mu.Lock()
	c.nodes[id] = n
	c.mu.Unlock()
	return n
}

// setAlive installs a membership and tells every live manager.
func (c *testCluster) setAlive(ids ...cluster.NodeID) { c.setAliveTell(ids, ids) }

// setAliveTell installs a membership and tells only the managers in tell;
// the others keep their old view (a paused process hears nothing, and a
// resumed one may never see its own membership change).
func (c *testCluster) setAliveTell(ids, tell []cluster.NodeID) {
	c.mu.Lock()
	c.alive = nil
	var members []cluster.Member
	for _, id := range ids {
		n := c.nodes[id]
		mi := cluster.MemberInfo{Member: cluster.Member{ID: id, Boot: n.boot}, State: "alive"}
		c.alive = append(c.alive, mi)
		members = append(members, mi.Member)
	}
	prev := c.um
	c.epoch++
	c.um = cluster.Compute(members, c.epoch, &prev)
	um, alive := c.um, append([]cluster.MemberInfo(nil), c.alive...)
	for _, id := range tell {
		c.views[id] = nodeView{um: um, alive: alive}
	}
	c.mu.Unlock()
	for _, id := range tell {
		c.nodes[id].mgr.Reconcile(um, alive)
	}
}

func (c *testCluster) kill(id cluster.NodeID) {
	n := c.nodes[id]
	n.repl.Close()
	n.mgr.Close()
	n.srv.Stop()
	n.db.Close()
	c.mu.Lock()
	delete(c.nodes, id)
	c.mu.Unlock()
}

// storeFragment puts a message for user on node n's disk, outside the
// writer: hard state the managers must find by scanning.
func storeFragment(t *testing.T, n *testNode, user string) {
	t.Helper()
	p := mailbox.Placed{User: user, Mailbox: mailbox.Inbox, UIDValidity: 1, UID: 1, ModSeq: 1}
	if err := n.boxes.StoreAt([]mailbox.Placed{p}, n.boxes.NewMessageID(), []byte("x\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
}

// note tells the user's manager that node n stores mail of the user, as a
// writer confirmation does.
func note(t *testing.T, m *Manager, user string, n cluster.NodeID) error {
	_, err := onManager(ctx(t), m, user, func(ctx context.Context, s Service) (struct{}, error) {
		return struct{}{}, s.Note(ctx, &NoteRequest{User: user, Node: n})
	})
	return err
}

func ctx(t *testing.T) context.Context {
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return cx
}

func TestSingleNodeRebuildFromHardState(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("n1", "", 1)
	c.setAlive("n1")
	if _, err := n.mgr.AddUser(ctx(t), "Alice@Example.org", "pw1"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.mgr.AddUser(ctx(t), "bob@example.net", "pw2"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.mgr.AddUser(ctx(t), "alice@example.org", "x"); !errors.Is(err, userdb.ErrExists) {
		t.Fatalf("duplicate add: %v", err)
	}
	storeFragment(t, n, "alice@example.org")
	dir := n.dir
	c.kill("n1")

	// A new process: soft state comes back only from the scan.
	n = c.start("n1", dir, 2)
	c.setAlive("n1")
	users := n.mgr.Users(ctx(t))
	if len(users.Profiles) != 2 || len(users.Unreachable) != 0 {
		t.Fatalf("users after rebuild: %+v", users)
	}
	if !n.mgr.ServesDomain("EXAMPLE.org") || !n.mgr.ServesDomain("example.net") || n.mgr.ServesDomain("other.org") {
		t.Fatal("domains wrong after rebuild")
	}
	if _, mm, _ := n.mgr.Lookup(ctx(t), "alice@example.org"); len(mm) != 1 || mm[0] != "n1" {
		t.Fatalf("mail map %v", mm)
	}
	if _, mm, _ := n.mgr.Lookup(ctx(t), "bob@example.net"); len(mm) != 0 {
		t.Fatalf("bob has no mail but mail map %v", mm)
	}
	for i := 0; i < 2; i++ { // second time from the login cache
		if _, err := n.mgr.Authenticate(ctx(t), "alice@example.org", "pw1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.mgr.Authenticate(ctx(t), "alice@example.org", "bad"); !errors.Is(err, userdb.ErrPasswordMismatch) {
		t.Fatalf("wrong password: %v", err)
	}
	if _, err := n.mgr.Authenticate(ctx(t), "nobody@example.org", "pw1"); !errors.Is(err, userdb.ErrNotFound) {
		t.Fatalf("unknown user: %v", err)
	}
	if err := n.mgr.SetPassword(ctx(t), "alice@example.org", "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.mgr.Authenticate(ctx(t), "alice@example.org", "pw1"); err == nil {
		t.Fatal("old password still accepted after change (stale cache)")
	}
	if err := n.mgr.DeleteUser(ctx(t), "bob@example.net"); err != nil {
		t.Fatal(err)
	}
	if n.mgr.ServesDomain("example.net") {
		t.Fatal("domain still served after its last user left")
	}
	if _, _, err := n.mgr.Lookup(ctx(t), "bob@example.net"); !errors.Is(err, userdb.ErrNotFound) {
		t.Fatalf("deleted user: %v", err)
	}
}

// Three nodes: users added through one node log in through every other;
// after any one node dies, every user still logs in (profiles live on two
// nodes) and mail maps are rebuilt without the dead node.
func TestClusterSurvivesOneCrash(t *testing.T) {
	c := newTestCluster(t)
	for _, id := range []cluster.NodeID{"a", "b", "c"} {
		c.start(id, "", 1)
	}
	c.setAlive("a", "b", "c")
	var users []string
	for i := 0; i < 40; i++ {
		u := fmt.Sprintf("user%d@example.org", i)
		users = append(users, u)
		if _, err := c.nodes["a"].mgr.AddUser(ctx(t), u, "pw"+u); err != nil {
			t.Fatal(err)
		}
		// Mail for the user stored on b.
		storeFragment(t, c.nodes["b"], u)
		if err := note(t, c.nodes["b"].mgr, u, "b"); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []cluster.NodeID{"b", "c"} {
		for _, u := range users {
			if _, err := c.nodes[id].mgr.Authenticate(ctx(t), u, "pw"+u); err != nil {
				t.Fatalf("login of %s through %s: %v", u, id, err)
			}
		}
	}
	for _, victim := range []cluster.NodeID{"a", "c"} {
		c.kill(victim)
		var rest []cluster.NodeID
		for _, id := range []cluster.NodeID{"a", "b", "c"} {
			if c.nodes[id] != nil {
				rest = append(rest, id)
			}
		}
		c.setAlive(rest...)
		for _, id := range rest {
			for _, u := range users {
				if _, err := c.nodes[id].mgr.Authenticate(ctx(t), u, "pw"+u); err != nil {
					t.Fatalf("after %s died, login of %s through %s: %v", victim, u, id, err)
				}
				if _, mm, _ := c.nodes[id].mgr.Lookup(ctx(t), u); len(mm) != 1 || mm[0] != "b" {
					t.Fatalf("after %s died, mail map of %s: %v", victim, u, mm)
				}
			}
		}
		if victim == "a" {
			// a comes back with a new boot: it takes its buckets back and
			// rebuilds their soft state from b and c.
			c.start("a", "", 2)
			c.setAlive("a", "b", "c")
			for _, u := range users {
				if _, err := c.nodes["a"].mgr.Authenticate(ctx(t), u, "pw"+u); err != nil {
					t.Fatalf("after a returned empty, login of %s: %v", u, err)
				}
			}
		}
	}
}

// A fragment whose mail-map note never reached the manager is found by the
// periodic refresh.
func TestRefreshFindsUnnotedFragments(t *testing.T) {
	c := newTestCluster(t)
	c.start("a", "", 1)
	c.start("b", "", 1)
	c.setAlive("a", "b")
	u := "late@example.org"
	if _, err := c.nodes["a"].mgr.AddUser(ctx(t), u, "pw"); err != nil {
		t.Fatal(err)
	}
	// Stored on b with no note to the manager.
	storeFragment(t, c.nodes["b"], u)
	if _, mm, _ := c.nodes["a"].mgr.Lookup(ctx(t), u); len(mm) != 0 {
		t.Fatalf("mail map before refresh: %v", mm)
	}
	mgr := c.nodes[c.um.Manager(u)].mgr
	mgr.Refresh(c.alive)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, mm, _ := c.nodes["a"].mgr.Lookup(ctx(t), u); len(mm) == 1 && mm[0] == "b" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("refresh did not find the fragment on b")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A lookup waiting for a bucket's rebuild is not left waiting when the
// bucket moves to another node meanwhile: it is told at once that this
// node no longer manages the user (and the caller asks the new manager).
// Before, it waited for its whole deadline on a bucket nobody would finish:
// deliveries stalled for up to the 2 minutes of SMTP's DeliverTimeout.
func TestLookupWaitingForADroppedBucketReturns(t *testing.T) {
	c := newTestCluster(t)
	a := c.start("a", "", 1)
	c.start("b", "", 1)
	all := []cluster.Member{{ID: "a", Boot: 1}, {ID: "b", Boot: 1}, {ID: "ghost", Boot: 1}}
	var alive []cluster.MemberInfo
	for _, m := range all {
		alive = append(alive, cluster.MemberInfo{Member: m, State: "alive"})
	}
	um1 := cluster.Compute(all, 1, nil)
	// ghost never answers its scan, so a's buckets wait (reconstructWait).
	a.mgr.Reconcile(um1, alive)
	var u string
	for i := 0; u == ""; i++ {
		if cand := fmt.Sprintf("u%d@example.org", i); um1.Manager(cand) == "a" {
			u = cand
		}
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := a.mgr.lookup(cx, &LookupRequest{User: u})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	only := []cluster.Member{{ID: "b", Boot: 1}}
	a.mgr.Reconcile(cluster.Compute(only, 2, &um1), []cluster.MemberInfo{{Member: only[0], State: "alive"}})
	select {
	case err := <-done:
		if !errors.Is(err, rpc.ErrNotManager) {
			t.Fatalf("lookup after the bucket moved: %v, want not the manager", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("lookup returned after %v", took)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("lookup still waiting on a bucket this node dropped")
	}
}

// scramMatches says whether a profile's SCRAM keys are those of pw.
func scramMatches(t *testing.T, p *userdb.Profile, pw string) bool {
	t.Helper()
	sc, err := userdb.ParseSCRAM(p.SCRAMSHA256)
	if err != nil {
		t.Fatalf("user %s: SCRAM keys %q: %v", p.Address, p.SCRAMSHA256, err)
	}
	cl, _ := scram.SHA256.NewClient("", pw, "")
	want, _ := cl.GetStoredCredentialsWithError(sc.KeyFactors)
	return bytes.Equal(want.StoredKey, sc.StoredKey) && bytes.Equal(want.ServerKey, sc.ServerKey)
}

// TestSCRAMKeysFollowThePassword: the SCRAM keys are derived when a user
// is added and when the password changes, and a user who has none (their
// password was set before Quill had SCRAM) gets them at the next password
// login, unless the password changed meanwhile.
func TestSCRAMKeysFollowThePassword(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("n1", "", 1)
	c.setAlive("n1")
	const u = "carol@example.org"
	p, err := n.mgr.AddUser(ctx(t), u, "first")
	if err != nil {
		t.Fatal(err)
	}
	if !scramMatches(t, p, "first") {
		t.Fatal("keys at add are not the password's")
	}
	if err := n.mgr.SetPassword(ctx(t), u, "second"); err != nil {
		t.Fatal(err)
	}
	if p, _, _ = n.mgr.Lookup(ctx(t), u); !scramMatches(t, p, "second") {
		t.Fatal("keys not replaced by a password change")
	}

	// A password set without keys, as by a Quill before SCRAM.
	hash, _ := userdb.HashPassword("third")
	if _, err := n.mgr.writers.For(u).Apply(ctx(t), &writer.ApplyRequest{Op: "passwd", Address: u, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ = n.mgr.Lookup(ctx(t), u); p.SCRAMSHA256 != "" {
		t.Fatal("setup: keys still there")
	}
	// Keys offered for an older hash are not stored.
	stale, _ := userdb.DeriveSCRAM("second")
	if _, err := n.mgr.writers.For(u).Apply(ctx(t), &writer.ApplyRequest{Op: "scram", Address: u, Hash: "old", SCRAM: stale}); err != nil {
		t.Fatal(err)
	}
	if p, _, _ = n.mgr.Lookup(ctx(t), u); p.SCRAMSHA256 != "" {
		t.Fatal("keys of an older password were stored")
	}
	if _, err := n.mgr.Authenticate(ctx(t), u, "third"); err != nil {
		t.Fatal(err)
	}
	if p, _, _ = n.mgr.Lookup(ctx(t), u); !scramMatches(t, p, "third") {
		t.Fatal("no keys after a password login")
	}
	for _, p := range n.mgr.Users(ctx(t)).Profiles {
		if p.SCRAMSHA256 != "" || p.PasswordHash != "" {
			t.Errorf("user list shows secrets of %s", p.Address)
		}
	}
}
