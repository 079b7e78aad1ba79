package cluster_test

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/quillmail/quill/internal/cluster"
)

// imapView logs in through the node, selects INBOX and returns UIDVALIDITY
// and, per UID, the message's subject and flags.
func (n *Node) imapView(user, pw string) (uint32, map[uint32]string, map[uint32][]imap.Flag, error) {
	c, err := imapclient.DialInsecure(n.Addrs["imap"], nil)
	if err != nil {
		return 0, nil, nil, err
	}
	defer c.Close()
	if err := c.Login(user, pw).Wait(); err != nil {
		return 0, nil, nil, fmt.Errorf("login through %s: %w", n.ID, err)
	}
	sel, err := c.Select("INBOX", nil).Wait()
	if err != nil {
		return 0, nil, nil, err
	}
	subj := map[uint32]string{}
	flags := map[uint32][]imap.Flag{}
	if sel.NumMessages > 0 {
		sec := &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader, HeaderFields: []string{"Subject"}, Peek: true}
		var all imap.SeqSet
		all.AddRange(1, 0) // 1:*
		msgs, err := c.Fetch(all, &imap.FetchOptions{UID: true, Flags: true, BodySection: []*imap.FetchItemBodySection{sec}}).Collect()
		if err != nil {
			return 0, nil, nil, err
		}
		for _, m := range msgs {
			h := strings.TrimSpace(string(m.FindBodySection(sec)))
			subj[uint32(m.UID)] = strings.TrimPrefix(h, "Subject: ")
			flags[uint32(m.UID)] = m.Flags
		}
	}
	c.Logout().Wait()
	return sel.UIDValidity, subj, flags, nil
}

