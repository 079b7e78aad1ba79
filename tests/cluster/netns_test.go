package cluster_test

// Nodes in network namespaces: each quill process runs in a namespace of
// its own, joined to a bridge in the root namespace by a veth pair, so the
// test can cut the network between nodes (blackhole routes inside the
// namespaces, both directions) while it still reaches every node itself
// through the bridge. A node's data directory can live on a small tmpfs of
// its own, so the test can fill it (a full disk) or empty it (a wiped
// node). Needs root and iproute2; skipped otherwise.
//
// Names carry the test process's PID, so a later run can tell what a run
// that crashed left behind (and leaves alone what a live run uses):
// namespaces qt-PID-C-I, bridge qbPID-C, veths qvPID-C-I / qpPID-C-I
// (PID in hex, C the cluster's number in this process, I the node's),
// tmpfs mounts with source qt-PID-C-I.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Sizes for the full-disk fault.
const (
	// nsDiskSize is the default size of the tmpfs a node's data directory
	// lives on (netOptions.diskSize). The store's write-ahead logs are
	// preallocated to about its 64 MiB memtable size each, and a node
	// often has several: a few hundred MB in use with little mail.
	nsDiskSize = 1 << 30
	// nsMinFree is the node's --min-free: below it the node declares its
	// disk full and the balancer stops choosing it.
	nsMinFree = 48 << 20
	// nsFillLeaves is the free space a full-disk fault leaves: well under
	// nsMinFree, but room for what the node writes before it notices.
	nsFillLeaves = 8 << 20
)

// netClusters numbers the namespace clusters of this test process.
var netClusters atomic.Int32

// netCluster is a set of nodes, each in its own network namespace.
type netCluster struct {
	t      *testing.T
	tag    string // PID-C
	subnet int    // the second octet: nodes are 10.subnet.0.I
	bridge string
	Nodes  []*Node
	made   int              // namespaces made
	mounts map[*Node]string // tmpfs mount point (the data directory is inside)

	mu  sync.Mutex
	cut map[[2]int]bool // blackhole routes in place: namespace I drops to node J
}

// netOptions shape the nodes of a netCluster.
type netOptions struct {
	// tmpfs puts every node's data directory on a tmpfs of diskSize
	// bytes (nsDiskSize if 0). A tmpfs takes memory only for what is
	// written to it (and the filler of a full-disk fault).
	tmpfs    bool
	diskSize int64
	// extra arguments of quill serve for every node.
	extra []string
}

// requireNetns skips the test unless network namespaces can be made here.
func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root (CI runs as root); skipping")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network namespaces need iproute2's ip command; skipping")
	}
	probe := fmt.Sprintf("qt-%x-probe", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace (no CAP_SYS_ADMIN?): %v: %s", err, bytes.TrimSpace(out))
	}
	exec.Command("ip", "netns", "del", probe).Run()
}

