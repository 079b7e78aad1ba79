package cluster_test

// The client side of the fault tests: a stream of uniquely numbered
// messages to random users through random live nodes, read-backs of some of
// them while faults go on, and the checker that reads every mailbox through
// every node at the end.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	gosmtp "github.com/emersion/go-smtp"
)

// ack is what the stream knows of an acknowledged message.
type ack struct {
	at  time.Time // when the 250 came
	via string    // the id of the node the client talked to
}

// faultRecord is one injected fault.
type faultRecord struct {
	n          int
	kind       string
	victim     string // node id (a wiped node's old id)
	start, end time.Time
	note       string
}

// stream delivers "seq N" messages, N unique, to random users through
// random nodes not marked down, and counts what was acknowledged.
type stream struct {
	t     *testing.T
	users []string
	pw    string
	nodes []*Node
	begin time.Time

	mu       sync.Mutex
	down     map[*Node]bool
	acked    map[string]map[int]ack // user -> seq -> ack
	seq      int
	attempts int
	failures int
	nAcked   int
	faults   []faultRecord
	// read-backs: found, not (yet) visible, failed.
	readOK, readMissing, readErr int
	// policy is a user's write policy where it is not the cluster's
	// default, write policy one.
	policy map[string]string
	// oneWindows are the spans before wipes in which write policy one
	// allows an acknowledged message to be lost (see oneWindow).
	oneWindows []oneWindow
	// gone are messages a check found lost; later checks leave them out.
	gone map[string]map[int]bool
	// why counts failed deliveries by error text.
	why map[string]int
	// bounced counts deliveries refused with a 5xx reply: a sender
	// bounces those, which for an existing user means lost mail.
	bounced int
	// Slowest delivery and read-back, and the time spent reading back.
	sendMax, readMax, readTotal time.Duration

	// body, if set, gives message n's body (else the subject is the
	// body).
	body func(n int) string

	stop     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// oneWindow is a span before a wipe. Write policy one answers 250 once the
// message is on one node and pushes it to the other replicas after; a
// message acknowledged just before that node's disk is destroyed may have
// had no other copy yet, and one says that is allowed. Before a wipe the
// harness waits until a repair scan on every node finds nothing short of
// replicas and the victim's update log has nothing left to push to live
// nodes (wipeSafe), so only messages acknowledged from the start of the
// victim's scan (less a second of slack) to the kill can be lost this way;
// any other loss is an error, and so is any loss of a user with a stricter
// policy.
type oneWindow struct {
	from, to time.Time
	fault    int
}

// readEvery is how often the stream reads an acknowledged message back
// (every readEvery-th acknowledgement), through a random live node.
const readEvery = 20

// maxReadLogs bounds how many failed read-backs are logged one by one.
const maxReadLogs = 10

func newStream(t *testing.T, nodes []*Node, users []string, pw string) *stream {
	s := &stream{t: t, users: users, pw: pw, nodes: nodes, begin: time.Now(), down: map[*Node]bool{},
		acked: map[string]map[int]ack{}, policy: map[string]string{}, gone: map[string]map[int]bool{},
		why: map[string]int{}, stop: make(chan struct{})}
	t.Cleanup(s.finish)
	return s
}

// setDown marks a node the clients must not pick (killed, paused,
// restarting) or clears the mark.
func (s *stream) setDown(n *Node, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if down {
		s.down[n] = true
	} else {
		delete(s.down, n)
	}
}

// up returns the nodes not marked down.
func (s *stream) up() []*Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	var up []*Node
	for _, n := range s.nodes {
		if !s.down[n] {
			up = append(up, n)
		}
	}
	return up
}

// counts returns how many deliveries were tried and how many failed.
func (s *stream) counts() (attempts, failures int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts, s.failures
}

