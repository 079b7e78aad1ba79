package cluster_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// textExcluded reads the node's quill_text_index_excluded_total: the
// messages its text index ruled out of searches, for sessions on any node.
func (n *Node) textExcluded() (float64, error) { return n.metric("quill_text_index_excluded_total") }

// metric reads one unlabelled series from the node's /metrics.
func (n *Node) metric(name string) (float64, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+n.HTTP+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+n.token)
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s in /metrics", n.ID, name)
}

// searcher is a session with the user's INBOX selected through a node.
type searcher struct {
	n *Node
	c *rawIMAP
}

func searchVia(n *Node, user, pw string) (*searcher, error) {
	c, err := dialRawIMAP(n, user, pw)
	if err != nil {
		return nil, err
	}
	if _, err := c.cmd("SELECT INBOX"); err != nil {
		c.conn.Close()
		return nil, err
	}
	return &searcher{n: n, c: c}, nil
}

// search runs UID SEARCH and returns its SEARCH response.
func (s *searcher) search(criteria string) (string, error) {
	lines, err := s.c.cmd("UID SEARCH " + criteria)
	if err != nil {
		return "", err
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "* SEARCH") {
			return l, nil
		}
	}
	return "", fmt.Errorf("UID SEARCH %s through %s: no SEARCH response in %q", criteria, s.n.ID, lines)
}

// searchOnce runs one search in a session of its own.
func searchOnce(n *Node, user, pw, criteria string) error {
	s, err := searchVia(n, user, pw)
	if err != nil {
		return err
	}
	defer s.c.conn.Close()
	_, err = s.search(criteria)
	return err
}

// The text index answers across nodes and survives kill -9: a search
// through one node is narrowed by the other nodes' indexes (and its
// SUBJECT matches proven by them), gives what reading every message gives
// (the same key inside OR alone is neither narrowed nor proven),
// and after a node is killed while it indexes and restarted, it indexes
// what it had queued and answers again.
func TestTextIndexAcrossNodesAndKill(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user, pw = "search@cluster.example", "pw"
	nodes[0].addUser(t, user, pw)
	const first, more = 90, 60
	send := func(from, to int) {
		for i := from; i < to; i++ {
			if err := nodes[i%3].sendBody(user, fmt.Sprintf("m%d", i), fmt.Sprintf("common text and word%dx\r\n", i)); err != nil {
				fatalf(t, "deliver %d: %v", i, err)
			}
		}
	}
	// check searches for every message's own word through n, and
	// compares with the same key read in full (inside OR).
	check := func(n *Node, count int) {
		t.Helper()
		s, err := searchVia(n, user, pw)
		if err != nil {
			fatalf(t, "%v", err)
		}
		defer s.c.conn.Close()
		// same returns how many messages key matches, after checking
		// that it is what the key read in full gives.
		same := func(key string) int {
			got, err := s.search(key)
			if err != nil {
				fatalf(t, "%v", err)
			}
			want, err := s.search("OR " + key + " " + key)
			if err != nil {
				fatalf(t, "%v", err)
			}
			if got != want {
				fatalf(t, "through %s, %s gives %q; read in full %q", n.ID, key, got, want)
			}
			return len(strings.Fields(got)) - 2
		}
		for i := 0; i < count; i++ {
			if key := fmt.Sprintf("BODY word%dx", i); same(key) != 1 {
				fatalf(t, "through %s, %s does not give one message", n.ID, key)
			}
		}
		// SUBJECT is proven from the index, not read: "m1" is the
		// subject of m1 and a part of m10..m19 and m100...
		for i := 1; i < count; i += 7 {
			if key := fmt.Sprintf("SUBJECT m%d", i); same(key) == 0 {
				fatalf(t, "through %s, %s gives nothing", n.ID, key)
			}
		}
	}
	send(0, first)
	remote := func(via *Node) float64 {
		sum := 0.0
		for _, n := range without(nodes, via) {
			v, err := n.textExcluded()
			if err == nil {
				sum += v
			}
		}
		return sum
	}
	before := remote(nodes[0])
	waitFor(t, "other nodes' indexes to narrow a search through node 0", 60*time.Second, func() bool {
		if err := searchOnce(nodes[0], user, pw, "BODY word7x"); err != nil {
			return false
		}
		return remote(nodes[0]) > before
	})
	sureBefore := 0.0
	for _, n := range nodes {
		v, _ := n.metric("quill_text_index_sure_total")
		sureBefore += v
	}
	check(nodes[0], first)
	sureAfter := 0.0
	for _, n := range nodes {
		v, _ := n.metric("quill_text_index_sure_total")
		sureAfter += v
	}
	if sureAfter == sureBefore {
		errorf(t, "no node's text index proved a SUBJECT match (quill_text_index_sure_total stayed %v)", sureAfter)
	}

	// Kill a node whose index answered, while it indexes what just
	// arrived, and bring it back.
	var victim *Node
	for _, n := range nodes[1:] {
		if v, err := n.textExcluded(); err == nil && v > 0 {
			victim = n
		}
	}
	send(first, first+more)
	victim.Kill9()
	victim.Restart()
	waitFor(t, "the node to come back", 60*time.Second, func() bool { return ready(nodes) })
	v0, _ := victim.textExcluded()
	waitFor(t, "the restarted node's index to narrow a search through node 0", 60*time.Second, func() bool {
		if err := searchOnce(nodes[0], user, pw, fmt.Sprintf("BODY word%dx", first+more-1)); err != nil {
			return false
		}
		v, err := victim.textExcluded()
		return err == nil && v > v0
	})
	for _, n := range nodes {
		check(n, first+more)
	}
}
