package cluster_test

// The spread and the mail map (Porcupine §3.3, §5) on three real nodes: a
// user's mail stays on at most its spread of nodes, the mail map names
// exactly the nodes holding the user's mail, and a node whose fragment
// empties leaves the map while a delivery that lands there meanwhile keeps
// it in.

import (
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// shownUser is GET /api/users/{address}.
type shownUser struct {
	Spread  int      `json:"spread"`
	MailMap []string `json:"mail_map"`
	Holders []string `json:"holders"`
}

func (n *Node) showUser(t *testing.T, addr string) shownUser {
	t.Helper()
	var u shownUser
	if err := n.get("/api/users/"+addr, &u); err != nil {
		fatalf(t, "show %s: %v", addr, err)
	}
	return u
}

// waitMailMap waits until the user's mail map, as every node's admin API
// shows it, is the set of nodes holding its mail and has want nodes.
func waitMailMap(t *testing.T, nodes []*Node, addr string, want int) shownUser {
	t.Helper()
	var last shownUser
	waitFor(t, fmt.Sprintf("the mail map of %s to be its %d holder(s)", addr, want), 20*time.Second, func() bool {
		for _, n := range nodes {
			var u shownUser
			if err := n.get("/api/users/"+addr, &u); err != nil {
				return false
			}
			last = u
			if len(u.Holders) != want || !slices.Equal(u.MailMap, u.Holders) {
				return false
			}
		}
		return true
	})
	return last
}

// pop3DeleteAll deletes, in one POP3 session through n, every message the
// maildrop has when it opens; during calls before QUIT.
func (n *Node) pop3DeleteAll(t *testing.T, user, pw string, during func()) int {
	t.Helper()
	c, err := n.pop3Login(user, pw, 6*ioTimeout)
	if err != nil {
		fatalf(t, "pop3 login %s: %v", user, err)
	}
	st, err := c.cmd("STAT")
	if err != nil {
		fatalf(t, "STAT: %v", err)
	}
	var count int
	fmt.Sscanf(st, "+OK %d", &count)
	for i := 1; i <= count; i++ {
		if _, err := c.cmd(fmt.Sprintf("DELE %d", i)); err != nil {
			fatalf(t, "DELE %d: %v", i, err)
		}
	}
	if during != nil {
		during()
	}
	if _, err := c.cmd("QUIT"); err != nil {
		fatalf(t, "QUIT: %v", err)
	}
	c.conn.Close()
	return count
}

func TestSpreadAndMailMapFollowTheFragments(t *testing.T) {
	nodes := startClusterWith(t, 3, "--spread", "1", "--replicas", "1")
	const pw = "pw-spread"
	one, two := "spread1@cluster.example", "spread2@cluster.example"
	nodes[0].addUser(t, one, pw)
	if err := nodes[1].api(http.MethodPost, "/api/users", map[string]any{"address": two, "password": pw, "spread": 2}, nil); err != nil {
		fatalf(t, "add %s with spread 2: %v", two, err)
	}
	if s := nodes[2].showUser(t, two).Spread; s != 2 {
		fatalf(t, "%s shows spread %d, want 2", two, s)
	}
	// Through every node, so every node's proxy places mail.
	for i := 0; i < 24; i++ {
		for _, u := range []string{one, two} {
			if err := nodes[i%3].send(u, fmt.Sprintf("m%d", i)); err != nil {
				fatalf(t, "send to %s through %s: %v", u, nodes[i%3].ID, err)
			}
		}
	}
	// With one replica a message is on one node: spread 1 keeps the
	// user's 24 on one node, spread 2 on at most two (random placement
	// would use all three).
	first := waitMailMap(t, nodes, one, 1)
	u2 := nodes[0].showUser(t, two)
	if len(u2.Holders) > 2 || !slices.Equal(u2.MailMap, u2.Holders) {
		fatalf(t, "%s with spread 2: holders %v, mail map %v", two, u2.Holders, u2.MailMap)
	}
	t.Logf("%s on %v; %s on %v", one, first.Holders, two, u2.Holders)

	// A delivery that lands on the node while its last messages are being
	// deleted (spread 1: it goes to the only node of the map) keeps the
	// node in the map.
	deleted := nodes[1].pop3DeleteAll(t, one, pw, func() {
		if err := nodes[2].send(one, "during"); err != nil {
			fatalf(t, "send during the POP3 session: %v", err)
		}
	})
	if deleted != 24 {
		fatalf(t, "POP3 deleted %d messages, want 24", deleted)
	}
	during := waitMailMap(t, nodes, one, 1)
	if !slices.Equal(during.Holders, first.Holders) {
		fatalf(t, "the message sent during the session is on %v, want %v (spread 1)", during.Holders, first.Holders)
	}
	if ok, err := nodes[0].pop3Has(one, pw, "during"); err != nil || !ok {
		fatalf(t, "the message sent during the session not read through %s: %v %v", nodes[0].ID, ok, err)
	}

	// Its last message deleted, the node leaves the map.
	if n := nodes[0].pop3DeleteAll(t, one, pw, nil); n != 1 {
		fatalf(t, "second POP3 session deleted %d messages, want 1", n)
	}
	waitMailMap(t, nodes, one, 0)

	// New mail still reaches the user, wherever the balancer puts it now,
	// and the map names that node.
	if err := nodes[0].send(one, "after"); err != nil {
		fatalf(t, "send after: %v", err)
	}
	after := waitMailMap(t, nodes, one, 1)
	for _, n := range nodes {
		if ok, err := n.pop3Has(one, pw, "after"); err != nil || !ok {
			fatalf(t, "the message sent after not read through %s: %v %v", n.ID, ok, err)
		}
	}
	t.Logf("%s: after the deletes, new mail on %v", one, after.Holders)

	// quill user show and list, over the admin API.
	out, err := exec.Command(quillBin, "user", "show", two, "--server", "http://"+nodes[2].HTTP, "--token", nodes[2].token).CombinedOutput()
	if err != nil {
		fatalf(t, "quill user show: %v\n%s", err, out)
	}
	shown := strings.Join(strings.Fields(string(out)), " ")
	for _, want := range []string{"spread 2", "mail map " + strings.Join(u2.MailMap, " ") + " holding mail"} {
		if !strings.Contains(shown, want) {
			errorf(t, "quill user show lacks %q:\n%s", want, out)
		}
	}
	out, err = exec.Command(quillBin, "user", "list", "--server", "http://"+nodes[0].HTTP, "--token", nodes[0].token).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SPREAD") {
		errorf(t, "quill user list: %v\n%s", err, out)
	}
}
