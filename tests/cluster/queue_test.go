package cluster_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/smtp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/dnstest"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/sns"
)

// remoteDomain is the other domain the queue tests send to: its MX is
// 127.0.0.1, where the test's receiving server listens.
const remoteDomain = "remote.test"

// startDNS answers MX queries for remoteDomain with mx.remoteDomain and A
// queries for that with 127.0.0.1; it returns the address for --dns.
func startDNS(t *testing.T) string {
	addr, _ := dnstest.Serve(t, dnstest.Zone{MX: map[string]string{remoteDomain: "mx." + remoteDomain},
		A: map[string]string{"mx." + remoteDomain: "127.0.0.1"}})
	return addr
}

// sink is the receiving server of remoteDomain: go-smtp, keeping each
// message it is given.
type sink struct {
	mu   sync.Mutex
	got  [][]byte
	srv  *gosmtp.Server
	addr string
	// hold, if set, keeps every DATA waiting until it is closed.
	hold chan struct{}
	// inData counts DATA commands begun.
	inData int
}

func (s *sink) NewSession(*gosmtp.Conn) (gosmtp.Session, error) { return &sinkSession{s: s}, nil }

type sinkSession struct{ s *sink }

func (ss *sinkSession) Mail(string, *gosmtp.MailOptions) error { return nil }
func (ss *sinkSession) Rcpt(string, *gosmtp.RcptOptions) error { return nil }
func (ss *sinkSession) Reset()                                 {}
func (ss *sinkSession) Logout() error                          { return nil }
func (ss *sinkSession) Data(r io.Reader) error {
	ss.s.mu.Lock()
	ss.s.inData++
	hold := ss.s.hold
	ss.s.mu.Unlock()
	if hold != nil {
		<-hold
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	ss.s.mu.Lock()
	ss.s.got = append(ss.s.got, b)
	ss.s.mu.Unlock()
	return nil
}

func (s *sink) count(marker string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.got {
		if bytes.Contains(b, []byte(marker)) {
			n++
		}
	}
	return n
}

// serve starts the sink on addr (reserved by the caller).
func (s *sink) serve(t *testing.T) {
	s.srv = gosmtp.NewServer(s)
	s.srv.Domain = "mx." + remoteDomain
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	go s.srv.Serve(l)
	t.Cleanup(func() { s.srv.Close() })
}

// queueListing reads the cluster's queue through a node.
func (n *Node) queueListing() (queue.Listing, error) {
	var l queue.Listing
	err := n.get("/api/queue", &l)
	return l, err
}

// TestQueueSurvivesTheDeliveringNodesDeath: a message submitted for another
// domain whose server is down is queued on 2 replicas; the node leading
// its delivery is killed with SIGKILL; once the server is up, the other
// replica delivers it, and when the killed node comes back the queue is
// empty on every node (issue 12, item 2).
func TestQueueSurvivesTheDeliveringNodesDeath(t *testing.T) {
	dnsAddr := startDNS(t)
	sk := &sink{addr: freeAddr(t)}
	_, port, _ := net.SplitHostPort(sk.addr)
	nodes := startClusterWith(t, 3, "--replicas", "2", "--dns", dnsAddr, "--outbound-port", port, "--queue-retry", "1s",
		"--submission", "127.0.0.1:0")
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user = "sender@queue.test"
	nodes[0].createUser(t, user, "pw")

	marker := fmt.Sprintf("queue-test-%d", time.Now().UnixNano())
	msg := fmt.Sprintf("From: %s\r\nTo: bob@%s\r\nSubject: %s\r\n\r\nqueued body\r\n", user, remoteDomain, marker)
	if err := submit(nodes[0].Addrs["submission"], user, "pw", []string{"bob@" + remoteDomain}, msg); err != nil {
		fatalf(t, "submit through %s: %v", nodes[0].ID, err)
	}

	// The server is down: the entry waits on its two replicas with a
	// failed attempt.
	var entry *queue.Entry
	waitFor(t, "a failed attempt in the queue", 30*time.Second, func() bool {
		l, err := nodes[1].queueListing()
		if err != nil || len(l.Entries) != 1 || l.Entries[0].Recipients[0].Attempts == 0 {
			return false
		}
		entry = l.Entries[0]
		return true
	})
	if len(entry.Replicas) != 2 {
		fatalf(t, "entry on %v, want 2 replicas", entry.Replicas)
	}
	leader := slices.Min(entry.Replicas)
	var victim *Node
	var rest []*Node
	for _, n := range nodes {
		if string(leader) == n.ID {
			victim = n
		} else {
			rest = append(rest, n)
		}
	}
	if victim == nil {
		fatalf(t, "leader %s is no node of %v", leader, entry.Replicas)
	}
	t.Logf("entry %s on %v; killing its leader %s", entry.ID, entry.Replicas, victim.ID)
	victim.Kill9()
	sk.serve(t)

	took := waitFor(t, "the other replica to deliver", 60*time.Second, func() bool { return sk.count(marker) > 0 })
	t.Logf("delivered %v after the kill", took.Round(100*time.Millisecond))
	waitFor(t, "an empty queue on the survivors", 30*time.Second, func() bool {
		l, err := rest[0].queueListing()
		return err == nil && len(l.Entries) == 0
	})

	victim.Restart()
	waitFor(t, "every node to agree", 30*time.Second, func() bool { return agree(nodes, nodes) })
	waitFor(t, "an empty queue on the node that came back", 30*time.Second, func() bool {
		l, err := victim.queueListing()
		return err == nil && len(l.Entries) == 0 && len(l.Unreachable) == 0
	})
	time.Sleep(3 * time.Second) // past the runner's hold-off: a stale copy would be delivered now
	if n := sk.count(marker); n != 1 {
		errorf(t, "delivered %d times, want once (the node that came back had the old state)", n)
	}
}

// submit sends msg through a submission listener: STARTTLS (the node's
// self-signed certificate), AUTH PLAIN, one transaction.
func submit(addr, user, pw string, rcpts []string, msg string) error {
	c, err := smtp.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.StartTLS(&tls.Config{InsecureSkipVerify: true}); err != nil {
		return fmt.Errorf("STARTTLS: %w", err)
	}
	if err := c.Auth(smtp.PlainAuth("", user, pw, "127.0.0.1")); err != nil {
		return fmt.Errorf("AUTH: %w", err)
	}
	if err := c.Mail(user); err != nil {
		return err
	}
	for _, r := range rcpts {
		if err := c.Rcpt(r); err != nil {
			return err
		}
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, msg); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return c.Quit()
}

// TestSendingLimitCountsEveryNode: a user's hourly submission limit counts
// what they submitted through every node (each message is gossiped as a
// notice), so spreading sessions over the cluster does not multiply it.
func TestSendingLimitCountsEveryNode(t *testing.T) {
	nodes := startClusterWith(t, 2, "--submission", "127.0.0.1:0", "--submit-max-per-hour", "2")
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user = "limited@queue.test"
	nodes[0].createUser(t, user, "pw")
	msg := "From: " + user + "\r\nSubject: x\r\n\r\nx\r\n"
	for i, n := range nodes {
		if err := submit(n.Addrs["submission"], user, "pw", []string{user}, msg); err != nil {
			fatalf(t, "message %d through %s: %v", i, n.ID, err)
		}
	}
	// A gossip round or two carries the notice (node 0 alone has seen one
	// message: without it, a third would pass there).
	time.Sleep(2 * time.Second)
	err := submit(nodes[0].Addrs["submission"], user, "pw", []string{user}, msg)
	if err == nil || !strings.Contains(err.Error(), "451") || !strings.Contains(err.Error(), "limit is 2") {
		errorf(t, "third message through %s: %v, want 451 with the limit", nodes[0].ID, err)
	}
}

// outbound submits uniquely numbered messages for remoteDomain through
// random live nodes of a fault stream, and remembers which were
// acknowledged (250 after DATA): each of those must reach the sink.
type outbound struct {
	mu      sync.Mutex
	acked   []string
	tried   int
	stop    chan struct{}
	done    chan struct{}
	prefix  string
	sink    *sink
	user    string
	between time.Duration
}

// outboundEvery is the pace of the outbound stream: a few messages a
// second beside the inbound stream's hundreds.
const outboundEvery = 250 * time.Millisecond

func startOutbound(s *stream, sk *sink, user string) *outbound {
	o := &outbound{stop: make(chan struct{}), done: make(chan struct{}), prefix: fmt.Sprintf("out-%d-", time.Now().UnixNano()),
		sink: sk, user: user, between: outboundEvery}
	go func() {
		defer close(o.done)
		for i := 0; ; i++ {
			select {
			case <-o.stop:
				return
			case <-time.After(o.between):
			}
			up := s.up()
			if len(up) == 0 {
				continue
			}
			n := up[i%len(up)]
			marker := fmt.Sprintf("%s%d", o.prefix, i)
			msg := fmt.Sprintf("From: %s\r\nTo: bob@%s\r\nSubject: %s\r\n\r\noutbound %d\r\n", user, remoteDomain, marker, i)
			err := submit(n.Addrs["submission"], user, "pw", []string{"bob@" + remoteDomain}, msg)
			o.mu.Lock()
			o.tried++
			if err == nil {
				o.acked = append(o.acked, marker)
			}
			o.mu.Unlock()
		}
	}()
	return o
}

// finish stops the stream and waits until every acknowledged message has
// reached the sink, or limit has passed; it returns the tried, acknowledged
// and missing counts and the duplicates the sink got.
func (o *outbound) finish(limit time.Duration) (tried, acked, missing, dups int) {
	close(o.stop)
	<-o.done
	o.mu.Lock()
	markers := slices.Clone(o.acked)
	tried = o.tried
	o.mu.Unlock()
	deadline := time.Now().Add(limit)
	for {
		missing, dups = 0, 0
		for _, m := range markers {
			switch c := o.sink.count(m + "\r\n"); {
			case c == 0:
				missing++
			case c > 1:
				dups += c - 1
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			return tried, len(markers), missing, dups
		}
		time.Sleep(time.Second)
	}
}

// TestRelayWorkerKilledMidDelivery: the delivery runs in an SNS relay
// worker; killed with SIGKILL while the remote server holds its DATA, the
// worker is restarted by its node within 2 s, and the message still
// arrives (the task failed for now and the queue tried it again).
func TestRelayWorkerKilledMidDelivery(t *testing.T) {
	sk := &sink{addr: freeAddr(t), hold: make(chan struct{})}
	sk.serve(t)
	_, port, _ := net.SplitHostPort(sk.addr)
	nodes := startClusterWith(t, 1, "--dns", startDNS(t), "--outbound-port", port, "--queue-retry", "1s",
		"--submission", "127.0.0.1:0", "--relay-workers", "2")
	n := nodes[0]
	const user = "sender@queue.test"
	n.createUser(t, user, "pw")
	marker := fmt.Sprintf("sns-test-%d", time.Now().UnixNano())
	if err := submit(n.Addrs["submission"], user, "pw", []string{"bob@" + remoteDomain},
		"From: "+user+"\r\nSubject: "+marker+"\r\n\r\nx\r\n"); err != nil {
		fatalf(t, "submit: %v", err)
	}
	waitFor(t, "the remote server to hold the DATA", 30*time.Second, func() bool {
		sk.mu.Lock()
		defer sk.mu.Unlock()
		return sk.inData > 0
	})
	pool := func() sns.Status { return poolOf(n, sns.RelayClass) }
	st := pool()
	if len(st.Workers) == 0 || st.Workers[0].PID == 0 {
		fatalf(t, "relay pool %+v, want a relay worker running", st)
	}
	victim := st.Workers[0]
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		fatalf(t, "kill worker %d: %v", victim.PID, err)
	}
	took := waitFor(t, "the worker to be restarted", 10*time.Second, func() bool {
		for _, w := range pool().Workers {
			if w.ID == victim.ID && w.Alive && w.PID != victim.PID {
				return true
			}
		}
		return false
	})
	t.Logf("worker %d (pid %d) restarted %v after SIGKILL", victim.ID, victim.PID, took.Round(time.Millisecond))
	if took > 2*time.Second {
		errorf(t, "worker restarted %v after it was killed, want within 2s", took)
	}
	close(sk.hold)
	waitFor(t, "the message to arrive after the restart", 30*time.Second, func() bool { return sk.count(marker) > 0 })
	if st := pool(); st.Restarts < 1 {
		errorf(t, "pool counts %d restarts", st.Restarts)
	}
}

// TestQueueEntryRehomedAfterAWipe: a queue entry on 2 replicas loses one
// to a wiped disk; repair gives it a new replica (the queue's own Rehome,
// through the same log and repair as mail), and when the remote server is
// up the entry is delivered once.
func TestQueueEntryRehomedAfterAWipe(t *testing.T) {
	dnsAddr := startDNS(t)
	sk := &sink{addr: freeAddr(t)}
	_, port, _ := net.SplitHostPort(sk.addr)
	nodes := startClusterWith(t, 3, "--replicas", "2", "--dns", dnsAddr, "--outbound-port", port, "--queue-retry", "1s",
		"--submission", "127.0.0.1:0", "--replace-after", "5s")
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user = "rehome@queue.test"
	nodes[0].createUser(t, user, "pw")
	marker := fmt.Sprintf("rehome-test-%d", time.Now().UnixNano())
	msg := fmt.Sprintf("From: %s\r\nTo: bob@%s\r\nSubject: %s\r\n\r\nbody\r\n", user, remoteDomain, marker)
	if err := submit(nodes[0].Addrs["submission"], user, "pw", []string{"bob@" + remoteDomain}, msg); err != nil {
		fatalf(t, "submit through %s: %v", nodes[0].ID, err)
	}
	var entry *queue.Entry
	waitFor(t, "a failed attempt in the queue", 30*time.Second, func() bool {
		l, err := nodes[1].queueListing()
		if err != nil || len(l.Entries) != 1 || l.Entries[0].Recipients[0].Attempts == 0 {
			return false
		}
		entry = l.Entries[0]
		return true
	})
	if len(entry.Replicas) != 2 {
		fatalf(t, "entry on %v, want 2 replicas", entry.Replicas)
	}
	var victim *Node
	for _, n := range nodes {
		if slices.Contains(entry.Replicas, cluster.NodeID(n.ID)) {
			victim = n
		}
	}
	old := victim.ID
	t.Logf("entry %s on %v; wiping %s", entry.ID, entry.Replicas, old)
	wipe(t, victim)
	took := waitFor(t, "the entry on 2 live replicas without the wiped node", 90*time.Second, func() bool {
		l, err := nodes[0].queueListing()
		if err != nil || len(l.Entries) != 1 {
			return false
		}
		e := l.Entries[0]
		if len(e.Replicas) != 2 || slices.Contains(e.Replicas, cluster.NodeID(old)) {
			return false
		}
		for _, r := range e.Replicas {
			if !slices.ContainsFunc(nodes, func(n *Node) bool { return n.ID == string(r) }) {
				return false
			}
		}
		entry = e
		return true
	})
	t.Logf("rehomed to %v %v after the wipe", entry.Replicas, took.Round(100*time.Millisecond))
	if entry.Recipients[0].Attempts == 0 {
		errorf(t, "the rehomed entry lost its recipient's state: %+v", entry.Recipients[0])
	}
	sk.serve(t)
	waitFor(t, "delivery once the server is up", 60*time.Second, func() bool { return sk.count(marker) > 0 })
	waitFor(t, "an empty queue", 30*time.Second, func() bool {
		for _, n := range nodes {
			if l, err := n.queueListing(); err != nil || len(l.Entries) != 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(3 * time.Second)
	if n := sk.count(marker); n != 1 {
		errorf(t, "delivered %d times, want once", n)
	}
}
