package cluster_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// Replication (issue 5) over real processes: every acknowledged message is on
// R=2 nodes, so a node lost for good loses nothing; repair brings every
// message back to two copies on the survivors and on a node whose disk was
// wiped; password changes through nodes whose clocks disagree by ±500 ms end
// with the last one; a node away longer than the update log keeps entries
// comes back as a new node.

// startReplicated starts n nodes with extra serve flags.
func startReplicated(t *testing.T, n int, extra ...string) []*Node {
	return startEach(t, n, func(int) []string { return extra })
}

// startEach starts n nodes, node i with the serve flags extra(i).
func startEach(t *testing.T, n int, extra func(i int) []string) []*Node {
	return startSet(t, n, func(i int, nd *Node) { nd.extra = extra(i) })
}

// startSet starts n nodes, node i set up by set(i, node) before its start,
// and waits until they agree on the user map.
func startSet(t *testing.T, n int, set func(i int, nd *Node)) []*Node {
	sayFailuresLast(t)
	var nodes []*Node
	for i := 0; i < n; i++ {
		nd := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t)}
		set(i, nd)
		if i > 0 {
			nd.join = []string{nodes[0].Gossip}
		}
		nd.start()
		t.Cleanup(nd.Stop)
		nodes = append(nodes, nd)
	}
	waitFor(t, "all nodes to agree on the user map", 30*time.Second, func() bool { return ready(nodes) })
	return nodes
}

// readAll returns the subjects of a user's INBOX as one node shows them.
func readAll(t *testing.T, n *Node, user string) map[string]int {
	t.Helper()
	_, subj, _, err := n.imapView(user, "pw")
	if err != nil {
		fatalf(t, "%s through %s: %v", user, n.ID, err)
	}
	out := map[string]int{}
	for _, s := range subj {
		out[s]++
	}
	return out
}

// waitReplicated waits until every node's update log is empty and a
// repair scan that began after the call found nothing under-replicated.
// sendNumbered delivers "msg 0".."msg n-1" to user through the nodes in
// turn and returns once each got its 250.
func sendNumbered(t *testing.T, nodes []*Node, user string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := nodes[i%len(nodes)].send(user, fmt.Sprintf("msg %d", i)); err != nil {
			fatalf(t, "send msg %d to %s: %v", i, user, err)
		}
	}
}

// checkNumbered reads user's INBOX through each node and reports every
// numbered message missing.
func checkNumbered(t *testing.T, nodes []*Node, user string, n int, when string) {
	t.Helper()
	for _, nd := range nodes {
		got := readAll(t, nd, user)
		for i := 0; i < n; i++ {
			if got[fmt.Sprintf("msg %d", i)] == 0 {
				errorf(t, "%s: %s through %s: msg %d lost", when, user, nd.ID, i)
			}
		}
	}
}

