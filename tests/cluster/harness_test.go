// Package cluster_test starts several real quill processes on loopback and
// checks what Porcupine §3 promises of membership: nodes join, crash, pause
// and come back with no operator command, and the user map follows.
package cluster_test

import (
	"bufio"
	"bytes"
	"cmp"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
// (gossip uses both). The port is taken below the kernel's ephemeral range:
// a port picked by binding port 0 and released goes back to that pool, and
// a node binding its own RPC listener to port 0 could be handed it before
// it binds the address it was told to use ("address already in use").
func freeAddr(t *testing.T) string {
	t.Helper()
	lo := ephemeralLow()
	picked.Lock()
	defer picked.Unlock()
	if picked.ports == nil {
		picked.ports = map[int]bool{}
	}
	for i := 0; i < 200; i++ {
		port := fixedPortFloor + rand.IntN(lo-fixedPortFloor)
		if picked.ports[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		u.Close()
		picked.ports[port] = true
		return addr
	}
	fatalf(t, "no free port pair below %d", lo)
	return ""
}

// fixedPortFloor is the lowest port freeAddr hands out (above the usual
// system services).
const fixedPortFloor = 10000

// picked are the ports freeAddr handed out in this test process.
var picked struct {
	sync.Mutex
	ports map[int]bool
}

// ephemeralLow returns the start of the kernel's ephemeral port range
// (32768 if it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	if lo, err := strconv.Atoi(f[0]); err == nil && lo > fixedPortFloor+1000 {
		return lo
	}
	return 32768
}

// Node is one quill process.
type Node struct {
	t      *testing.T
	Data   string
	Gossip string
	HTTP   string
	Addrs  map[string]string
	ID     string
	join   []string
	cmd    *exec.Cmd
	stderr *os.File
	// exited is closed when the process has been waited for.
	exited  chan struct{}
	stopped bool

	// Set for a node in a network namespace (netns_test.go): the process
	// runs under `ip netns exec ns`, listens on ip, and the admin API (not
	// on loopback) needs token, which is written to the data directory
	// before every start.
	ns, ip, token string
	// extra arguments of quill serve.
	extra []string
	// logs is where stderr logs go (outside the data directory, which a
	// wipe empties).
	logs     string
	logsKept bool
	// startWait bounds the wait for "ready" (0: startWait, 20 s); a
	// node on Cassandra opens and may migrate the keyspace first.
	startWait time.Duration
}

// startWait is how long a node may take to say it is ready.
const startWait = 20 * time.Second

// StartNode starts a node that gossips on a fresh free port and joins seeds.
func StartNode(t *testing.T, join ...string) *Node {
	sayFailuresLast(t)
	n := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t), join: join}
	n.start()
	t.Cleanup(n.Stop)
	return n
}

// failures keeps each test's error messages (those made through errorf and
// fatalf) so that sayFailuresLast can repeat them as the test's last lines:
// CI shows only the end of a failing run's output, and the nodes' logs
// printed at cleanup would push the reasons out of it.
var failures struct {
	sync.Mutex
	by map[*testing.T]*[]string
}

// sayFailuresLast makes the test's recorded failures its last output. It is
// called before the test's first node starts: cleanups run last in, first
// out, so this one runs after every node has been stopped.
func sayFailuresLast(t *testing.T) {
	failures.Lock()
	defer failures.Unlock()
	if failures.by == nil {
		failures.by = map[*testing.T]*[]string{}
	}
	if failures.by[t] != nil {
		return
	}
	list := &[]string{}
	failures.by[t] = list
	t.Cleanup(func() {
		failures.Lock()
		delete(failures.by, t)
		failures.Unlock()
		if t.Failed() && len(*list) > 0 {
			t.Logf("%s failed: %d reason(s), repeated from above:\n  - %s", t.Name(), len(*list), strings.Join(*list, "\n  - "))
		}
	})
}

// errorf is t.Errorf, with the message kept for sayFailuresLast.
func errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	failures.Lock()
	if list := failures.by[t]; list != nil {
		*list = append(*list, msg)
	}
	failures.Unlock()
	t.Error(msg)
}