// ipCmd runs ip with args and fails the test on error.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		fatalf(t, "ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// startNetCluster makes n namespaces on a fresh bridge and starts a node in
// each, every one joining the first, and waits until they agree on a user
// map over all of them.
func startNetCluster(t *testing.T, n int, opt netOptions) *netCluster {
	requireNetns(t)
	cleanStaleNetns(t)
	c := &netCluster{t: t, tag: fmt.Sprintf("%x-%d", os.Getpid(), netClusters.Add(1)),
		mounts: map[*Node]string{}, cut: map[[2]int]bool{}}
	c.subnet = freeSubnet(t)
	c.bridge = "qb" + c.tag
	// Cleanups run last in, first out: this one, registered first, runs
	// after every node has been stopped and every tmpfs unmounted.
	t.Cleanup(c.teardown)
	sayFailuresLast(t)
	ipCmd(t, "link", "add", c.bridge, "type", "bridge")
	ipCmd(t, "addr", "add", fmt.Sprintf("10.%d.0.254/24", c.subnet), "dev", c.bridge)
	ipCmd(t, "link", "set", c.bridge, "up")
	var tok [16]byte
	rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	for i := 1; i <= n; i++ {
		ns := c.nsName(i)
		veth, peer := fmt.Sprintf("qv%s-%d", c.tag, i), fmt.Sprintf("qp%s-%d", c.tag, i)
		ipCmd(t, "netns", "add", ns)
		c.made = i
		ipCmd(t, "link", "add", veth, "type", "veth", "peer", "name", peer)
		ipCmd(t, "link", "set", peer, "netns", ns)
		ipCmd(t, "link", "set", veth, "master", c.bridge)
		ipCmd(t, "link", "set", veth, "up")
		ipCmd(t, "-n", ns, "link", "set", peer, "name", "eth0")
		ipCmd(t, "-n", ns, "addr", "add", fmt.Sprintf("%s/24", c.ip(i)), "dev", "eth0")
		ipCmd(t, "-n", ns, "link", "set", "eth0", "up")
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	for i := 1; i <= n; i++ {
		ip := c.ip(i)
		nd := &Node{t: t, ns: c.nsName(i), ip: ip, token: token, extra: opt.extra, logs: t.TempDir(),
			Gossip: net.JoinHostPort(ip, nsGossipPort), HTTP: net.JoinHostPort(ip, nsHTTPPort)}
		if i > 1 {
			nd.join = []string{c.Nodes[0].Gossip}
		}
		nd.Data = t.TempDir()
		if opt.tmpfs {
			mnt := nd.Data
			src := fmt.Sprintf("qt-%s-%d", c.tag, i)
			size := opt.diskSize
			if size == 0 {
				size = nsDiskSize
			}
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), src, mnt).CombinedOutput(); err != nil {
				fatalf(t, "mount tmpfs on %s: %v: %s", mnt, err, bytes.TrimSpace(out))
			}
			t.Cleanup(func() {
				if err := syscall.Unmount(mnt, 0); err != nil {
					t.Logf("unmount %s: %v (detaching)", mnt, err)
					syscall.Unmount(mnt, syscall.MNT_DETACH)
				}
			})
			c.mounts[nd] = mnt
			nd.Data = filepath.Join(mnt, "data")
		}
		nd.start()
		t.Cleanup(nd.Stop)
		c.Nodes = append(c.Nodes, nd)
	}
	waitFor(t, "all nodes in namespaces to agree on the user map", 30*time.Second, func() bool { return agree(c.Nodes, c.Nodes) })
	return c
}

func (c *netCluster) nsName(i int) string { return fmt.Sprintf("qt-%s-%d", c.tag, i) }
func (c *netCluster) ip(i int) string     { return fmt.Sprintf("10.%d.0.%d", c.subnet, i) }

// index returns the 1-based number of a node of the cluster.
func (c *netCluster) index(n *Node) int {
	for i, nd := range c.Nodes {
		if nd == n {
			return i + 1
		}
	}
	fatalf(c.t, "node %s is not in the cluster", n.ID)
	return 0
}

// Partition cuts every path between a node of a and a node of b, both
// directions, until Heal. The test process still reaches every node.
func (c *netCluster) Partition(a, b []*Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			i, j := c.index(x), c.index(y)
			for _, p := range [][2]int{{i, j}, {j, i}} {
				if c.cut[p] {
					continue
				}
				ipCmd(c.t, "-n", c.nsName(p[0]), "route", "add", "blackhole", c.ip(p[1])+"/32")
				c.cut[p] = true
			}
		}
	}
}

// Heal removes every cut made by Partition.
func (c *netCluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.cut {
		ipCmd(c.t, "-n", c.nsName(p[0]), "route", "del", "blackhole", c.ip(p[1])+"/32")
		delete(c.cut, p)
	}
}