func waitReplicated(t *testing.T, nodes []*Node, timeout time.Duration) time.Duration {
	t.Helper()
	var last string
	start := time.Now()
	for time.Since(start) < timeout {
		ok, s := fullyReplicated(nodes)
		for _, n := range nodes {
			var r struct {
				LastRepair time.Time `json:"last_repair"`
			}
			if err := n.get("/api/replication", &r); err != nil || !r.LastRepair.After(start) {
				ok = false
			}
		}
		if ok {
			return time.Since(start)
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	fatalf(t, "not fully replicated after %v: %s", timeout, last)
	return 0
}

// Two nodes of three lost one after the other, with repair in between:
// every acknowledged message is still there, read through the last node.
func TestReplicasSurviveLosingNodes(t *testing.T) {
	nodes := startReplicated(t, 3, "--replace-after", "3s")
	users := []string{"r0@repl.example", "r1@repl.example", "r2@repl.example"}
	for _, u := range users {
		nodes[0].addUser(t, u, "pw")
	}
	const perUser = 15
	for i := 0; i < perUser; i++ {
		for j, u := range users {
			if err := nodes[(i+j)%3].send(u, fmt.Sprintf("msg %d", i)); err != nil {
				fatalf(t, "send %d to %s: %v", i, u, err)
			}
		}
	}
	took := waitReplicated(t, nodes, 30*time.Second)
	t.Logf("every message on 2 nodes %v after the last delivery", took)
	total := 0
	for _, n := range nodes {
		r, _ := n.Replication()
		total += int(r.Objects)
	}
	if total != 2*perUser*len(users) {
		fatalf(t, "%d message replicas on the nodes, want %d", total, 2*perUser*len(users))
	}

	check := func(live []*Node, when string) {
		for _, u := range users {
			checkNumbered(t, live, u, perUser, when)
		}
	}
	nodes[2].Kill9()
	live := nodes[:2]
	waitFor(t, "survivors to agree", 30*time.Second, func() bool { return ready(live) })
	check(live, "one node killed")
	took = waitReplicated(t, live, 60*time.Second)
	t.Logf("back to 2 copies on the 2 survivors %v after they agreed", took)
	nodes[1].Kill9()
	live = nodes[:1]
	waitFor(t, "the last node to take every bucket", 30*time.Second, func() bool { return ready(live) })
	check(live, "two nodes killed")
}

// A node whose disk is wiped comes back as a new node and is refilled:
// repair gives the messages it held new replicas, and the new node, the
// least loaded, receives its share.
//
// --replace-after is longer than the wiped node takes to come back: with a
// shorter one, repair may copy everything to the other survivor before the
// new node is there to take its share (still 2 copies, but no refill).
func TestWipedNodeIsRefilled(t *testing.T) {
	nodes := startReplicated(t, 3, "--replace-after", "10s")
	u := "wipe@repl.example"
	nodes[0].addUser(t, u, "pw")
	sendNumbered(t, nodes, u, 30)
	waitReplicated(t, nodes, 30*time.Second)
	// The user's mail spreads over 2 nodes (its spread): wipe one of them.
	var victim *Node
	for _, n := range nodes {
		if r, err := n.Replication(); err == nil && r.Objects > 0 {
			victim = n
		}
	}
	if victim == nil {
		fatalf(t, "no node reports holding the messages")
	}
	wipe(t, victim)
	waitFor(t, "the cluster with the new node", 30*time.Second, func() bool { return ready(nodes) })
	took := waitReplicated(t, nodes, 90*time.Second)
	t.Logf("every message back at 2 copies %v after the wiped node rejoined", took)
	r, err := victim.Replication()
	if err != nil {
		fatalf(t, "%v", err)
	}
	if r.Objects == 0 {
		fatalf(t, "the wiped node was not refilled")
	}
	t.Logf("the wiped node holds %d of the 30 messages again", r.Objects)
	checkNumbered(t, nodes, u, 30, "after the wipe")
}

// wipe kills the node, empties its data directory (keeping its logs) and
// starts it again: it comes back as a new node.
func wipe(t *testing.T, n *Node) {
	t.Helper()
	old := n.ID
	n.Kill9()
	entries, _ := os.ReadDir(n.Data)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "stderr-") {
			os.RemoveAll(filepath.Join(n.Data, e.Name()))
		}
	}
	n.Restart()
	if n.ID == old {
		fatalf(t, "a wiped node kept its id")
	}
}

// Three wipes one after another, each of a different node and each only
// once every message is back at two copies, lose nothing: the copies
// repair makes are themselves repaired when their node is wiped in turn
// (their records keep how many copies they want). Every node of the three
// is wiped once, so every message ends up on copies repair made.
func TestWipesOneAfterAnotherLoseNothing(t *testing.T) {
	nodes := startReplicated(t, 3, "--replace-after", "5s")
	u := "wipes@repl.example"
	nodes[0].addUser(t, u, "pw")
	sendNumbered(t, nodes, u, 60)
	waitReplicated(t, nodes, 30*time.Second)
	var gone []string
	for round, victim := range []*Node{nodes[0], nodes[1], nodes[2], nodes[0]} {
		gone = append(gone, victim.ID)
		wipe(t, victim)
		waitFor(t, "the cluster with the new node", 30*time.Second, func() bool { return ready(nodes) })
		waitFor(t, "every node to count the wiped ids as gone", 30*time.Second, func() bool { return stillCounted(nodes, gone) == "" })
		took := waitReplicated(t, nodes, 120*time.Second)
		t.Logf("wipe %d: every message back at 2 copies %v after the node rejoined", round+1, took)
		checkNumbered(t, nodes, u, 60, fmt.Sprintf("after wipe %d", round+1))
	}
}

