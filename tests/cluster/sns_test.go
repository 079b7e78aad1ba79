package cluster_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/sns"
)

// poolOf returns the node's worker pool of a class (/api/sns).
func poolOf(n *Node, class string) sns.Status {
	var st []sns.Status
	n.get("/api/sns", &st)
	for _, p := range st {
		if p.Class == class {
			return p
		}
	}
	return sns.Status{Class: class}
}

// snsManagers returns each node's view of the SNS manager.
func snsManagers(nodes []*Node) map[*Node]sns.ManagerStatus {
	out := map[*Node]sns.ManagerStatus{}
	for _, n := range nodes {
		var st sns.ManagerStatus
		if n.get("/api/sns/manager", &st) == nil {
			out[n] = st
		}
	}
	return out
}

// oneManager reports the manager every node of nodes follows, if they all
// follow the same one and exactly one of them is it.
func oneManager(nodes []*Node) (string, bool) {
	views := snsManagers(nodes)
	if len(views) != len(nodes) {
		return "", false
	}
	var m string
	self := 0
	for _, st := range views {
		if st.Manager == "" || (m != "" && st.Manager != m) {
			return "", false
		}
		m = st.Manager
		if st.Self {
			self++
		}
	}
	return m, self == 1
}

// The SNS manager is elected among the nodes by its beacons; when it is
// killed, the others elect another after the beacons stop; when it comes
// back, it follows the new one: one manager at all times after settling.
func TestSNSManagerElectedAndReplaced(t *testing.T) {
	nodes := startClusterWith(t, 3, "--relay-workers", "1")
	var first string
	waitFor(t, "one SNS manager that every node follows", 30*time.Second, func() bool {
		m, ok := oneManager(nodes)
		first = m
		return ok
	})
	var victim *Node
	var rest []*Node
	for _, n := range nodes {
		if n.ID == first {
			victim = n
		} else {
			rest = append(rest, n)
		}
	}
	if victim == nil {
		fatalf(t, "manager %s is not one of the nodes", first)
	}
	victim.Kill9()
	var second string
	took := waitFor(t, "the survivors to elect another manager", 30*time.Second, func() bool {
		m, ok := oneManager(rest)
		second = m
		return ok && m != first
	})
	t.Logf("manager %s killed; %s manager after %v", first, second, took.Round(100*time.Millisecond))
	if took > 10*time.Second {
		errorf(t, "a new SNS manager took %v (beacon timeout 2 s plus a backoff of up to 2 s)", took)
	}
	victim.Restart()
	waitFor(t, "the restarted node to follow the new manager", 30*time.Second, func() bool {
		m, ok := oneManager(nodes)
		return ok && m == second
	})
	waitFor(t, "every node's launch table to hold a row per node", 15*time.Second, func() bool {
		for _, st := range snsManagers(nodes) {
			if len(st.Table) < len(nodes) {
				return false
			}
		}
		return true
	})
}

