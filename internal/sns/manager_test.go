package sns

import (
	"testing"
	"time"

	"google.golang.org/grpc"
)

// sim is a cluster of managers whose messages reach every node not cut
// off, in one step of simulated time.
type sim struct {
	t     *testing.T
	nodes []*Manager
	down  map[string]bool
	now   time.Time
	acts  map[string][]Action
	loads map[string][]Report
}

func newSim(t *testing.T, ids ...string) *sim {
	s := &sim{t: t, down: map[string]bool{}, now: time.Unix(1e9, 0), acts: map[string][]Action{}, loads: map[string][]Report{}}
	for i, id := range ids {
		m := NewManager(id, false, 4, s.now)
		seed := float64(i) / float64(len(ids))
		m.rand = func() float64 { return seed }
		m.patience = m.backoff()
		s.nodes = append(s.nodes, m)
	}
	return s
}

// run advances d in 100 ms steps.
func (s *sim) run(d time.Duration) {
	for end := s.now.Add(d); s.now.Before(end); s.now = s.now.Add(100 * time.Millisecond) {
		var said []Message
		for _, m := range s.nodes {
			if s.down[m.Self] {
				continue
			}
			out, acts := m.Tick(s.now, s.loads[m.Self])
			said = append(said, out...)
			s.acts[m.Self] = append(s.acts[m.Self], acts...)
		}
		for _, msg := range said {
			for _, m := range s.nodes {
				if s.down[m.Self] || m.Self == msg.From || s.down[msg.From] {
					continue
				}
				s.acts[m.Self] = append(s.acts[m.Self], m.Hear(msg, s.now)...)
			}
		}
	}
}

// managers returns the nodes up that think they are manager, and whom
// the others follow.
func (s *sim) managers() (self []string, followed map[string]int) {
	followed = map[string]int{}
	for _, m := range s.nodes {
		if s.down[m.Self] {
			continue
		}
		st := m.Status(s.now)
		if st.Self {
			self = append(self, m.Self)
		}
		followed[st.Manager]++
	}
	return self, followed
}

func TestOneManagerIsElectedAndReplaced(t *testing.T) {
	s := newSim(t, "a", "b", "c")
	s.run(6 * time.Second)
	self, followed := s.managers()
	if len(self) != 1 || followed[self[0]] != 3 {
		t.Fatalf("after start: managers %v, followed %v; want one followed by all", self, followed)
	}
	first := self[0]
	t.Logf("elected %s", first)

	// The manager dies: the others stand after the beacons stop, one wins.
	s.down[first] = true
	s.run(6 * time.Second)
	self, followed = s.managers()
	if len(self) != 1 || self[0] == first || followed[self[0]] != 2 {
		t.Fatalf("after %s died: managers %v, followed %v", first, self, followed)
	}
	t.Logf("then %s", self[0])

	// It comes back: it follows the new manager, never a second one.
	s.down[first] = false
	s.run(4 * time.Second)
	self, followed = s.managers()
	if len(self) != 1 || followed[self[0]] != 3 {
		t.Fatalf("after %s came back: managers %v, followed %v", first, self, followed)
	}
}

// A partition makes a manager on each side; when it heals, one remains.
func TestTwoManagersResolveToOne(t *testing.T) {
	s := newSim(t, "a", "b", "c")
	s.run(6 * time.Second)
	// Partition: deliver nothing between {a} and {b, c} by running
	// the two sides as separate simulations over the same managers.
	left := &sim{t: t, nodes: s.nodes[:1], down: map[string]bool{}, now: s.now, acts: s.acts, loads: s.loads}
	right := &sim{t: t, nodes: s.nodes[1:], down: map[string]bool{}, now: s.now, acts: s.acts, loads: s.loads}
	left.run(8 * time.Second)
	right.run(8 * time.Second)
	s.now = right.now
	l, _ := left.managers()
	r, _ := right.managers()
	if len(l) != 1 || len(r) != 1 {
		t.Fatalf("partitioned: managers %v and %v; want one on each side", l, r)
	}
	s.run(3 * time.Second)
	self, followed := s.managers()
	if len(self) != 1 || followed[self[0]] != 3 {
		t.Fatalf("healed: managers %v, followed %v; want one", self, followed)
	}
}