// fatalf is t.Fatalf, with the message kept for sayFailuresLast.
func fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	errorf(t, format, args...)
	t.FailNow()
}

// Ports of the protocol listeners of a node in its own network namespace:
// each namespace has an address of its own, so fixed ports cannot collide.
const (
	nsSMTPPort   = "2525"
	nsPOP3Port   = "1110"
	nsIMAPPort   = "1143"
	nsHTTPPort   = "8025"
	nsGossipPort = "7946"
)

func (n *Node) start() {
	t := n.t
	smtp, pop3, imap := "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	if n.ip != "" {
		smtp, pop3, imap = net.JoinHostPort(n.ip, nsSMTPPort), net.JoinHostPort(n.ip, nsPOP3Port), net.JoinHostPort(n.ip, nsIMAPPort)
	}
	// No implicit-TLS listeners (their fixed default ports would collide
	// between nodes); the tests log in without TLS, which nodes on the
	// netns addresses (not loopback) refuse unless told otherwise.
	args := []string{"serve", "--data", n.Data, "--smtp", smtp, "--pop3", pop3,
		"--imap", imap, "--http", n.HTTP, "--cluster", n.Gossip, "--smtps=", "--imaps=", "--pop3s=", "--submission=",
		// The checkers poll with logins that may fail while a change
		// spreads: no growing delay and no lockout of their address.
		"--auth-max-delay", "1s", "--auth-lockout-after", "1000000"}
	if n.ip != "" {
		args = append(args, "--allow-plaintext-auth")
	}
	if len(n.join) > 0 {
		args = append(args, "--join", strings.Join(n.join, ","))
	}
	args = append(args, n.extra...)
	cmd := exec.Command(quillBin, args...)
	if n.ns != "" {
		// ip netns exec execs the command: the process is quill itself,
		// so signals reach it directly.
		cmd = exec.Command("ip", append([]string{"netns", "exec", n.ns, quillBin}, args...)...)
	}
	if err := os.MkdirAll(n.Data, 0o700); err != nil {
		fatalf(t, "%v", err)
	}
	if n.token == "" {
		// The admin API asks for a token on loopback too.
		var tok [16]byte
		crand.Read(tok[:])
		n.token = hex.EncodeToString(tok[:])
	}
	{
		// quill reads an existing token file and makes one only if
		// missing (also after a wipe).
		if err := os.WriteFile(filepath.Join(n.Data, admin.TokenFile), []byte(n.token+"\n"), 0o600); err != nil {
			fatalf(t, "%v", err)
		}
	}
	logs := n.logs
	if logs == "" {
		logs = n.Data
	}
	errf, err := os.CreateTemp(logs, "stderr-*.log")
	if err != nil {
		fatalf(t, "%v", err)
	}
	cmd.Stderr = errf
	out, err := cmd.StdoutPipe()
	if err != nil {
		fatalf(t, "%v", err)
	}
	if err := cmd.Start(); err != nil {
		fatalf(t, "%v", err)
	}
	exited := make(chan struct{})
	n.cmd, n.stderr, n.stopped, n.exited = cmd, errf, false, exited
	// The listener map is filled before it is published: clients of the
	// previous incarnation may still be reading the old one.
	addrs := map[string]string{}
	ready := make(chan error, 1)
	go func() {
		defer func() { cmd.Wait(); close(exited) }()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if f := strings.Fields(line); len(f) == 5 && f[2] == "listening" {
				addrs[strings.ToLower(f[1])] = f[4]
			}
			if strings.Contains(line, " ready, data in ") {
				n.ID = strings.Fields(line)[2]
				n.Addrs = addrs
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
			<-exited
			n.stopped = true
			fatalf(t, "%v (%v); stderr:\n%s", err, cmd.ProcessState, n.Stderr())
		}
	case <-time.After(cmp.Or(n.startWait, startWait)):
		fatalf(t, "quill not ready after %v; stderr:\n%s", cmp.Or(n.startWait, startWait), n.Stderr())
	}
}