// record notes a fault for the report and for explaining a lost message;
// attempts and failures are the counts when it began.
func (s *stream) record(f faultRecord, attempts, failures int) {
	s.mu.Lock()
	s.faults = append(s.faults, f)
	tried, failed := s.attempts-attempts, s.failures-failures
	s.mu.Unlock()
	d := f.end.Sub(f.start).Round(100 * time.Millisecond)
	s.t.Logf("fault %d at +%.1fs: %s %s for %v%s; %d of %d deliveries meanwhile failed",
		f.n, f.start.Sub(s.begin).Seconds(), f.kind, f.victim, d, f.note, failed, tried)
}

// permanent reports whether a delivery error is a 5xx reply.
func permanent(err error) bool {
	var se *gosmtp.SMTPError
	return errors.As(err, &se) && se.Code >= 500
}

// failureText shortens a delivery error to a key for counting: digits
// (ports, ids, counts) become #.
func failureText(err error) string {
	msg := err.Error()
	if len(msg) > 240 {
		msg = msg[:240]
	}
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '#'
		}
		return r
	}, msg)
}

// start runs workers delivering until finish; with reads, every
// readEvery-th acknowledged message is read back (POP3 or IMAP) through a
// random live node; a message not visible or a failed read is logged, not
// fatal: it may be on a node that is down right now.
func (s *stream) start(workers int, seed uint64, reads bool) {
	for w := 0; w < workers; w++ {
		s.wg.Add(1)
		go func(w int) {
			defer s.wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)+2))
			for {
				select {
				case <-s.stop:
					return
				default:
				}
				up := s.up()
				s.mu.Lock()
				s.seq++
				n := s.seq
				s.mu.Unlock()
				u := s.users[r.IntN(len(s.users))]
				via := up[r.IntN(len(up))]
				id := via.ID
				began := time.Now()
				var err error
				if s.body != nil {
					err = via.sendBody(u, fmt.Sprintf("seq %d", n), s.body(n))
				} else {
					err = via.send(u, fmt.Sprintf("seq %d", n))
				}
				took := time.Since(began)
				s.mu.Lock()
				s.attempts++
				s.sendMax = max(s.sendMax, took)
				readBack := false
				if err == nil {
					if s.acked[u] == nil {
						s.acked[u] = map[int]ack{}
					}
					s.acked[u][n] = ack{at: time.Now(), via: id}
					s.nAcked++
					readBack = reads && s.nAcked%readEvery == 0
				} else {
					s.failures++
					s.why[failureText(err)]++
					if permanent(err) {
						s.bounced++
					}
				}
				s.mu.Unlock()
				if readBack {
					s.readBack(r, u, n)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}(w)
	}
}

func (s *stream) readBack(r *rand.Rand, user string, n int) {
	up := s.up()
	nd := up[r.IntN(len(up))]
	proto := "IMAP"
	var found bool
	var err error
	began := time.Now()
	defer func() {
		took := time.Since(began)
		s.mu.Lock()
		s.readTotal += took
		s.readMax = max(s.readMax, took)
		s.mu.Unlock()
	}()
	if r.IntN(2) == 0 {
		proto = "POP3"
		found, err = nd.pop3Has(user, s.pw, fmt.Sprintf("seq %d", n))
	} else {
		found, err = nd.imapHas(user, s.pw, fmt.Sprintf("seq %d", n))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		s.readErr++
		if s.readErr <= maxReadLogs {
			s.t.Logf("read-back of seq %d for %s over %s through %s: %v", n, user, proto, nd.ID, err)
		}
	case !found:
		s.readMissing++
		if s.readMissing <= maxReadLogs {
			s.t.Logf("read-back of seq %d for %s over %s through %s: not visible yet", n, user, proto, nd.ID)
		}
	default:
		s.readOK++
	}
}

// finish stops the workers and waits for them.
func (s *stream) finish() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// total returns how many messages were acknowledged.
func (s *stream) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nAcked
}

