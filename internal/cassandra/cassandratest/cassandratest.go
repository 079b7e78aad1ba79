// Package cassandratest runs a real Apache Cassandra node for a package's
// tests: Maven Central's cassandra-all jars on Java 17, started through
// scripts/cassandra.sh (which fetches the jars and writes the node's
// configuration), once per test binary from TestMain, on a loopback
// address and ports no other test process uses, and killed by its PID at
// the end (and by the kernel if the test binary dies first: Pdeathsig).
//
//	func TestMain(m *testing.M) { os.Exit(cassandratest.Main(m)) }
//
// A test gets the node's hosts with Hosts(t). With QUILL_CASSANDRA_HOSTS
// set (host:port,...) no node is started and the tests use that cluster
// (make cassandra-3-test). Without Java the tests are skipped, except
// under CI=true, where a node that cannot start fails the package.
package cassandratest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

const (
	// startTimeout bounds a node's start until CQL answers: about 12 s on
	// two cores other tests keep busy; a fetch of the jars (first run
	// without the cache: about a minute) comes before.
	startTimeout = 3 * time.Minute
	// startAttempts: a port found free can be taken by another process
	// before the JVM binds it; the node then exits and is started again
	// on other ports.
	startAttempts = 3
	// pollEvery is how often the start looks whether CQL answers.
	pollEvery = 250 * time.Millisecond
	// fetchTimeout bounds fetching the jars from Maven Central.
	fetchTimeout = 10 * time.Minute
)

// Node is a Cassandra node this process started.
type Node struct {
	Addr    string
	Port    int
	PID     int
	Dir     string
	Version string // release_version, as the node reports it
	// Took is how long the start took, until CQL answered.
	Took time.Duration

	spec   nodeSpec
	sh     string
	cmd    *exec.Cmd
	exited chan struct{}
}

// nodeSpec is how a node is started (again, for a restart): the arguments
// of scripts/cassandra.sh run.
type nodeSpec struct {
	addr          string
	port, storage int
	dir           string
	seeds, token  string
	jmxPort       int  // 0: no JMX
	shortLived    bool // C1 only (scripts/cassandra.sh --short-lived)
}

func (s nodeSpec) args() []string {
	a := []string{"run", "--dir", s.dir, "--addr", s.addr, "--port", strconv.Itoa(s.port),
		"--storage-port", strconv.Itoa(s.storage)}
	if s.seeds != "" {
		a = append(a, "--seeds", s.seeds)
	}
	if s.token != "" {
		a = append(a, "--token", s.token)
	}
	if s.jmxPort != 0 {
		a = append(a, "--jmx-port", strconv.Itoa(s.jmxPort))
	}
	if s.shortLived {
		a = append(a, "--short-lived")
	}
	return a
}

// Hosts returns the node's address for the driver.
func (n *Node) Hosts() []string { return []string{net.JoinHostPort(n.Addr, strconv.Itoa(n.Port))} }

// ErrNoJava says no Java 17 runtime was found.
var ErrNoJava = errors.New("no Java 17 (Debian package openjdk-17-jre-headless)")

// script returns scripts/cassandra.sh of the repository the tests run in.
func script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "scripts", "cassandra.sh")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("scripts/cassandra.sh not found above the working directory")
		}
		dir = up
	}
}

// freeAddr picks a loopback address 127.0.0.100-249 (the cluster of make
// cassandra-3 has .2-.4, other tests .1) and two ports free on it.
func freeAddr() (addr string, port, storage int, err error) {
	addr = fmt.Sprintf("127.0.0.%d", 100+rand.IntN(150))
	var ports [2]int
	for i := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			return "", 0, 0, err
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		defer l.Close()
	}
	return addr, ports[0], ports[1], nil
}

// prepare finds scripts/cassandra.sh, checks for a Java 17 and fetches
// Cassandra's jars if they are not cached yet.
func prepare() (string, error) {
	sh, err := script()
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("bash", sh, "java").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: %s", ErrNoJava, bytes.TrimSpace(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "bash", sh, "fetch").CombinedOutput(); err != nil {
		return "", fmt.Errorf("fetch Cassandra's jars: %v: %s", err, lastLines(out, 20))
	}
	return sh, nil
}

// Start fetches the jars if needed and starts a node in a new temporary
// directory; it returns once CQL answers.
func Start() (*Node, error) {
	sh, err := prepare()
	if err != nil {
		return nil, err
	}
	var last error
	for range startAttempts {
		n, err := start(sh)
		if err == nil {
			return n, nil
		}
		last = err
	}
	return nil, last
}