// Fill leaves nsFillLeaves free on the node's tmpfs, with a filler file
// beside (not in) its data directory; Unfill removes it.
func (c *netCluster) Fill(n *Node) error {
	mnt, ok := c.mounts[n]
	if !ok {
		return fmt.Errorf("node %s has no tmpfs of its own", n.ID)
	}
	f, err := os.OpenFile(filepath.Join(mnt, "filler"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// The node keeps writing between the free-space reading and the
	// allocation, so an allocation can find less room than was read
	// (ENOSPC, nothing allocated): read again and leave a little more.
	var st syscall.Statfs_t
	for slack := int64(0); ; slack += 16 << 20 {
		if err := syscall.Statfs(mnt, &st); err != nil {
			return err
		}
		size := int64(st.Bavail)*st.Bsize - nsFillLeaves - slack
		if size <= 0 {
			return nil
		}
		err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
		if err == nil || !errors.Is(err, syscall.ENOSPC) || slack >= 64<<20 {
			return err
		}
	}
}

// Unfill removes the filler of Fill.
func (c *netCluster) Unfill(n *Node) error {
	err := os.Remove(filepath.Join(c.mounts[n], "filler"))
	if os.IsNotExist(err) {
		return nil
	}
	return err
}

// UsedBytes returns the space used on the node's tmpfs.
func (c *netCluster) UsedBytes(n *Node) int64 {
	var st syscall.Statfs_t
	if syscall.Statfs(c.mounts[n], &st) != nil {
		return -1
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// FreeBytes returns the free space of the node's tmpfs.
func (c *netCluster) FreeBytes(n *Node) int64 {
	var st syscall.Statfs_t
	if syscall.Statfs(c.mounts[n], &st) != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

// Wipe kills the node with SIGKILL, deletes everything in its data
// directory and starts it again: it comes back as a new node (new id, no
// mail).
func (c *netCluster) Wipe(n *Node) {
	n.Kill9()
	ents, err := os.ReadDir(n.Data)
	if err != nil {
		fatalf(c.t, "%v", err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(n.Data, e.Name())); err != nil {
			fatalf(c.t, "%v", err)
		}
	}
	n.Restart()
}

// teardown removes the namespaces, veths and bridge (the nodes are already
// stopped, and the tmpfs mounts gone, by their own cleanups).
func (c *netCluster) teardown() {
	for i := 1; i <= c.made; i++ {
		killNetnsPids(c.nsName(i))
		exec.Command("ip", "netns", "del", c.nsName(i)).Run()
		exec.Command("ip", "link", "del", fmt.Sprintf("qv%s-%d", c.tag, i)).Run()
	}
	exec.Command("ip", "link", "del", c.bridge).Run()
}

// killNetnsPids SIGKILLs every process still in the namespace.
func killNetnsPids(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// staleOwner reports whether name, made by this file's naming, belongs to
// a test process that no longer runs.
func staleOwner(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	pidHex, _, ok := strings.Cut(rest, "-")
	if !ok {
		return false
	}
	pid, err := strconv.ParseInt(pidHex, 16, 32)
	if err != nil || pid <= 0 {
		return false
	}
	if int(pid) == os.Getpid() {
		return false
	}
	err = syscall.Kill(int(pid), 0)
	return err == syscall.ESRCH
}

// cleanStaleNetns removes what a crashed earlier run left: its processes,
// namespaces, veths, bridge and tmpfs mounts.
func cleanStaleNetns(t *testing.T) {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !staleOwner(f[0], "qt-") {
			continue
		}
		t.Logf("removing stale namespace %s", f[0])
		killNetnsPids(f[0])
		exec.Command("ip", "netns", "del", f[0]).Run()
	}
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[2] == "tmpfs" && staleOwner(f[0], "qt-") {
				t.Logf("unmounting stale tmpfs %s on %s", f[0], f[1])
				syscall.Unmount(f[1], syscall.MNT_DETACH)
			}
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		// "12: qv1a2b-1-3@if11: <...>"
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if staleOwner(name, "qv") || staleOwner(name, "qp") || staleOwner(name, "qb") {
			t.Logf("removing stale link %s", name)
			exec.Command("ip", "link", "del", name).Run()
		}
	}
}

// freeSubnet returns a second octet X such that 10.X.0.0/16 is used by no
// address or route of the root namespace.
func freeSubnet(t *testing.T) int {
	used := map[int]bool{}
	for _, args := range [][]string{{"-4", "-o", "addr", "show"}, {"-4", "route", "show", "table", "all"}} {
		out, _ := exec.Command("ip", args...).Output()
		for _, f := range strings.Fields(string(out)) {
			if rest, ok := strings.CutPrefix(f, "10."); ok {
				oct, _, _ := strings.Cut(rest, ".")
				if x, err := strconv.Atoi(oct); err == nil {
					used[x] = true
				}
			}
		}
	}
	start := (os.Getpid()*7 + int(netClusters.Load())) % 150
	for k := 0; k < 150; k++ {
		x := 100 + (start+k)%150
		if !used[x] {
			return x
		}
	}
	fatalf(t, "no free 10.X.0.0/16 subnet for the test bridge")
	return 0
}

// createUser adds a user through the node's admin API (with the node's
// token, if any).
func (n *Node) createUser(t *testing.T, addr, pw string) {
	t.Helper()
	n.serveDomain(t, addr)
	if err := n.api(http.MethodPost, "/api/users", map[string]string{"address": addr, "password": pw}, nil); err != nil {
		fatalf(t, "add %s: %v", addr, err)
	}
}

// TestNetnsPartitionHeals checks the namespace plumbing and what
// Porcupine §3 promises of a partition: three nodes in namespaces; one is
// cut from the other two, each side recomputes its user map over the nodes
// it can reach, and when the network heals they merge back into one map
// with no operator command. Also checks that signals reach quill through
// `ip netns exec` (the PID is quill's).
func TestNetnsPartitionHeals(t *testing.T) {
	c := startNetCluster(t, 3, netOptions{})
	nodes := c.Nodes
	for _, n := range nodes {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", n.cmd.Process.Pid))
		if err != nil || filepath.Base(exe) != filepath.Base(quillBin) {
			fatalf(t, "process %d of node %s is %q (%v), not quill: signals would miss it", n.cmd.Process.Pid, n.ID, exe, err)
		}
	}
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user = "part@cluster.example"
	nodes[0].createUser(t, user, "pw")
	if err := nodes[1].send(user, "before"); err != nil {
		fatalf(t, "%v", err)
	}

	lone, rest := nodes[2], nodes[:2]
	c.Partition([]*Node{lone}, rest)
	cut := time.Now()
	split := waitFor(t, "both sides to drop each other", 60*time.Second, func() bool {
		return agree(rest, rest) && agree([]*Node{lone}, []*Node{lone})
	})
	t.Logf("partition to two user maps: %v", split.Round(time.Millisecond))
	// The majority side takes mail. The lone side may not hold the
	// user's profile (2 replicas of 3 nodes): it may ask the sender to
	// try again later (4xx), but must not bounce the mail (5xx).
	want := []string{"before", "majority side"}
	if err := rest[0].send(user, "majority side"); err != nil {
		errorf(t, "delivery on the majority side: %v", err)
	}
	switch err := lone.send(user, "lone side"); {
	case err == nil:
		want = append(want, "lone side")
	case permanent(err):
		errorf(t, "delivery on the lone side refused for good (the sender bounces it): %v", err)
	default:
		t.Logf("delivery on the lone side deferred: %v", err)
	}
	// SIGSTOP and SIGCONT reach quill through ip netns exec.
	lone.Pause()
	time.Sleep(200 * time.Millisecond)
	if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", lone.cmd.Process.Pid)); !strings.Contains(string(st), ") T ") {
		errorf(t, "SIGSTOP did not stop the node: %s", st)
	}
	lone.Resume()

	c.Heal()
	healed := time.Now()
	merge := waitFor(t, "the sides to merge", 60*time.Second, func() bool { return ready(nodes) })
	t.Logf("heal to one user map with rebuilt soft state on 3 nodes: %v (partitioned for %v)",
		merge.Round(time.Millisecond), healed.Sub(cut).Round(time.Millisecond))
	for _, n := range nodes {
		_, subj, _, err := n.imapView(user, "pw")
		if err != nil {
			fatalf(t, "IMAP through %s after the heal: %v", n.ID, err)
		}
		seen := map[string]int{}
		for _, s := range subj {
			seen[s]++
		}
		for _, w := range want {
			if seen[w] == 0 {
				errorf(t, "through %s after the heal: %q missing (mailbox %v)", n.ID, w, subj)
			}
		}
	}

	// Kill9 through ip netns exec kills quill: the others see it go.
	lone.Kill9()
	waitFor(t, "the others to drop the killed node", 60*time.Second, func() bool { return agree(rest, rest) })
}
