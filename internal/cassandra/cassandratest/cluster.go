package cassandratest

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// nodetoolTimeout bounds one nodetool command; a repair of the small
// keyspaces of the long tests takes seconds.
const nodetoolTimeout = 10 * time.Minute

// Cluster is several Cassandra nodes this process started as one ring,
// each on its own loopback address with its own directory, for the long
// tests (node kills, throughput at several replication factors).
type Cluster struct {
	Nodes []*Node
	dir   string
}

// ClusterOptions says how many nodes and how they run.
type ClusterOptions struct {
	Nodes int
	// ShortLived compiles with C1 only (faster starts; see
	// scripts/cassandra.sh): for tests that restart nodes. Throughput
	// runs want the full JIT.
	ShortLived bool
}

// StartCluster starts opt.Nodes nodes on consecutive addresses in
// 127.0.0.10-99 (cassandratest's single nodes take .100-.249, make
// cassandra-3 takes .2-.4), one after the other (Cassandra refuses two
// nodes joining at once), with evenly spaced tokens and JMX ports for
// nodetool. The nodes share their CQL and storage ports, found free on
// every address.
func StartCluster(opt ClusterOptions) (*Cluster, error) {
	sh, err := prepare()
	if err != nil {
		return nil, err
	}
	n := max(opt.Nodes, 1)
	base := 10 + rand.IntN(90-n)
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("127.0.0.%d", base+i)
	}
	ports, err := freePorts(addrs, 2)
	if err != nil {
		return nil, err
	}
	jmx, err := freePorts([]string{"127.0.0.1"}, n)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "quill-cassandra-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	tokens := Tokens(n)
	for i, addr := range addrs {
		d := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		node := &Node{Addr: addr, Port: ports[0], Dir: d, sh: sh, spec: nodeSpec{addr: addr, port: ports[0], storage: ports[1],
			dir: d, seeds: addrs[0], token: tokens[i], jmxPort: jmx[i], shortLived: opt.ShortLived}}
		if err := node.launch(); err != nil {
			c.Stop()
			return nil, fmt.Errorf("node %d of %d: %w", i+1, n, err)
		}
		c.Nodes = append(c.Nodes, node)
	}
	return c, nil
}

// freePorts finds k ports free on every one of addrs at once.
func freePorts(addrs []string, k int) ([]int, error) {
	var out []int
	for try := 0; len(out) < k && try < 200; try++ {
		p := 20000 + rand.IntN(40000)
		ok := true
		for _, a := range addrs {
			l, err := net.Listen("tcp", net.JoinHostPort(a, strconv.Itoa(p)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok && !containsInt(out, p) {
			out = append(out, p)
		}
	}
	if len(out) < k {
		return nil, fmt.Errorf("no %d ports free on %s", k, strings.Join(addrs, ", "))
	}
	return out, nil
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Tokens returns n evenly spaced Murmur3 tokens (the ring is -2^63 ..
// 2^63-1), as scripts/cassandra.sh's cluster-start gives them.
func Tokens(n int) []string {
	ring := new(big.Int).Lsh(big.NewInt(1), 64)
	step := new(big.Int).Div(ring, big.NewInt(int64(n)))
	t := new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 63))
	out := make([]string, n)
	for i := range out {
		out[i] = t.String()
		t.Add(t, step)
	}
	return out
}

// Hosts returns every node's address for the driver.
func (c *Cluster) Hosts() []string {
	var h []string
	for _, n := range c.Nodes {
		h = append(h, n.Hosts()...)
	}
	return h
}

// Stop kills every node by its PID and removes their directories.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.Kill()
	}
	os.RemoveAll(c.dir)
}

// Nodetool runs nodetool against the node (scripts/cassandra.sh nodetool)
// and returns its output.
func (n *Node) Nodetool(args ...string) ([]byte, error) {
	if n.spec.jmxPort == 0 {
		return nil, errors.New("node started without JMX")
	}
	ctx, cancel := context.WithTimeout(context.Background(), nodetoolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", append([]string{n.sh, "nodetool", strconv.Itoa(n.spec.jmxPort)}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("nodetool %s on %s: %v: %s", strings.Join(args, " "), n.Addr, err, lastLines(out, 20))
	}
	return out, nil
}