// explain says where an acknowledged message came from and which faults
// matter to it: those on at the time, the next one, and the next wipe.
func (s *stream) explain(a ack) string {
	out := fmt.Sprintf("acknowledged at +%.1fs through %s", a.at.Sub(s.begin).Seconds(), a.via)
	next, wipe := false, false
	for _, f := range s.faults {
		during := !a.at.Before(f.start) && !a.at.After(f.end)
		after := f.start.After(a.at)
		show := during || (after && !next) || (after && !wipe && f.kind == faultWipe)
		next = next || after
		wipe = wipe || (after && f.kind == faultWipe)
		if show {
			out += fmt.Sprintf("; fault %d %s %s from +%.1fs to +%.1fs", f.n, f.kind, f.victim,
				f.start.Sub(s.begin).Seconds(), f.end.Sub(s.begin).Seconds())
		}
	}
	return out
}

// maxLostLogs bounds the missing messages reported one by one per kind.
const maxLostLogs = 25

// checkResult counts what a check found. Lost messages are missing through
// every node; partial ones through some nodes only.
type checkResult struct {
	lost, oneWindow, partial, dups int
	// pop3Only counts lost messages that POP3 still shows (the IMAP
	// view hides them; still an error).
	pop3Only int
	// lostBy counts lost messages per user; lostBefore per the first
	// wipe after their acknowledgement (-1: none), which names the wipe
	// that took them when losses are many.
	lostBy     map[string]int
	lostBefore map[int]int
}

// nextWipe is the number of the first wipe begun after t, or -1.
func (s *stream) nextWipe(t time.Time) int {
	for _, f := range s.faults {
		if f.kind == faultWipe && f.start.After(t) {
			return f.n
		}
	}
	return -1
}

// inOneWindow reports whether a lost message of the user is one write
// policy one allows to lose: acknowledged in a oneWindow.
func (s *stream) inOneWindow(user string, a ack) (int, bool) {
	if s.policy[user] != "" && s.policy[user] != "one" {
		return 0, false
	}
	for _, w := range s.oneWindows {
		if !a.at.Before(w.from) && !a.at.After(w.to) {
			return w.fault, true
		}
	}
	return 0, false
}