func start(sh string) (*Node, error) {
	addr, port, storage, err := freeAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "quill-cassandra-")
	if err != nil {
		return nil, err
	}
	n := &Node{Addr: addr, Port: port, Dir: dir, sh: sh,
		spec: nodeSpec{addr: addr, port: port, storage: storage, dir: dir, shortLived: true}}
	if err := n.launch(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return n, nil
}

// launch starts the node's JVM and waits until CQL answers; on failure
// the process is gone (its directory stays).
func (n *Node) launch() error {
	if err := os.MkdirAll(filepath.Join(n.Dir, "logs"), 0o755); err != nil {
		return err
	}
	// Appended: a restarted node's log follows the one before.
	out, err := os.OpenFile(filepath.Join(n.Dir, "logs", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	began := time.Now()
	cmd := exec.Command("bash", append([]string{n.sh}, n.spec.args()...)...)
	cmd.Stdout, cmd.Stderr = out, out
	// The script execs the JVM, so this is the node's PID, and the node
	// dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start Cassandra: %w", err)
	}
	n.cmd, n.PID, n.exited = cmd, cmd.Process.Pid, make(chan struct{})
	exited := n.exited
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("Cassandra on %s:%d exited during its start:\n%s", n.Addr, n.Port, n.logTail())
		case <-time.After(pollEvery):
		}
		if v, err := n.answer(); err == nil {
			n.Version, n.Took = v, time.Since(began)
			return nil
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("Cassandra on %s:%d: CQL did not answer within %s:\n%s", n.Addr, n.Port, startTimeout, n.logTail())
			n.Kill()
			return err
		}
	}
}

// answer asks the node its version over CQL.
func (n *Node) answer() (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(n.Addr, strconv.Itoa(n.Port)), time.Second)
	if err != nil {
		return "", err
	}
	c.Close()
	cl := gocql.NewCluster(n.Hosts()...)
	cl.Consistency = gocql.One
	cl.Timeout, cl.ConnectTimeout = 5*time.Second, 5*time.Second
	s, err := cl.CreateSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	var v string
	err = s.Query("SELECT release_version FROM system.local").Scan(&v)
	return v, err
}

func (n *Node) logTail() string {
	var b strings.Builder
	for _, f := range []string{"stdout.log", "system.log"} {
		data, _ := os.ReadFile(filepath.Join(n.Dir, "logs", f))
		fmt.Fprintf(&b, "--- %s\n%s\n", f, lastLines(data, 25))
	}
	return b.String()
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop kills the node by its PID and removes its directory: its data is
// the test's and nothing needs a drain.
func (n *Node) Stop() {
	n.Kill()
	os.RemoveAll(n.Dir)
}

// Kill sends SIGKILL to the node's PID (kill -9: no drain, no flush) and
// waits until it is gone; its directory stays for a Restart.
func (n *Node) Kill() {
	select {
	case <-n.exited: // gone already: its PID may be another process's now
		return
	default:
	}
	syscall.Kill(n.PID, syscall.SIGKILL)
	<-n.exited
}

// Restart starts a killed node again on its directory, addresses and
// token, and returns once CQL answers.
func (n *Node) Restart() error { return n.launch() }

// The package's node, set by Main.
var (
	shared   *Node
	external []string
	skipWhy  string
)

// Main starts the package's node (unless QUILL_CASSANDRA_HOSTS names a
// cluster), runs the tests and stops it. Use it in TestMain.
func Main(m *testing.M) int {
	if h := os.Getenv("QUILL_CASSANDRA_HOSTS"); h != "" {
		external = strings.Split(h, ",")
		return m.Run()
	}
	n, err := Start()
	switch {
	case err == nil:
		shared = n
		fmt.Fprintf(os.Stderr, "cassandratest: Cassandra %s on %s:%d (pid %d) answered after %s\n",
			n.Version, n.Addr, n.Port, n.PID, n.Took.Round(100*time.Millisecond))
		defer n.Stop()
	case errors.Is(err, ErrNoJava) && os.Getenv("CI") != "true":
		skipWhy = err.Error()
	default:
		fmt.Fprintf(os.Stderr, "cassandratest: %v\n", err)
		return 1
	}
	return m.Run()
}

// Hosts returns the hosts of the package's Cassandra, or skips the test
// when there is none (no Java, outside CI).
func Hosts(tb testing.TB) []string {
	tb.Helper()
	switch {
	case external != nil:
		return external
	case shared != nil:
		return shared.Hosts()
	case skipWhy != "":
		tb.Skip("no Cassandra: " + skipWhy)
	default:
		tb.Fatal("cassandratest: call cassandratest.Main from TestMain")
	}
	return nil
}