// setSeen marks a message \Seen through the node.
func (n *Node) setSeen(user, pw string, uid uint32) error {
	c, err := imapclient.DialInsecure(n.Addrs["imap"], nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Login(user, pw).Wait(); err != nil {
		return err
	}
	if _, err := c.Select("INBOX", nil).Wait(); err != nil {
		return err
	}
	_, err = c.Store(imap.UIDSetNum(imap.UID(uid)), &imap.StoreFlags{Op: imap.StoreFlagsAdd, Flags: []imap.Flag{imap.FlagSeen}}, nil).Collect()
	c.Logout().Wait()
	return err
}

// IMAP across nodes (BLUEPRINT invariant 5): every node shows one mailbox
// with the same UIDs; flags set through one node are seen through another;
// after the user's manager (the mailbox's writer) is killed, new mail gets
// UIDs above every UID seen before, and no UID ever names two messages.
func TestIMAPAcrossNodesAndWriterCrash(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user, pw = "imap@cluster.example", "pw"
	nodes[0].addUser(t, user, pw)
	seen := map[uint32]string{} // every UID -> subject any session ever saw
	var validity uint32
	check := func(n *Node, want int) map[uint32]string {
		t.Helper()
		v, subj, _, err := n.imapView(user, pw)
		if err != nil {
			fatalf(t, "IMAP through %s: %v", n.ID, err)
		}
		if validity == 0 {
			validity = v
		} else if v != validity {
			fatalf(t, "UIDVALIDITY through %s is %d, was %d", n.ID, v, validity)
		}
		for uid, s := range subj {
			if old, ok := seen[uid]; ok && old != s {
				fatalf(t, "UID %d named %q and now %q", uid, old, s)
			}
			seen[uid] = s
		}
		if want >= 0 && len(subj) != want {
			fatalf(t, "IMAP through %s shows %d messages, want %d", n.ID, len(subj), want)
		}
		return subj
	}
	for i := 0; i < 12; i++ {
		if err := nodes[i%3].send(user, fmt.Sprintf("before %02d", i)); err != nil {
			fatalf(t, "%v", err)
		}
	}
	var first map[uint32]string
	for _, n := range nodes {
		v := check(n, 12)
		if first == nil {
			first = v
		}
	}
	// UIDs follow delivery order.
	var maxBefore uint32
	for uid := range first {
		maxBefore = max(maxBefore, uid)
	}
	if first[maxBefore] != "before 11" {
		fatalf(t, "highest UID %d holds %q, want the last delivery", maxBefore, first[maxBefore])
	}
	// A flag set through node 0 is seen through node 2.
	if err := nodes[0].setSeen(user, pw, maxBefore); err != nil {
		fatalf(t, "%v", err)
	}
	_, _, flags, err := nodes[2].imapView(user, pw)
	if err != nil {
		fatalf(t, "%v", err)
	}
	if !hasSeen(flags[maxBefore]) {
		fatalf(t, "\\Seen set through one node not seen through another: %v", flags[maxBefore])
	}

	// Kill the user's manager: its writer goes with it.
	st, _ := nodes[0].Status()
	mgr := string(st.Buckets[cluster.Bucket(user)].Node)
	var victim *Node
	for _, n := range nodes {
		if n.ID == mgr {
			victim = n
		}
	}
	victim.Kill9()
	survivors := without(nodes, victim)
	waitFor(t, "survivors to rebuild soft state", 60*time.Second, func() bool { return ready(survivors) })
	for i := 0; i < 6; i++ {
		if err := survivors[i%2].send(user, fmt.Sprintf("after %02d", i)); err != nil {
			fatalf(t, "delivery after the writer's node died: %v", err)
		}
	}
	for _, n := range survivors {
		subj := check(n, -1)
		for uid, s := range subj {
			if strings.HasPrefix(s, "after") && uid <= maxBefore {
				fatalf(t, "message %q got UID %d, not above %d seen before the crash", s, uid, maxBefore)
			}
		}
	}
	victim.Restart()
	waitFor(t, "the node to come back", 60*time.Second, func() bool { return ready(nodes) })
	for _, n := range nodes {
		check(n, 18)
	}
}

func hasSeen(fs []imap.Flag) bool {
	for _, f := range fs {
		if f == imap.FlagSeen {
			return true
		}
	}
	return false
}

// A session idling on one node is told of mail delivered through another
// within about a second (the writer's change counter is polled every
// 500 ms from nodes other than the writer's).
func TestIdleAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user, pw = "idle@cluster.example", "pw"
	nodes[0].addUser(t, user, pw)
	st, _ := nodes[0].Status()
	mgr := string(st.Buckets[cluster.Bucket(user)].Node)
	// Idle on a node that is not the writer's, deliver through another.
	var idler, sender *Node
	for _, n := range nodes {
		if n.ID != mgr && idler == nil {
			idler = n
		} else if n.ID != mgr || sender == nil {
			sender = n
		}
	}
	exists := make(chan uint32, 10)
	c, err := imapclient.DialInsecure(idler.Addrs["imap"], &imapclient.Options{UnilateralDataHandler: &imapclient.UnilateralDataHandler{
		Mailbox: func(d *imapclient.UnilateralDataMailbox) {
			if d.NumMessages != nil {
				exists <- *d.NumMessages
			}
		},
	}})
	if err != nil {
		fatalf(t, "%v", err)
	}
	defer c.Close()
	if err := c.Login(user, pw).Wait(); err != nil {
		fatalf(t, "%v", err)
	}
	if _, err := c.Select("INBOX", nil).Wait(); err != nil {
		fatalf(t, "%v", err)
	}
	idle, err := c.Idle()
	if err != nil {
		fatalf(t, "%v", err)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := sender.send(user, "ping"); err != nil {
		fatalf(t, "%v", err)
	}
	select {
	case n := <-exists:
		if n != 1 {
			errorf(t, "EXISTS %d, want 1", n)
		}
		t.Logf("EXISTS through %s %v after delivery through %s (writer on %s)", idler.ID, time.Since(start).Round(time.Millisecond), sender.ID, mgr)
		if d := time.Since(start); d > 3*time.Second {
			errorf(t, "EXISTS after %v across nodes", d)
		}
	case <-time.After(5 * time.Second):
		fatalf(t, "no EXISTS during IDLE across nodes")
	}
	idle.Close()
}

// A mailbox error answered by the user's writer on another node keeps its
// meaning: SELECT of a missing mailbox is NO [NONEXISTENT] and CREATE of
// an existing one NO [ALREADYEXISTS] through every node, not [SERVERBUG]
// (rpc.Known); a subscription made through one node is seen through the
// others.
func TestIMAPErrorsAndSubscriptionsAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user, pw = "errors@cluster.example", "pw"
	nodes[0].addUser(t, user, pw)
	for i, n := range nodes {
		c, err := imapclient.DialInsecure(n.Addrs["imap"], nil)
		if err != nil {
			fatalf(t, "%v", err)
		}
		if err := c.Login(user, pw).Wait(); err != nil {
			fatalf(t, "login through %s: %v", n.ID, err)
		}
		_, err = c.Select("Nowhere", nil).Wait()
		if code := imapCode(err); code != imap.ResponseCodeNonExistent {
			errorf(t, "SELECT of a missing mailbox through %s: %v (code %q), want NONEXISTENT", n.ID, err, code)
		}
		err = c.Create("Sent", nil).Wait()
		if code := imapCode(err); code != imap.ResponseCodeAlreadyExists {
			errorf(t, "CREATE of an existing mailbox through %s: %v (code %q), want ALREADYEXISTS", n.ID, err, code)
		}
		name := fmt.Sprintf("Later%d", i)
		if err := c.Subscribe(name).Wait(); err != nil {
			errorf(t, "SUBSCRIBE %s through %s: %v", name, n.ID, err)
		}
		c.Logout().Wait()
		c.Close()
	}
	for _, n := range nodes {
		c, err := imapclient.DialInsecure(n.Addrs["imap"], nil)
		if err != nil {
			fatalf(t, "%v", err)
		}
		if err := c.Login(user, pw).Wait(); err != nil {
			fatalf(t, "login through %s: %v", n.ID, err)
		}
		l, err := c.List("", "Later*", &imap.ListOptions{SelectSubscribed: true}).Collect()
		if err != nil || len(l) != len(nodes) {
			errorf(t, "subscriptions through %s: %d (%v), want %d", n.ID, len(l), err, len(nodes))
		}
		c.Logout().Wait()
		c.Close()
	}
}