// check reads every user's INBOX through every node of nodes over IMAP.
// An acknowledged message missing through every node is lost, one missing
// through some nodes only is partly visible: both are errors, reported one
// by one (up to maxLostLogs each), except a loss write policy one allows
// (inOneWindow), which is counted and logged. Messages an earlier check
// found lost are left out. Duplicates are messages seen more than once in
// one node's view.
func (s *stream) check(t *testing.T, nodes []*Node, what string) checkResult {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := checkResult{lostBy: map[string]int{}, lostBefore: map[int]int{}}
	for _, u := range s.users {
		counts := make([]map[int]int, len(nodes))
		for i, n := range nodes {
			_, subj, _, err := n.imapView(u, s.pw)
			if err != nil {
				errorf(t, "%s: %s through %s: %v", what, u, n.ID, err)
			}
			counts[i] = map[int]int{}
			for _, sj := range subj {
				if k, err := strconv.Atoi(strings.TrimPrefix(sj, "seq ")); err == nil {
					counts[i][k]++
				}
			}
		}
		var seqs []int
		for k := range s.acked[u] {
			if !s.gone[u][k] {
				seqs = append(seqs, k)
			}
		}
		sort.Ints(seqs)
		// A second opinion on messages missing through every node: POP3
		// reads the fragments without the IMAP writer's view.
		var pop3 map[int]bool
		var pop3From string
		for _, k := range seqs {
			lostHere := true
			for i := range nodes {
				lostHere = lostHere && counts[i][k] == 0
			}
			if !lostHere || pop3 != nil {
				continue
			}
			for _, n := range nodes {
				seen := map[int]bool{}
				err := n.pop3Subjects(u, s.pw, func(sj string) bool {
					if k, err := strconv.Atoi(strings.TrimPrefix(sj, "seq ")); err == nil {
						seen[k] = true
					}
					return true
				})
				if err == nil {
					pop3, pop3From = seen, n.ID
					break
				}
				t.Logf("%s: POP3 of %s through %s: %v", what, u, n.ID, err)
			}
			if pop3 == nil {
				pop3 = map[int]bool{}
			}
		}
		for _, k := range seqs {
			var missing []string
			for i, n := range nodes {
				if counts[i][k] == 0 {
					missing = append(missing, n.ID)
				}
			}
			a := s.acked[u][k]
			if len(missing) == len(nodes) {
				if s.gone[u] == nil {
					s.gone[u] = map[int]bool{}
				}
				s.gone[u][k] = true
			}
			switch f, ok := s.inOneWindow(u, a); {
			case len(missing) == len(nodes) && ok:
				r.oneWindow++
				if r.oneWindow <= maxLostLogs {
					t.Logf("%s: %s: seq %d lost within write policy one's window before wipe %d (%s)", what, u, k, f, s.explain(a))
				}
			case len(missing) == len(nodes):
				r.lost++
				r.lostBy[u]++
				r.lostBefore[s.nextWipe(a.at)]++
				over := "not over POP3 either"
				if pop3[k] {
					r.pop3Only++
					over = "but POP3 through " + pop3From + " shows it"
				}
				if r.lost <= maxLostLogs {
					errorf(t, "%s: %s (write policy %s): acknowledged message seq %d is lost: missing through every node over IMAP, %s (%s)",
						what, u, s.policyOf(u), k, over, s.explain(a))
				}
			case len(missing) > 0:
				r.partial++
				if r.partial <= maxLostLogs {
					errorf(t, "%s: %s: acknowledged message seq %d is missing through %s (%s)", what, u, k, strings.Join(missing, ", "), s.explain(a))
				}
			}
		}
		extra := map[int]int{}
		for _, c := range counts {
			for k, n := range c {
				extra[k] = max(extra[k], n-1)
			}
		}
		for _, n := range extra {
			r.dups += n
		}
	}
	if r.lost > maxLostLogs {
		errorf(t, "%s: %d more acknowledged messages lost", what, r.lost-maxLostLogs)
	}
	if r.lost > 0 {
		var by []string
		for _, u := range s.users {
			if r.lostBy[u] > 0 {
				by = append(by, fmt.Sprintf("%s %d", u, r.lostBy[u]))
			}
		}
		errorf(t, "%s: %d acknowledged messages lost over IMAP (%s), %d of them still shown by POP3", what, r.lost, strings.Join(by, ", "), r.pop3Only)
		var wipes []string
		for f, n := range r.lostBefore {
			wipes = append(wipes, fmt.Sprintf("before wipe %d: %d", f, n))
		}
		slices.Sort(wipes)
		errorf(t, "%s: lost messages by the first wipe after their acknowledgement (-1: none): %s", what, strings.Join(wipes, ", "))
	}
	if r.partial > maxLostLogs {
		errorf(t, "%s: %d more acknowledged messages missing through some nodes", what, r.partial-maxLostLogs)
	}
	return r
}

func (s *stream) policyOf(user string) string {
	if p := s.policy[user]; p != "" {
		return p
	}
	return "one"
}

// missingAnywhere counts acknowledged messages not visible through some
// node of nodes, without reporting them (for polling), leaving out those a
// check found lost.
func (s *stream) missingAnywhere(nodes []*Node) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	missing := 0
	for _, n := range nodes {
		for _, u := range s.users {
			_, subj, _, err := n.imapView(u, s.pw)
			if err != nil {
				return -1
			}
			seen := map[int]bool{}
			for _, sj := range subj {
				if k, err := strconv.Atoi(strings.TrimPrefix(sj, "seq ")); err == nil {
					seen[k] = true
				}
			}
			for k := range s.acked[u] {
				if !seen[k] && !s.gone[u][k] {
					missing++
				}
			}
		}
	}
	return missing
}