func setPassword(n *Node, addr, pw string) error {
	body, _ := json.Marshal(map[string]string{"password": pw})
	req, _ := http.NewRequest(http.MethodPut, "http://"+n.HTTP+"/api/users/"+addr+"/password", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+n.token)
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("password through %s: %s", n.ID, resp.Status)
	}
	return nil
}

// Clocks 500 ms ahead and behind: password changes made one after another
// through different nodes, and across a failover of the user's manager,
// end with the last one (BLUEPRINT invariant 6).
func TestPasswordChangesUnderClockSkew(t *testing.T) {
	skews := []string{"500ms", "-500ms", "0s"}
	nodes := startEach(t, 3, func(i int) []string { return []string{"--clock-skew", skews[i]} })
	u := "skew@repl.example"
	nodes[0].addUser(t, u, "pw0")
	last := "pw0"
	for i := 1; i <= 12; i++ {
		last = fmt.Sprintf("pw%d", i)
		if err := setPassword(nodes[i%3], u, last); err != nil {
			fatalf(t, "%v", err)
		}
	}
	// The user's manager dies: its successor rebuilds the profile from
	// the replicas, whose clocks disagree.
	var mgr *Node
	mgrID := managerOf(t, nodes[0], u)
	for _, n := range nodes {
		if n.ID == mgrID {
			mgr = n
		}
	}
	if mgr == nil {
		fatalf(t, "manager %s of %s not found", mgrID, u)
	}
	mgr.Kill9()
	live := without(nodes, mgr)
	waitFor(t, "survivors ready", 30*time.Second, func() bool { return ready(live) })
	for i := 13; i <= 16; i++ {
		last = fmt.Sprintf("pw%d", i)
		if err := setPassword(live[i%2], u, last); err != nil {
			fatalf(t, "%v", err)
		}
	}
	mgr.Restart()
	waitFor(t, "all ready again", 30*time.Second, func() bool { return ready(nodes) })
	for _, n := range nodes {
		if _, _, _, err := n.imapView(u, last); err != nil {
			errorf(t, "through %s the last password %s fails: %v", n.ID, last, err)
		}
		if _, _, _, err := n.imapView(u, "pw12"); err == nil {
			errorf(t, "through %s an older password still works", n.ID)
		}
	}
}

// managerOf asks a node which node manages a user's bucket.
func managerOf(t *testing.T, n *Node, user string) string {
	t.Helper()
	st, err := n.Status()
	if err != nil {
		fatalf(t, "%v", err)
	}
	return string(st.Buckets[cluster.Bucket(user)].Node)
}

// A node away for longer than the update log keeps entries (here 3 s, a
// week by default) comes back as a new node with no hard state, and the
// repair restores what it had from the other replicas.
func TestNodeAwayTooLongRejoinsAsNew(t *testing.T) {
	t.Parallel() // waits on timers; beside the other parallel tests (CI's time is short)
	nodes := startReplicated(t, 3, "--log-max-age", "3s", "--replace-after", "2s")
	u := "away@repl.example"
	nodes[0].addUser(t, u, "pw")
	sendNumbered(t, nodes, u, 10)
	waitReplicated(t, nodes, 30*time.Second)
	away := nodes[2]
	old := away.ID
	away.Stop()
	time.Sleep(5 * time.Second)
	away.Restart()
	if away.ID == old {
		fatalf(t, "a node away longer than the log's maximum age kept its identity")
	}
	waitFor(t, "all ready again", 30*time.Second, func() bool { return ready(nodes) })
	waitReplicated(t, nodes, 60*time.Second)
	checkNumbered(t, nodes, u, 10, "after the renewal")
}