// imapCode is the response code of a tagged NO, or "".
func imapCode(err error) imap.ResponseCode {
	var ie *imap.Error
	if errors.As(err, &ie) {
		return ie.Code
	}
	return ""
}

// rawIMAP is a line-level IMAP session for commands the client library
// does not have (SORT, THREAD, OBJECTID).
type rawIMAP struct {
	conn net.Conn
	r    *bufio.Reader
	n    int
	// limit bounds each command (0: ioTimeout).
	limit time.Duration
}

func dialRawIMAP(n *Node, user, pw string) (*rawIMAP, error) {
	conn, err := net.DialTimeout("tcp", n.Addrs["imap"], ioTimeout)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(ioTimeout))
	c := &rawIMAP{conn: conn, r: bufio.NewReader(conn)}
	if _, err := c.r.ReadString('\n'); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := c.cmd(fmt.Sprintf("LOGIN %q %q", user, pw)); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// cmd sends a command and returns its untagged lines; a tagged NO or BAD
// is an error.
func (c *rawIMAP) cmd(s string) ([]string, error) {
	c.n++
	tag := fmt.Sprintf("r%d", c.n)
	c.conn.SetDeadline(time.Now().Add(cmp.Or(c.limit, ioTimeout)))
	if _, err := fmt.Fprintf(c.conn, "%s %s\r\n", tag, s); err != nil {
		return nil, err
	}
	var lines []string
	for {
		l, err := c.r.ReadString('\n')
		if err != nil {
			return lines, err
		}
		l = strings.TrimRight(l, "\r\n")
		if rest, ok := strings.CutPrefix(l, tag+" "); ok {
			if !strings.HasPrefix(rest, "OK") {
				return lines, fmt.Errorf("%s: %s", s, rest)
			}
			return append(lines, rest), nil
		}
		lines = append(lines, l)
	}
}

