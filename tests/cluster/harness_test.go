// Package cluster_test starts several real quill processes on loopback and
// checks what Porcupine §3 promises of membership: nodes join, crash, pause
// and come back with no operator command, and the user map follows.
package cluster_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/admin"
)

var quillBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "quill-cluster-test")
	if err != nil {
		panic(err)
	}
	quillBin = os.Getenv("QUILL_BIN")
	if quillBin == "" {
		quillBin = filepath.Join(dir, "quill")
		out, err := exec.Command("go", "build", "-o", quillBin, "github.com/quillmail/quill/cmd/quill").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build quill: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a loopback address whose TCP and UDP ports are both free
// (gossip uses both).
func freeAddr(t *testing.T) string {
	t.Helper()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		u.Close()
		return addr
	}
	t.Fatal("no free port pair")
	return ""
}

// Node is one quill process.
type Node struct {
	t       *testing.T
	Data    string
	Gossip  string
	HTTP    string
	Addrs   map[string]string
	ID      string
	join    []string
	cmd     *exec.Cmd
	stderr  *os.File
	stopped bool
}

// StartNode starts a node that gossips on a fresh free port and joins seeds.
func StartNode(t *testing.T, join ...string) *Node {
	n := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t), join: join}
	n.start()
	t.Cleanup(n.Stop)
	return n
}

func (n *Node) start() {
	t := n.t
	args := []string{"serve", "--data", n.Data, "--smtp", "127.0.0.1:0", "--pop3", "127.0.0.1:0",
		"--imap", "127.0.0.1:0", "--http", n.HTTP, "--cluster", n.Gossip}
	if len(n.join) > 0 {
		args = append(args, "--join", strings.Join(n.join, ","))
	}
	cmd := exec.Command(quillBin, args...)
	errf, err := os.CreateTemp(n.Data, "stderr-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.cmd, n.stderr, n.stopped = cmd, errf, false
	n.Addrs = map[string]string{}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if f := strings.Fields(line); len(f) == 5 && f[2] == "listening" {
				n.Addrs[strings.ToLower(f[1])] = f[4]
			}
			if strings.Contains(line, " ready, data in ") {
				n.ID = strings.Fields(line)[2]
				ready <- nil
				io.Copy(io.Discard, out)
				return
			}
		}
		ready <- fmt.Errorf("quill exited before ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%v; stderr:\n%s", err, n.Stderr())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("quill not ready after 20s; stderr:\n%s", n.Stderr())
	}
}

// Stderr returns what the node logged.
func (n *Node) Stderr() string {
	b, _ := os.ReadFile(n.stderr.Name())
	return string(b)
}

// Kill9 kills the process with SIGKILL.
func (n *Node) Kill9() {
	if n.stopped {
		return
	}
	n.cmd.Process.Kill()
	n.cmd.Wait()
	n.stopped = true
}

// Stop ends the process with SIGTERM (SIGKILL if it hangs).
func (n *Node) Stop() {
	if n.stopped {
		return
	}
	n.cmd.Process.Signal(syscall.SIGCONT)
	n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		n.cmd.Process.Kill()
		<-done
	}
	n.stopped = true
	if n.t.Failed() {
		n.t.Logf("node %s stderr:\n%s", n.ID, tail(n.Stderr(), 40))
	}
}

// Restart starts the node again on the same data directory and addresses.
func (n *Node) Restart() { n.start() }

// Pause and Resume send SIGSTOP and SIGCONT.
func (n *Node) Pause()  { n.cmd.Process.Signal(syscall.SIGSTOP) }
func (n *Node) Resume() { n.cmd.Process.Signal(syscall.SIGCONT) }

// Status reads GET /cluster from the node.
func (n *Node) Status() (admin.ClusterStatus, error) {
	var st admin.ClusterStatus
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + n.HTTP + "/cluster")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// bucketOwners returns, as the node sees it, how many buckets each node
// manages.
func (n *Node) bucketOwners() map[string]int {
	st, err := n.Status()
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, b := range st.Buckets {
		out[string(b.Node)]++
	}
	return out
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// waitFor polls cond until it holds or timeout passes, and returns how long
// it took.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", timeout, what)
	return 0
}

// agree reports whether every node in nodes sees exactly the given set of
// managers in its user map, and all see the same map.
func agree(nodes []*Node, want []*Node) bool {
	ids := map[string]bool{}
	for _, w := range want {
		ids[w.ID] = true
	}
	var first []admin.BucketStatus
	for _, n := range nodes {
		st, err := n.Status()
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, b := range st.Buckets {
			if !ids[string(b.Node)] {
				return false
			}
			seen[string(b.Node)] = true
		}
		if len(seen) != len(ids) {
			return false
		}
		if first == nil {
			first = st.Buckets
			continue
		}
		for i := range first {
			if first[i].Node != st.Buckets[i].Node {
				return false
			}
		}
	}
	return true
}