// A user whose write policy is ALL gets a 250 only once both replicas hold
// the message: with one of two nodes paused, the user's mail is refused
// (a temporary error) while ONE users' mail is accepted, and killing either
// node right after the last 250 loses nothing. The cluster's default stays
// ONE; the policy is the user's own.
func TestWritePolicyAllPerUser(t *testing.T) {
	nodes := startReplicated(t, 2, "--write-policy", "one")
	u := "all@repl.example"
	mgr := managerOf(t, nodes[0], u)
	one := ""
	for i := 0; one == ""; i++ {
		if c := fmt.Sprintf("one%d@repl.example", i); managerOf(t, nodes[0], c) == mgr {
			one = c
		}
	}
	nodes[0].addUser(t, u, "pw")
	nodes[0].addUser(t, one, "pw")
	body, _ := json.Marshal(map[string]any{"replicas": 2, "write_policy": "all"})
	req, _ := http.NewRequest(http.MethodPut, "http://"+nodes[1].HTTP+"/api/users/"+u+"/replication", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+nodes[1].token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fatalf(t, "%v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		fatalf(t, "set replication: %s", resp.Status)
	}
	// Pause the node that does not manage the two users, so their
	// lookups still answer.
	paused, other := nodes[0], nodes[1]
	if mgr == nodes[0].ID {
		paused, other = nodes[1], nodes[0]
	}
	paused.Pause()
	if err := other.send(one, "while paused"); err != nil {
		errorf(t, "ONE user refused while one replica is paused: %v", err)
	}
	if err := other.send(u, "while paused"); err == nil {
		errorf(t, "ALL user acknowledged while one of its two replicas is paused")
	} else {
		t.Logf("ALL user while a replica is paused: %v", err)
	}
	paused.Resume()
	waitFor(t, "both nodes back", 30*time.Second, func() bool { return ready(nodes) })
	sendNumbered(t, nodes, u, 20)
	nodes[0].Kill9()
	live := nodes[1:]
	waitFor(t, "the survivor to take every bucket", 30*time.Second, func() bool { return ready(live) })
	checkNumbered(t, live, u, 20, "acknowledged under ALL, one replica killed")
}

// A node that was down when a user was deleted comes back with the user's
// mail; the user's manager finds it in its scan of the returning node and
// has it dropped, and other users' mail there stays.
func TestDeletedUserMailLeavesReturningNode(t *testing.T) {
	t.Parallel() // waits on timers; beside the other parallel tests (CI's time is short)
	nodes := startReplicated(t, 2, "--replace-after", "10m")
	gone, stays := "gone@repl.example", "stays@repl.example"
	nodes[0].addUser(t, gone, "pw")
	nodes[0].addUser(t, stays, "pw")
	sendNumbered(t, nodes, gone, 6)
	sendNumbered(t, nodes, stays, 4)
	waitReplicated(t, nodes, 30*time.Second)
	for _, n := range nodes {
		if r, _ := n.Replication(); r.Objects != 10 {
			fatalf(t, "%s holds %d message replicas, want all 10 (2 nodes, R=2)", n.ID, r.Objects)
		}
	}
	back := nodes[1]
	back.Kill9()
	waitFor(t, "the survivor to take every bucket", 30*time.Second, func() bool { return ready(nodes[:1]) })
	if err := nodes[0].api(http.MethodDelete, "/api/users/"+gone, nil, nil); err != nil {
		fatalf(t, "delete %s while %s is down: %v", gone, back.ID, err)
	}
	deleted := time.Now()
	waitFor(t, "the survivor to hold only the other user's 4 message replicas", 30*time.Second, func() bool {
		r, err := nodes[0].Replication()
		return err == nil && r.LastRepair.After(deleted) && r.Objects == 4
	})
	back.Restart()
	waitFor(t, "both nodes to agree", 30*time.Second, func() bool { return ready(nodes) })
	agreed := time.Now()
	took := waitFor(t, "the returning node to drop the deleted user's mail", 90*time.Second, func() bool {
		r, err := back.Replication()
		return err == nil && r.LastRepair.After(agreed) && r.Objects == 4
	})
	t.Logf("the deleted user's mail left the returning node %v after the nodes agreed", took.Round(100*time.Millisecond))
	checkNumbered(t, nodes, stays, 4, "after the returning node dropped the deleted user's mail")
}