// waitLine reads what the server sends unasked until a line holds want.
func (c *rawIMAP) waitLine(want string, d time.Duration) ([]string, error) {
	c.conn.SetDeadline(time.Now().Add(d))
	var lines []string
	for {
		l, err := c.r.ReadString('\n')
		if err != nil {
			return lines, err
		}
		lines = append(lines, strings.TrimRight(l, "\r\n"))
		if strings.Contains(l, want) {
			return lines, nil
		}
	}
}

// dialEach opens a raw session through each node, closed at cleanup.
func dialEach(t *testing.T, nodes []*Node, user, pw string) []*rawIMAP {
	conns := make([]*rawIMAP, len(nodes))
	for i, n := range nodes {
		c, err := dialRawIMAP(n, user, pw)
		if err != nil {
			fatalf(t, "through %s: %v", n.ID, err)
		}
		t.Cleanup(c.close)
		conns[i] = c
	}
	return conns
}

func (c *rawIMAP) close() {
	c.cmd("LOGOUT")
	c.conn.Close()
}

// SORT, THREAD and OBJECTID (issue 13) give the same answers through every
// node: the keys, threads and ids come from the messages, not from the
// node a session is on.
func TestSortThreadAndObjectIDAcrossNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	const user, pw = "sorted@cluster.example", "pw"
	nodes[0].addUser(t, user, pw)
	subjects := []string{"Re: beta", "alpha", "beta", "[list] gamma"}
	for i, s := range subjects {
		if err := nodes[i%3].send(user, s); err != nil {
			fatalf(t, "send %q: %v", s, err)
		}
	}
	var want []string
	for _, n := range nodes {
		c, err := dialRawIMAP(n, user, pw)
		if err != nil {
			fatalf(t, "through %s: %v", n.ID, err)
		}
		var got []string
		for _, cmd := range []string{"SELECT INBOX", "SORT (SUBJECT) UTF-8 ALL", "UID SORT (REVERSE ARRIVAL) UTF-8 ALL",
			"THREAD ORDEREDSUBJECT UTF-8 ALL", "FETCH 1:* (EMAILID)", "STATUS INBOX (MAILBOXID)"} {
			lines, err := c.cmd(cmd)
			if err != nil {
				errorf(t, "through %s: %v", n.ID, err)
				continue
			}
			for _, l := range lines {
				if strings.Contains(l, "SORT") || strings.Contains(l, "THREAD") || strings.Contains(l, "ID (") {
					got = append(got, l)
				}
			}
		}
		c.close()
		if want == nil {
			want = got
			t.Logf("through %s: %q", n.ID, got)
			if len(got) < 9 || got[1] != "* SORT 2 1 3 4" {
				errorf(t, "through %s: %q, want MAILBOXID, SORT 2 1 3 4, and the rest", n.ID, got)
			}
			continue
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			errorf(t, "through %s:\n%q\nthrough %s:\n%q", n.ID, got, nodes[0].ID, want)
		}
	}
	qresyncAcrossNodes(t, nodes, user, pw)
	multiAppendAcrossNodes(t, nodes, user, pw)
	notifyAcrossNodes(t, nodes, user, pw)
	contextAcrossNodes(t, nodes, user, pw)
	quotaAcrossNodes(t, nodes, user, pw)
}

// contextAcrossNodes: an updating search (RFC 5267 §4.3) on one node hears
// of a flag set through another node as ADDTO.
func contextAcrossNodes(t *testing.T, nodes []*Node, user, pw string) {
	conns := dialEach(t, nodes[:2], user, pw)
	for i, c := range conns {
		if _, err := c.cmd("SELECT INBOX"); err != nil {
			fatalf(t, "through %s: %v", nodes[i].ID, err)
		}
	}
	lines, err := conns[0].cmd("UID SEARCH RETURN (UPDATE COUNT) KEYWORD $Context")
	if err != nil || !strings.Contains(strings.Join(lines, "\n"), "COUNT 0") {
		fatalf(t, "UPDATE through %s: %q, %v", nodes[0].ID, lines, err)
	}
	if _, err := conns[1].cmd("UID STORE 2 +FLAGS ($Context)"); err != nil {
		fatalf(t, "STORE through %s: %v", nodes[1].ID, err)
	}
	want := "UID ADDTO (0 2)"
	waitFor(t, "the updating search to hear of the flag", 10*time.Second, func() bool {
		got, err := conns[0].cmd("NOOP")
		return err == nil && strings.Contains(strings.Join(got, "\n"), want)
	})
}

