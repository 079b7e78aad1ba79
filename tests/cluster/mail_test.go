package cluster_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// ioTimeout bounds every client operation in these tests.
const ioTimeout = 10 * time.Second

// serveDomain adds the domain of addr through the node unless the node
// serves it already (a user is added only in a served domain).
func (n *Node) serveDomain(t *testing.T, addr string) {
	t.Helper()
	dom := addr[strings.LastIndexByte(addr, '@')+1:]
	err := n.api(http.MethodPost, "/api/domains", map[string]string{"name": dom}, nil)
	if err != nil && !strings.Contains(err.Error(), "409") {
		fatalf(t, "add domain %s through %s: %v", dom, n.ID, err)
	}
}

func (n *Node) addUser(t *testing.T, addr, pw string) {
	t.Helper()
	n.serveDomain(t, addr)
	body, _ := json.Marshal(map[string]string{"address": addr, "password": pw})
	c := http.Client{Timeout: 30 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, "http://"+n.HTTP+"/api/users", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+n.token)
	resp, err := c.Do(req)
	if err != nil {
		fatalf(t, "%v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		fatalf(t, "add %s through %s: %s", addr, n.ID, resp.Status)
	}
}

// addUsers adds n users prefix0@cluster.example ... with password pw
// through the node and returns their addresses.
func (n *Node) addUsers(t *testing.T, prefix string, count int, pw string) []string {
	t.Helper()
	var users []string
	for i := 0; i < count; i++ {
		u := fmt.Sprintf("%s%d@cluster.example", prefix, i)
		users = append(users, u)
		n.addUser(t, u, pw)
	}
	return users
}

// send delivers one message through the node's SMTP listener.
func (n *Node) send(rcpt, subject string) error {
	return n.sendBody(rcpt, subject, subject+"\r\n")
}

// sendBody delivers a message with the given body through the node.
func (n *Node) sendBody(rcpt, subject, body string) error {
	conn, err := net.DialTimeout("tcp", n.Addrs["smtp"], ioTimeout)
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(ioTimeout))
	c := gosmtp.NewClient(conn)
	defer c.Close()
	msg := fmt.Sprintf("From: t@test.example\r\nTo: %s\r\nSubject: %s\r\n\r\n%s", rcpt, subject, body)
	return c.SendMail("t@test.example", []string{rcpt}, strings.NewReader(msg))
}

// uidl logs in over POP3 through the node and returns the maildrop's unique
// ids.
func (n *Node) uidl(user, pw string) (map[string]bool, error) {
	c, err := n.pop3Login(user, pw, ioTimeout)
	if err != nil {
		return nil, err
	}
	defer c.quit()
	if _, err := c.cmd("UIDL"); err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	err = c.lines(func(l string) {
		if f := strings.Fields(l); len(f) == 2 {
			ids[f[1]] = true
		}
	})
	return ids, err
}

// pop3Conn is a line-level POP3 client for the tests.
type pop3Conn struct {
	n    *Node
	conn net.Conn
	r    *bufio.Reader
}

// pop3Login connects to the node's POP3 listener and logs in, with every
// read and write of the session due within d.
func (n *Node) pop3Login(user, pw string, d time.Duration) (*pop3Conn, error) {
	conn, err := net.DialTimeout("tcp", n.Addrs["pop3"], ioTimeout)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(d))
	c := &pop3Conn{n: n, conn: conn, r: bufio.NewReader(conn)}
	if _, err := c.line(); err != nil {
		conn.Close()
		return nil, err
	}
	for _, cmd := range []string{"USER " + user, "PASS " + pw} {
		if _, err := c.cmd(cmd); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return c, nil
}

// line reads one line; -ERR is an error naming the node.
func (c *pop3Conn) line() (string, error) {
	l, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	l = strings.TrimRight(l, "\r\n")
	if strings.HasPrefix(l, "-ERR") {
		return l, fmt.Errorf("pop3 on %s: %s", c.n.ID, l)
	}
	return l, nil
}

// cmd sends a command and reads its status line.
func (c *pop3Conn) cmd(s string) (string, error) {
	fmt.Fprintf(c.conn, "%s\r\n", s)
	return c.line()
}

// lines calls fn with each line of a multi-line answer up to its ".".
func (c *pop3Conn) lines(fn func(string)) error {
	for {
		l, err := c.line()
		if err != nil {
			return err
		}
		if l == "." {
			return nil
		}
		fn(l)
	}
}

// quit ends the session and closes the connection.
func (c *pop3Conn) quit() {
	fmt.Fprintf(c.conn, "QUIT\r\n")
	c.conn.Close()
}