// An overflow node runs no relay worker while a dedicated node has one:
// the mail it queues goes out through the dedicated node's worker, over
// the node RPC (SNS dispatch across the cluster).
func TestSNSOverflowNodeDispatchesToDedicatedWorkers(t *testing.T) {
	sk := &sink{addr: freeAddr(t)}
	sk.serve(t)
	_, port, _ := net.SplitHostPort(sk.addr)
	args := []string{"--dns", startDNS(t), "--outbound-port", port, "--queue-retry", "1s",
		"--submission", "127.0.0.1:0", "--relay-workers", "1"}
	nodes := startClusterWith(t, 1, args...)
	dedicated := nodes[0]
	over := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t), join: []string{dedicated.Gossip},
		extra: append(append([]string(nil), args...), "--overflow")}
	over.start()
	t.Cleanup(over.Stop)
	nodes = append(nodes, over)
	waitFor(t, "both nodes to agree on the user map", 30*time.Second, func() bool { return agree(nodes, nodes) })
	waitFor(t, "soft state on both nodes", 30*time.Second, func() bool { return ready(nodes) })

	// A first message makes the dedicated node launch its worker.
	const user = "over@queue.test"
	dedicated.createUser(t, user, "pw")
	// One copy of each queue entry, so the entries spread over both
	// nodes and each is run by the node holding it (with two copies on
	// two nodes, the lower node id runs them all).
	if err := dedicated.api("PUT", "/api/users/"+user+"/replication", map[string]any{"replicas": 1}, nil); err != nil {
		fatalf(t, "replicas of %s: %v", user, err)
	}
	send := func(n *Node, marker string) {
		if err := submit(n.Addrs["submission"], user, "pw", []string{"bob@" + remoteDomain},
			"From: "+user+"\r\nSubject: "+marker+"\r\n\r\nx\r\n"); err != nil {
			fatalf(t, "submit through %s: %v", n.ID, err)
		}
	}
	send(dedicated, "first")
	waitFor(t, "the first message to arrive", 30*time.Second, func() bool { return sk.count("first") > 0 })
	waitFor(t, "the overflow node to see the dedicated node's worker", 15*time.Second, func() bool {
		for _, r := range snsManagers([]*Node{over})[over].Table {
			if r.Node == dedicated.ID && r.Workers > 0 {
				return true
			}
		}
		return false
	})
	// Many messages through the overflow node: whichever node's queue
	// holds them, each goes out through the dedicated node's worker.
	const n = 12
	for i := 0; i < n; i++ {
		send(over, fmt.Sprintf("through-overflow-%d", i))
	}
	for i := 0; i < n; i++ {
		m := fmt.Sprintf("through-overflow-%d", i)
		waitFor(t, m+" to arrive", 60*time.Second, func() bool { return sk.count(m) > 0 })
	}
	relays := poolOf(over, sns.RelayClass)
	if relays.Launches != 0 {
		errorf(t, "the overflow node launched workers (%+v) while the dedicated node had one", relays)
	} else if relays.Remote == 0 {
		errorf(t, "the overflow node handed no task to the dedicated node (%+v): its queue held none of %d messages?", relays, n)
	} else {
		t.Logf("the overflow node handed %d tasks to the dedicated node's worker", relays.Remote)
	}
}

// Two SNS managers, made by a real partition, resolve to one when it
// heals (SNS §3.4: the higher term wins, then the lower id). The manager
// is cut off alone: it keeps its role, the other side elects its own;
// after the heal every node follows the same one.
func TestNetnsTwoSNSManagersResolveToOne(t *testing.T) {
	c := startNetCluster(t, 3, netOptions{})
	nodes := c.Nodes
	var first string
	waitFor(t, "one SNS manager that every node follows", 30*time.Second, func() bool {
		m, ok := oneManager(nodes)
		first = m
		return ok
	})
	var lone *Node
	var rest []*Node
	for _, n := range nodes {
		if n.ID == first {
			lone = n
		} else {
			rest = append(rest, n)
		}
	}
	if lone == nil {
		fatalf(t, "manager %s is not one of the nodes", first)
	}
	c.Partition([]*Node{lone}, rest)
	var second string
	took := waitFor(t, "the cut-off side to elect a manager of its own", 60*time.Second, func() bool {
		m, ok := oneManager(rest)
		second = m
		own, alone := oneManager([]*Node{lone})
		return ok && m != first && alone && own == first
	})
	t.Logf("partitioned: %s still manages its side, %s elected on the other after %v", first, second, took.Round(100*time.Millisecond))
	c.Heal()
	var winner string
	took = waitFor(t, "one manager again after the heal", 60*time.Second, func() bool {
		m, ok := oneManager(nodes)
		winner = m
		return ok
	})
	views := snsManagers(nodes)
	t.Logf("healed: every node follows %s after %v (term %d)", winner, took.Round(100*time.Millisecond), views[lone].Term)
	if winner != second {
		// The other side's manager stood with a higher term than the one
		// cut off, so it must be the one left.
		errorf(t, "after the heal the manager is %s, want %s (the higher term)", winner, second)
	}
}