// Exited reports whether the process ended without the test stopping it.
func (n *Node) Exited() bool {
	if n.stopped || n.exited == nil {
		return false
	}
	select {
	case <-n.exited:
		return true
	default:
		return false
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
	<-n.exited
	n.stopped = true
}

// Stop ends the process with SIGTERM (SIGKILL if it hangs). It runs at
// cleanup; when the test failed and QUILL_TEST_LOGS names a directory, the
// node's logs are copied there.
func (n *Node) Stop() {
	if n.stopped {
		n.keepLogs()
		return
	}
	defer n.keepLogs()
	n.terminate(15 * time.Second)
	if n.t.Failed() {
		n.t.Logf("node %s log, last notable lines:\n%s", n.ID, tail(notable(n.Stderr()), 20))
	}
}

// terminate sends SIGTERM (after SIGCONT, in case it is paused), waits up
// to d for the process to exit and SIGKILLs it after that; it reports
// whether it exited by itself.
func (n *Node) terminate(d time.Duration) bool {
	n.cmd.Process.Signal(syscall.SIGCONT)
	n.cmd.Process.Signal(syscall.SIGTERM)
	defer func() { n.stopped = true }()
	select {
	case <-n.exited:
		return true
	case <-time.After(d):
		n.cmd.Process.Kill()
		<-n.exited
		return false
	}
}

// keepLogs copies the stderr logs of every start of the node to
// QUILL_TEST_LOGS/TEST-NAME if that is set and the test failed (or passed
// too, with QUILL_TEST_LOGS_ALWAYS set: for a slow phase in a passing run).
func (n *Node) keepLogs() {
	root := os.Getenv("QUILL_TEST_LOGS")
	failedOrAlways := n.t.Failed() || os.Getenv("QUILL_TEST_LOGS_ALWAYS") != ""
	if root == "" || !failedOrAlways || n.logsKept {
		return
	}
	n.logsKept = true
	dir := filepath.Join(root, strings.ReplaceAll(n.t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Logf("keep logs: %v", err)
		return
	}
	for _, l := range n.logFiles() {
		b, err := os.ReadFile(l)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, n.ID+"-"+filepath.Base(l)), b, 0o644)
		}
		if err != nil {
			n.t.Logf("keep logs: %v", err)
		}
	}
	n.t.Logf("logs of node %s kept in %s", n.ID, dir)
}

// logFiles returns the stderr logs of every start of the node.
func (n *Node) logFiles() []string {
	src := n.logs
	if src == "" {
		src = n.Data
	}
	logs, _ := filepath.Glob(filepath.Join(src, "stderr-*.log"))
	return logs
}

// Restart starts the node again on the same data directory and addresses.
func (n *Node) Restart() { n.start() }

// Pause and Resume send SIGSTOP and SIGCONT.
func (n *Node) Pause()  { n.cmd.Process.Signal(syscall.SIGSTOP) }
func (n *Node) Resume() { n.cmd.Process.Signal(syscall.SIGCONT) }

// api calls the node's admin API (with its token, if any): body, if not
// nil, is sent as JSON, and a 2xx answer is decoded into v, if not nil.
func (n *Node) api(method, path string, body, v any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+n.HTTP+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if n.token != "" {
		req.Header.Set("Authorization", "Bearer "+n.token)
	}
	c := http.Client{Timeout: 2 * time.Second}
	if method != http.MethodGet {
		c.Timeout = 30 * time.Second
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s %s on %s: %s: %s", method, path, n.ID, resp.Status, strings.TrimSpace(string(b)))
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// get reads GET path of the node's admin API as JSON into v.
func (n *Node) get(path string, v any) error { return n.api(http.MethodGet, path, nil, v) }

// Status reads GET /cluster from the node.
func (n *Node) Status() (admin.ClusterStatus, error) {
	var st admin.ClusterStatus
	err := n.get("/cluster", &st)
	return st, err
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

// notable drops a node log's lines about single sessions (logins and the
// like, which fill the log under a delivery stream), keeping warnings,
// errors and cluster events.
func notable(log string) string {
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=INFO") && (strings.Contains(l, "logged in") || strings.Contains(l, "session=")) {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
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
	fatalf(t, "timed out after %v waiting for %s", timeout, what)
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