// notifyAcrossNodes: a session with NOTIFY on one node hears, without
// asking, of a delivery to its selected mailbox through another node and
// of a message stored in another mailbox through a third.
func notifyAcrossNodes(t *testing.T, nodes []*Node, user, pw string) {
	conns := dialEach(t, nodes[:3], user, pw)
	if _, err := conns[0].cmd("SELECT INBOX"); err != nil {
		fatalf(t, "through %s: %v", nodes[0].ID, err)
	}
	if _, err := conns[0].cmd("NOTIFY SET (selected (MessageNew (UID) MessageExpunge)) (personal (MessageNew MessageExpunge))"); err != nil {
		fatalf(t, "NOTIFY through %s: %v", nodes[0].ID, err)
	}
	if err := nodes[1].send(user, "notified"); err != nil {
		fatalf(t, "send through %s: %v", nodes[1].ID, err)
	}
	if got, err := conns[0].waitLine("EXISTS", 10*time.Second); err != nil {
		errorf(t, "NOTIFY through %s after a delivery through %s: %q, %v", nodes[0].ID, nodes[1].ID, got, err)
	}
	msg := "Subject: archived\r\n\r\nx\r\n"
	if _, err := conns[2].cmd(fmt.Sprintf("APPEND Archive {%d+}\r\n%s", len(msg), msg)); err != nil {
		fatalf(t, "APPEND through %s: %v", nodes[2].ID, err)
	}
	if got, err := conns[0].waitLine(`STATUS "Archive" (MESSAGES 1`, 10*time.Second); err != nil {
		errorf(t, "NOTIFY through %s after an APPEND through %s: %q, %v", nodes[0].ID, nodes[2].ID, got, err)
	}
}

// multiAppendAcrossNodes: a MULTIAPPEND through one node, one of its
// messages built by CATENATE from a stored message, is seen whole by a
// session on another node, and the catenated bytes read the same through
// a third.
func multiAppendAcrossNodes(t *testing.T, nodes []*Node, user, pw string) {
	conns := dialEach(t, nodes[:3], user, pw)
	sel, err := conns[0].cmd("SELECT INBOX")
	exists := regexp.MustCompile(`\* (\d+) EXISTS`).FindStringSubmatch(strings.Join(sel, "\n"))
	if err != nil || exists == nil {
		fatalf(t, "SELECT through %s: %q, %v", nodes[0].ID, sel, err)
	}
	head, plain := "Subject: catenated\r\n\r\n", "Subject: plain\r\n\r\nplain\r\n"
	if _, err := conns[1].cmd("SELECT INBOX"); err != nil {
		fatalf(t, "through %s: %v", nodes[1].ID, err)
	}
	lines, err := conns[1].cmd(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s CATENATE (TEXT {%d+}\r\n%s URL \";UID=2/;SECTION=TEXT\")",
		len(plain), plain, len(head), head))
	if err != nil || !strings.Contains(strings.Join(lines, "\n"), "APPENDUID") {
		fatalf(t, "MULTIAPPEND through %s: %q, %v", nodes[1].ID, lines, err)
	}
	n, _ := strconv.Atoi(exists[1])
	want := fmt.Sprintf("* %d EXISTS", n+2)
	waitFor(t, "the other node's session to see both messages", 10*time.Second, func() bool {
		got, err := conns[0].cmd("NOOP")
		return err == nil && strings.Contains(strings.Join(got, "\n"), want)
	})
	if _, err := conns[2].cmd("SELECT INBOX"); err != nil {
		fatalf(t, "through %s: %v", nodes[2].ID, err)
	}
	src, err1 := conns[2].cmd("UID FETCH 2 BODY.PEEK[TEXT]")
	got, err2 := conns[2].cmd(fmt.Sprintf("FETCH %d BODY.PEEK[TEXT]", n+2))
	if err1 != nil || err2 != nil || len(src) < 2 || len(got) < 2 || src[1] != got[1] {
		errorf(t, "through %s: the catenated text %q (%v) is not the source's %q (%v)", nodes[2].ID, got, err2, src, err1)
	}
}