// ready reports whether every node sees the given members and has rebuilt
// the soft state of every bucket it manages.
func ready(nodes []*Node) bool {
	if !agree(nodes, nodes) {
		return false
	}
	for _, n := range nodes {
		st, err := n.Status()
		if err != nil || st.Managed == 0 || st.Ready != st.Managed {
			return false
		}
	}
	return true
}

// Mail sent through any node is read through every node; after a SIGKILL
// every user still logs in and receives mail through the survivors, and the
// dead node's messages come back with it.
func TestMailAcrossNodesAndCrash(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	rnd := rand.New(rand.NewPCG(1, 2))
	var users []string
	for i := 0; i < 12; i++ {
		u := fmt.Sprintf("user%02d@cluster.example", i)
		users = append(users, u)
		nodes[i%3].addUser(t, u, "pw-"+u)
	}
	sent := map[string]int{}
	for i := 0; i < 60; i++ {
		u := users[rnd.IntN(len(users))]
		if err := nodes[rnd.IntN(3)].send(u, fmt.Sprintf("msg %d", i)); err != nil {
			fatalf(t, "send %d to %s: %v", i, u, err)
		}
		sent[u]++
	}
	before := map[string]map[string]bool{}
	for _, u := range users {
		for _, n := range nodes {
			ids, err := n.uidl(u, "pw-"+u)
			if err != nil {
				fatalf(t, "%s through %s: %v", u, n.ID, err)
			}
			if len(ids) != sent[u] {
				fatalf(t, "%s through %s sees %d messages, %d were sent", u, n.ID, len(ids), sent[u])
			}
			before[u] = ids
		}
	}

	victim := nodes[1]
	victim.Kill9()
	survivors := without(nodes, victim)
	took := waitFor(t, "survivors to rebuild soft state without the dead node", 60*time.Second, func() bool { return ready(survivors) })
	t.Logf("crash to new user map with rebuilt soft state on 3 nodes: %v", took)
	after := map[string]map[string]bool{}
	for i, u := range users {
		subj := fmt.Sprintf("after crash %d", i)
		if err := survivors[i%2].send(u, subj); err != nil {
			fatalf(t, "delivery to %s after the crash: %v", u, err)
		}
		for _, n := range survivors {
			ids, err := n.uidl(u, "pw-"+u)
			if err != nil {
				fatalf(t, "login of %s through %s after the crash: %v", u, n.ID, err)
			}
			after[u] = ids
		}
		if len(after[u]) == 0 {
			fatalf(t, "%s: the message delivered after the crash is not visible", u)
		}
	}
	victim.Restart()
	waitFor(t, "the node to come back with its fragments", 60*time.Second, func() bool { return ready(nodes) })
	for _, u := range users {
		ids, err := nodes[0].uidl(u, "pw-"+u)
		if err != nil {
			fatalf(t, "%v", err)
		}
		for id := range before[u] {
			if !ids[id] {
				fatalf(t, "%s: message %s stored before the crash is missing after the node returned", u, id)
			}
		}
		if len(ids) != sent[u]+1 {
			fatalf(t, "%s: %d messages after return, want %d", u, len(ids), sent[u]+1)
		}
	}
}

// A node started while mail flows takes buckets with no command, and every
// message acknowledged meanwhile can be read afterwards.
func TestNodeJoinsUnderLoad(t *testing.T) {
	nodes := startCluster(t, 2)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	var users []string
	for i := 0; i < 8; i++ {
		u := fmt.Sprintf("load%d@cluster.example", i)
		users = append(users, u)
		nodes[0].addUser(t, u, "pw")
	}
	stop := make(chan struct{})
	done := make(chan map[string]int)
	go func() {
		acked := map[string]int{}
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- acked
				return
			default:
			}
			u := users[i%len(users)]
			// Transient 4xx while buckets move are allowed (the sender
			// retries); only acknowledged messages are counted.
			if err := nodes[i%2].send(u, fmt.Sprintf("load %d", i)); err == nil {
				acked[u]++
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)
	late := StartNode(t, nodes[0].Gossip)
	all := append(nodes, late)
	waitFor(t, "the new node to take buckets and rebuild them", 30*time.Second, func() bool { return ready(all) })
	time.Sleep(time.Second)
	close(stop)
	acked := <-done
	total := 0
	for _, u := range users {
		ids, err := late.uidl(u, "pw")
		if err != nil {
			fatalf(t, "%s through the new node: %v", u, err)
		}
		if len(ids) != acked[u] {
			fatalf(t, "%s: %d messages acknowledged, %d visible through the new node", u, acked[u], len(ids))
		}
		total += acked[u]
	}
	if total < 50 {
		fatalf(t, "only %d messages acknowledged under load", total)
	}
	st, _ := late.Status()
	if st.Managed == 0 {
		fatalf(t, "the new node manages no bucket")
	}
}