// The manager orders a launch on a dedicated node while one has room,
// then on the overflow node; when the load falls it reaps the overflow
// worker first; orders reach their node once.
func TestManagerLaunchesOverflowLastAndReapsItFirst(t *testing.T) {
	s := newSim(t, "a", "b", "c")
	s.nodes[2].Overflow = true
	busy := func(w, x int) []Report { return []Report{{Class: "relay", Workers: w, Max: x, Pending: 10 * w}} }
	s.loads["a"], s.loads["b"], s.loads["c"] = busy(2, 2), busy(1, 2), busy(0, 2)
	s.run(4 * time.Second)
	if got := s.acts["b"]; len(got) != 1 || got[0].Reap || len(s.acts["c"]) != 0 || len(s.acts["a"]) != 0 {
		t.Fatalf("dedicated b has room: orders a %v, b %v, c %v; want one launch on b", s.acts["a"], s.acts["b"], s.acts["c"])
	}
	s.loads["b"] = busy(2, 2)
	s.run(7 * time.Second)
	if got := s.acts["c"]; len(got) != 1 || got[0].Reap {
		t.Fatalf("dedicated nodes full: orders to overflow c %v; want one launch", got)
	}
	// Light load: the overflow worker goes back first.
	s.acts = map[string][]Action{}
	idle := func(w int) []Report { return []Report{{Class: "relay", Workers: w, Max: 2}} }
	s.loads["a"], s.loads["b"], s.loads["c"] = idle(2), idle(2), idle(1)
	s.run(4 * time.Second) // under two hold-offs: one decision
	if got := s.acts["c"]; len(got) != 1 || !got[0].Reap || len(s.acts["a"])+len(s.acts["b"]) != 0 {
		t.Fatalf("light load: orders a %v, b %v, c %v; want one reap on c", s.acts["a"], s.acts["b"], s.acts["c"])
	}
}

func TestPlan(t *testing.T) {
	row := func(n string, w, x, p int, over bool) NodeLoad {
		return NodeLoad{Node: n, Class: "relay", Workers: w, Max: x, Pending: p, Overflow: over}
	}
	cases := []struct {
		rows []NodeLoad
		node string
		reap bool
	}{
		{nil, "", false},
		{[]NodeLoad{row("a", 0, 2, 0, false)}, "", false},                               // first worker: on demand
		{[]NodeLoad{row("a", 1, 2, 3, false)}, "", false},                               // under the threshold
		{[]NodeLoad{row("a", 1, 2, 4, false), row("b", 1, 2, 8, false)}, "a", false},    // the lighter
		{[]NodeLoad{row("a", 2, 2, 9, false), row("o", 0, 2, 0, true)}, "o", false},     // overflow when full
		{[]NodeLoad{row("a", 1, 2, 9, false), row("o", 0, 2, 0, true)}, "a", false},     // dedicated first
		{[]NodeLoad{row("a", 2, 2, 0, false), row("o", 1, 2, 0, true)}, "o", true},      // reap overflow
		{[]NodeLoad{row("a", 2, 2, 0, false), row("b", 1, 2, 0, false)}, "", false},     // dedicated: local reap
		{[]NodeLoad{row("a", 2, 2, 100, false), row("b", 2, 2, 100, false)}, "", false}, // all full
	}
	for i, c := range cases {
		node, reap := Plan(c.rows, "relay", 4)
		if node != c.node || reap != c.reap {
			t.Errorf("case %d: Plan = %q, %v; want %q, %v", i, node, reap, c.node, c.reap)
		}
	}
}

// Dispatch across nodes: the lottery counts the tasks sent to another
// node since its last report (the correction of §3.3.2), a new report
// resets the count, and an overflow node without workers of its own sends
// every task away.
func TestPickNodeCorrectsForTasksSent(t *testing.T) {
	now := time.Unix(1e9, 0)
	m := NewManager("a", false, 4, now)
	m.Hear(Message{From: "b", Report: &Report{Class: RelayClass, Workers: 1, Max: 2}}, now)
	pool := NewPool(Config{Class: RelayClass})
	defer pool.Close()
	conn := func(string) (grpc.ClientConnInterface, error) { return nil, nil }
	r := NewClusterRelay(pool, m, conn)
	// Tickets 1 (this node, on demand) and 1 (b): a draw of 0.6 is b's.
	if got := r.pickNode(now, 0.6); got != "b" {
		t.Fatalf("first task went to %q, want b", got)
	}
	// b now counts one task: tickets 1 and 1/2, the same draw is ours.
	if got := r.pickNode(now, 0.6); got != "" {
		t.Fatalf("second task went to %q, want this node (b holds one already)", got)
	}
	// b's next report says it is idle again: the correction is reset.
	later := now.Add(time.Second)
	m.Hear(Message{From: "b", Report: &Report{Class: RelayClass, Workers: 1, Max: 2}}, later)
	if got := r.pickNode(later, 0.6); got != "b" {
		t.Fatalf("after b's new report the task went to %q, want b", got)
	}
	// An overflow node with no worker of its own sends everything away.
	o := NewManager("o", true, 4, now)
	o.Hear(Message{From: "b", Report: &Report{Class: RelayClass, Workers: 1, Max: 2, Pending: 50}}, now)
	ro := NewClusterRelay(pool, o, conn)
	for _, draw := range []float64{0, 0.5, 0.99} {
		if got := ro.pickNode(now, draw); got != "b" {
			t.Fatalf("overflow node, draw %v: task went to %q, want b", draw, got)
		}
	}
}
