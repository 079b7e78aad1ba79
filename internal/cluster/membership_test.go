package cluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	for i := 0; i < 20; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		// memberlist needs the UDP port as well.
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		u.Close()
		return addr
	}
	t.Fatal("no free port")
	return ""
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestMembershipUserMapConverges(t *testing.T) {
	var nodes []*Membership
	var mu sync.Mutex
	changes := map[NodeID]int{}
	seed := ""
	for i := 0; i < 3; i++ {
		addr := freeAddr(t)
		id := NodeID(fmt.Sprintf("n%d", i))
		cfg := MembershipConfig{Self: id, Boot: 1, Bind: addr, RPC: "rpc-" + string(id),
			OnChange: func(old, new *UserMap) { mu.Lock(); changes[id]++; mu.Unlock() }}
		if seed != "" {
			cfg.Seeds = []string{seed}
		} else {
			seed = addr
		}
		m, err := StartMembership(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, m)
	}
	defer func() {
		for _, m := range nodes {
			m.Shutdown()
		}
	}()
	same := func() bool {
		m0 := nodes[0].UserMap()
		for _, n := range nodes[1:] {
			if n.UserMap().Node != m0.Node {
				return false
			}
		}
		return len(nodes[0].Alive()) == 3
	}
	waitFor(t, "3 nodes to agree on the user map", 10*time.Second, same)
	um := nodes[0].UserMap()
	count := map[NodeID]int{}
	for _, n := range um.Node {
		count[n]++
	}
	if len(count) != 3 {
		t.Fatalf("buckets spread over %d nodes: %v", len(count), count)
	}
	if mi, ok := nodes[1].Lookup("n2"); !ok || mi.RPC != "rpc-n2" {
		t.Fatalf("meta of n2 not gossiped: %+v", mi)
	}
	// Every node's gossip went through the counting transport: it sent and
	// received packets (probes and acks) and joined or was joined by a
	// stream (push-pull), so it counted bytes both ways.
	for i, n := range nodes {
		g := n.Gossip()
		if g.SentMessages == 0 || g.ReceivedMessages == 0 || g.SentBytes < g.SentMessages || g.ReceivedBytes < g.ReceivedMessages {
			t.Errorf("node n%d gossip counted %+v: want messages and bytes both ways", i, g)
		}
	}
	// n2 leaves: the others take its buckets.
	nodes[2].Shutdown()
	nodes = nodes[:2]
	waitFor(t, "survivors to drop n2", 10*time.Second, func() bool {
		for _, n := range nodes {
			for _, id := range n.UserMap().Node {
				if id == "n2" {
					return false
				}
			}
		}
		return same2(nodes)
	})
}

func same2(nodes []*Membership) bool {
	m0 := nodes[0].UserMap()
	for _, n := range nodes[1:] {
		if n.UserMap().Node != m0.Node {
			return false
		}
	}
	return true
}

func TestSingleNodeMembership(t *testing.T) {
	var got *UserMap
	m, err := StartMembership(MembershipConfig{Self: "solo", Boot: 3, OnChange: func(old, new *UserMap) { got = new }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	um := m.UserMap()
	for b := 0; b < Buckets; b++ {
		if um.Node[b] != "solo" || um.Boot[b] != 3 {
			t.Fatalf("bucket %d: %s/%d", b, um.Node[b], um.Boot[b])
		}
	}
	if got == nil || got.Epoch != um.Epoch {
		t.Fatal("OnChange not called for the first map")
	}
}

// A node restarted with no seeds of its own (the cluster's first node is
// started without --join) finds its cluster again at once through the
// members it remembered, instead of running as a cluster of one until a
// peer's gossip happens to reach it.
func TestRestartedNodeRejoinsThroughRememberedMembers(t *testing.T) {
	known := filepath.Join(t.TempDir(), "cluster.known")
	addrA, addrB := freeAddr(t), freeAddr(t)
	a, err := StartMembership(MembershipConfig{Self: "a", Boot: 1, Bind: addrA, KnownFile: known})
	if err != nil {
		t.Fatal(err)
	}
	b, err := StartMembership(MembershipConfig{Self: "b", Boot: 1, Bind: addrB, Seeds: []string{addrA}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	waitFor(t, "a and b to see each other", 10*time.Second, func() bool { return len(a.Alive()) == 2 && len(b.Alive()) == 2 })
	waitFor(t, "a to remember b", 5*time.Second, func() bool {
		got, _ := os.ReadFile(known)
		return strings.TrimSpace(string(got)) == addrB
	})
	// a crashes: no leave message, b still counts it alive or suspect
	// when it comes back on the same address.
	a.ml.Shutdown()
	close(a.stop)
	a.wg.Wait()
	a, err = StartMembership(MembershipConfig{Self: "a", Boot: 2, Bind: addrA, KnownFile: known})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	// Start waits for a remembered member (knownJoinWait), so a sees b
	// right away, not after a gossip round.
	if n := len(a.Alive()); n != 2 {
		t.Fatalf("restarted a sees %d members at start, want 2 (b through the remembered address)", n)
	}
}