// quotaAcrossNodes sets a quota through one node and finds it enforced and
// reported through the others: the usage is counted by the user's writer,
// wherever the messages lie.
func quotaAcrossNodes(t *testing.T, nodes []*Node, user, pw string) {
	var q struct {
		MessagesUsed int64 `json:"messages_used"`
	}
	if err := nodes[0].api("GET", "/api/users/"+user+"/quota", nil, &q); err != nil {
		fatalf(t, "quota through %s: %v", nodes[0].ID, err)
	}
	if err := nodes[0].api("PUT", "/api/users/"+user+"/quota", map[string]int64{"messages": q.MessagesUsed + 1}, nil); err != nil {
		fatalf(t, "set quota through %s: %v", nodes[0].ID, err)
	}
	if err := nodes[1].send(user, "the last one that fits"); err != nil {
		fatalf(t, "delivery within quota through %s: %v", nodes[1].ID, err)
	}
	if err := nodes[2].send(user, "one too many"); err == nil || !strings.Contains(err.Error(), "452") {
		errorf(t, "delivery past the quota through %s: %v, want 452 4.2.2", nodes[2].ID, err)
	}
	c, err := dialRawIMAP(nodes[2], user, pw)
	if err != nil {
		fatalf(t, "through %s: %v", nodes[2].ID, err)
	}
	defer c.close()
	lines, err := c.cmd("GETQUOTAROOT INBOX")
	want := fmt.Sprintf(`MESSAGE %d %d)`, q.MessagesUsed+1, q.MessagesUsed+1)
	if err != nil || !strings.Contains(strings.Join(lines, "\n"), want) {
		errorf(t, "GETQUOTAROOT through %s: %q, %v; want %s", nodes[2].ID, lines, err, want)
	}
}

// qresyncAcrossNodes checks QRESYNC (RFC 7162 §3.2) through three nodes: a
// session on the first hears an expunge made through the second as
// VANISHED, and a session on the third that resynchronises from the first
// one's state gets the expunge as VANISHED (EARLIER) and the flag change
// as a FETCH.
func qresyncAcrossNodes(t *testing.T, nodes []*Node, user, pw string) {
	conns := dialEach(t, nodes[:3], user, pw)
	must := func(i int, cmd string) []string {
		lines, err := conns[i].cmd(cmd)
		if err != nil {
			fatalf(t, "through %s: %v", nodes[i].ID, err)
		}
		return lines
	}
	must(0, "ENABLE QRESYNC")
	sel := strings.Join(must(0, "SELECT INBOX"), "\n")
	v := regexp.MustCompile(`UIDVALIDITY (\d+)`).FindStringSubmatch(sel)
	h := regexp.MustCompile(`HIGHESTMODSEQ (\d+)`).FindStringSubmatch(sel)
	if v == nil || h == nil {
		fatalf(t, "SELECT through %s: %q", nodes[0].ID, sel)
	}
	must(1, "SELECT INBOX")
	must(1, `UID STORE 1 +FLAGS.SILENT (\Deleted)`)
	must(1, "UID EXPUNGE 1")
	must(1, `UID STORE 2 +FLAGS.SILENT (\Flagged)`)
	if got := strings.Join(must(0, "NOOP"), "\n"); !strings.Contains(got, "* VANISHED 1") || strings.Contains(got, "EXPUNGE") {
		errorf(t, "NOOP through %s after an expunge through %s: %q", nodes[0].ID, nodes[1].ID, got)
	}
	must(2, "ENABLE QRESYNC")
	got := strings.Join(must(2, fmt.Sprintf("SELECT INBOX (QRESYNC (%s %s))", v[1], h[1])), "\n")
	if !strings.Contains(got, "* VANISHED (EARLIER) 1") || !regexp.MustCompile(`FETCH \(UID 2 FLAGS \([^)]*\\Flagged`).MatchString(got) {
		errorf(t, "SELECT QRESYNC through %s: %q", nodes[2].ID, got)
	}
}