// summary logs the counts of the run.
func (s *stream) summary(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("%d deliveries tried, %d acknowledged, %d refused or failed while nodes were down", s.attempts, s.nAcked, s.failures)
	type reason struct {
		text string
		n    int
	}
	var why []reason
	for k, n := range s.why {
		why = append(why, reason{k, n})
	}
	sort.Slice(why, func(i, j int) bool { return why[i].n > why[j].n })
	for i, r := range why {
		if i == 5 {
			t.Logf("  ... and %d other kinds of failure", len(why)-5)
			break
		}
		t.Logf("  %d× %s", r.n, r.text)
	}
	if s.bounced > 0 {
		t.Logf("%d of the failed deliveries were refused with a 5xx reply (a sender bounces those)", s.bounced)
	}
	t.Logf("slowest delivery %v", s.sendMax.Round(time.Millisecond))
	if n := s.readOK + s.readMissing + s.readErr; n > 0 {
		t.Logf("read-backs during faults: %d (found %d, not visible yet %d, failed %d; mean %v, slowest %v)",
			n, s.readOK, s.readMissing, s.readErr, (s.readTotal / time.Duration(n)).Round(time.Millisecond), s.readMax.Round(time.Millisecond))
	}
}

// imapHas reports whether the user's INBOX, read through the node over
// IMAP, holds a message with the subject (the newest 50 first).
func (n *Node) imapHas(user, pw, subject string) (bool, error) {
	conn, err := net.DialTimeout("tcp", n.Addrs["imap"], ioTimeout)
	if err != nil {
		return false, err
	}
	conn.SetDeadline(time.Now().Add(3 * ioTimeout))
	c := imapclient.New(conn, nil)
	defer c.Close()
	if err := c.Login(user, pw).Wait(); err != nil {
		return false, fmt.Errorf("login: %w", err)
	}
	sel, err := c.Select("INBOX", &imap.SelectOptions{ReadOnly: true}).Wait()
	if err != nil {
		return false, err
	}
	defer func() { c.Logout().Wait() }()
	sec := &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader, HeaderFields: []string{"Subject"}, Peek: true}
	has := func(from, to uint32) (bool, error) {
		var set imap.SeqSet
		set.AddRange(from, to)
		msgs, err := c.Fetch(set, &imap.FetchOptions{BodySection: []*imap.FetchItemBodySection{sec}}).Collect()
		if err != nil {
			return false, err
		}
		for _, m := range msgs {
			if strings.TrimPrefix(strings.TrimSpace(string(m.FindBodySection(sec))), "Subject: ") == subject {
				return true, nil
			}
		}
		return false, nil
	}
	total := sel.NumMessages
	if total == 0 {
		return false, nil
	}
	from := uint32(1)
	if total > 50 {
		from = total - 49
	}
	if ok, err := has(from, total); ok || err != nil || from == 1 {
		return ok, err
	}
	return has(1, from-1)
}

// pop3Has reports whether the user's maildrop, read through the node over
// POP3, holds a message with the subject (TOP of each message, last
// first).
func (n *Node) pop3Has(user, pw, subject string) (bool, error) {
	found := false
	err := n.pop3Subjects(user, pw, func(s string) bool {
		found = s == subject
		return !found
	})
	return found, err
}

// pop3Subjects logs in over POP3 through the node and calls fn with the
// subject of each message (TOP n 0), last first, while fn returns true.
func (n *Node) pop3Subjects(user, pw string, fn func(subject string) bool) error {
	c, err := n.pop3Login(user, pw, 6*ioTimeout)
	if err != nil {
		return err
	}
	defer c.quit()
	st, err := c.cmd("STAT")
	if err != nil {
		return err
	}
	var count int
	if f := strings.Fields(st); len(f) >= 2 {
		count, _ = strconv.Atoi(f[1])
	}
	for i := count; i >= 1; i-- {
		if _, err := c.cmd(fmt.Sprintf("TOP %d 0", i)); err != nil {
			return err
		}
		subject := ""
		if err := c.lines(func(l string) {
			if v, ok := strings.CutPrefix(l, "Subject: "); ok {
				subject = v
			}
		}); err != nil {
			return err
		}
		if !fn(subject) {
			return nil
		}
	}
	return nil
}
