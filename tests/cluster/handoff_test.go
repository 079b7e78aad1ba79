package cluster_test

// Issue 9: acknowledged messages hidden after bucket handoffs, and a panic
// on SIGTERM. These tests run with the writers' audit off
// (--audit-interval 0) where they test a root cause: the audit would heal
// what they check for within a minute and hide the bug.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// Term stops the node with SIGTERM, waits for it to exit (at most 30 s,
// then SIGKILL) and reports an error if it did not exit with status 0 or
// its log shows a panic.
func (n *Node) Term() error {
	if n.stopped {
		return nil
	}
	if !n.terminate(30 * time.Second) {
		return fmt.Errorf("node %s did not exit within 30 s of SIGTERM; log:\n%s", n.ID, tail(n.Stderr(), 30))
	}
	log := n.Stderr()
	if code := n.cmd.ProcessState.ExitCode(); code != 0 || strings.Contains(log, "panic:") || strings.Contains(log, "fatal error:") {
		return fmt.Errorf("node %s after SIGTERM: exit status %d; log:\n%s", n.ID, code, tail(log, 40))
	}
	return nil
}

// startClusterWith starts n nodes with extra arguments to quill serve.
func startClusterWith(t *testing.T, n int, extra ...string) []*Node {
	sayFailuresLast(t)
	var nodes []*Node
	for i := 0; i < n; i++ {
		nd := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t), extra: extra}
		if i > 0 {
			nd.join = []string{nodes[0].Gossip}
		}
		nd.start()
		t.Cleanup(nd.Stop)
		nodes = append(nodes, nd)
	}
	waitFor(t, "all nodes to agree on the user map", 30*time.Second, func() bool { return agree(nodes, nodes) })
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	return nodes
}

// usersManagedBy returns n addresses whose bucket mgr manages, as via sees
// the user map.
func usersManagedBy(t *testing.T, via, mgr *Node, prefix string, n int) []string {
	st, err := via.Status()
	if err != nil {
		fatalf(t, "%v", err)
	}
	var out []string
	for i := 0; len(out) < n && i < 10000; i++ {
		u := fmt.Sprintf("%s%d@cluster.example", prefix, i)
		if string(st.Buckets[cluster.Bucket(u)].Node) == mgr.ID {
			out = append(out, u)
		}
	}
	return out
}

// A manager paused (SIGSTOP) past failure detection while mail for its
// users keeps coming through the other nodes: when it resumes they hand
// its buckets back, and every acknowledged message must be visible through
// every node at once, not after the next membership change. Its own view of
// the membership never changed, so before the fix it kept the soft state it
// had before the pause: 3,405 to 5,092 acknowledged messages of this test
// were hidden through every node (issue 9).
func TestPausedManagerHidesNothing(t *testing.T) {
	nodes := startClusterWith(t, 3, "--audit-interval", "0")
	v := nodes[1]
	users := usersManagedBy(t, nodes[0], v, "paused", 3)
	for _, u := range users {
		nodes[0].addUser(t, u, "pw")
	}
	s := newStream(t, nodes, users, "pw")
	s.setDown(v, true) // mail goes through the others, which stand in for v
	s.start(8, 1, false)
	time.Sleep(2 * time.Second)
	for _, u := range users { // v's views are loaded
		if _, _, _, err := v.imapView(u, "pw"); err != nil {
			fatalf(t, "%v", err)
		}
	}
	v.Pause()
	paused := time.Now()
	time.Sleep(15 * time.Second) // detection (~5 s), then 10 s of stand-in writers
	s.finish()
	v.Resume()
	t.Logf("%s paused %v; %d messages acknowledged", v.ID, time.Since(paused).Round(100*time.Millisecond), s.total())
	s.setDown(v, false)
	waitFor(t, "every node back with rebuilt soft state", 60*time.Second, func() bool { return ready(nodes) })
	time.Sleep(2 * time.Second)
	s.summary(t)
	r := s.check(t, nodes, "checker")
	t.Logf("checker: lost %d, missing through some nodes %d, duplicates %d", r.lost, r.partial, r.dups)
}

// Bursts of clean restarts of different nodes back to back (SIGTERM, start
// again at once), with a SIGSTOP among them, while clients deliver through
// every other node, the ones giving buckets away and taking them back:
// the sequence the independent checker ran before two messages were hidden
// (clean restarts of nodes 0, 2, 0, 1, then a SIGSTOP of 1). Checked with
// the audit off, a few seconds after the cluster settles.
func TestHandoffBurstsHideNothing(t *testing.T) {
	bursts, seed := faultParams(t, 4)
	rnd := rand.New(rand.NewPCG(seed, 1))
	nodes := startClusterWith(t, 3, "--audit-interval", "0")
	users := nodes[0].addUsers(t, "burst", 6, "pw")
	s := newStream(t, nodes, users, "pw")
	s.start(6, seed, true)
	f := 0
	for b := 0; b < bursts; b++ {
		time.Sleep(time.Duration(500+rnd.IntN(1500)) * time.Millisecond)
		f = s.burst(t, nodes, rnd, f, faultSigstop)
	}
	s.finish()
	waitFor(t, "every node back with rebuilt soft state", 90*time.Second, func() bool { return ready(nodes) })
	time.Sleep(3 * time.Second)
	s.summary(t)
	r := s.check(t, nodes, "checker")
	t.Logf("checker after %d faults in %d bursts: lost %d, missing through some nodes %d, duplicates %d", f, bursts, r.lost, r.partial, r.dups)
}

// SIGTERM during heavy delivery and RPC traffic, many times: every node
// exits with status 0 and no panic (before, an RPC still in flight wrote a
// profile after shutdown had closed the store: "panic: pebble: closed",
// once in 22 clean restarts), and nothing acknowledged is lost.
// QUILL_TERM_RESTARTS sets how many: CI runs 20 (the panic above came
// about once in 22, and the fix holds it off at every one), `make faults`
// the 50 it was found with.
func TestCleanRestartsUnderLoad(t *testing.T) {
	restarts := 20
	if v, err := strconv.Atoi(os.Getenv("QUILL_TERM_RESTARTS")); err == nil && v > 0 {
		restarts = v
	}
	_, seed := faultParams(t, restarts)
	rnd := rand.New(rand.NewPCG(seed, 1))
	nodes := startClusterWith(t, 3)
	users := nodes[0].addUsers(t, "term", 8, "pw")
	s := newStream(t, nodes, users, "pw")
	// Deliveries go on through the victim until it stops listening, and
	// read-backs make RPC traffic for fragments and bodies.
	s.start(8, seed, true)
	var took time.Duration
	for i := 0; i < restarts; i++ {
		time.Sleep(time.Duration(200+rnd.IntN(800)) * time.Millisecond)
		victim := nodes[rnd.IntN(len(nodes))]
		began := time.Now()
		if err := victim.Term(); err != nil {
			errorf(t, "restart %d: %v", i, err)
		}
		took = max(took, time.Since(began))
		s.setDown(victim, true)
		victim.Restart()
		s.setDown(victim, false)
	}
	s.finish()
	waitFor(t, "every node back with rebuilt soft state", 90*time.Second, func() bool { return ready(nodes) })
	time.Sleep(2 * time.Second)
	s.summary(t)
	t.Logf("%d clean restarts; the slowest SIGTERM-to-exit took %v", restarts, took.Round(time.Millisecond))
	r := s.check(t, nodes, "checker")
	t.Logf("checker: lost %d, missing through some nodes %d, duplicates %d", r.lost, r.partial, r.dups)
}
