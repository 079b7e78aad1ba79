package cluster_test

// Fault tests of `quill serve --store cassandra` with real processes (issue
// 15): three Cassandra nodes (keyspace RF 3) under three quill front ends
// forming one quill cluster. Not in CI (make cassandra-serve-faults: the
// three JVMs and the checks take 15-25 minutes); docs/cassandra.md,
// "Faults under quill serve".

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/quillmail/quill/internal/cassandra/cassandratest"
)

const (
	// casSeed is the default seed (the number);
	// QUILL_CASSANDRA_SERVE_FAULTS_SEED sets another.
	casSeed = 15
	// casUsers receive the delivery stream; casWorkers deliver at once,
	// each through a random live quill node.
	casUsers   = 24
	casWorkers = 6
	// casBeforeKill is how long the stream runs with everything up;
	// casWhileDown how long it goes on after the kill (for a quill node:
	// after the other two took its buckets over, and again after it came
	// back wiped).
	casBeforeKill = 15 * time.Second
	casWhileDown  = 20 * time.Second
	// casHintsWait is the wait between the check right after the killed
	// Cassandra node's return and the next one, without repair: hints
	// are replayed by a dispatcher that runs every 10 s.
	casHintsWait = 30 * time.Second
	// casStartWait bounds a quill node's start: the first one makes the
	// keyspace, a schema change three busy JVMs take tens of seconds to
	// agree on.
	casStartWait = 3 * time.Minute
	// casTakeover bounds the wait for the other quill nodes to agree on
	// the user map without a killed one (failure detection and a gossip
	// round or two), and for a restarted one to be back in it.
	casTakeover = 2 * time.Minute
	// casChangeMessages are in the IMAP session's mailbox, which it
	// changes message after message.
	casChangeMessages = 120
	// casProgressEvery is how often the counts are logged.
	casProgressEvery = 5 * time.Second
	// casWatchEvery is how often the watcher reads a random user's
	// mailbox through a random live node, recording its UIDs.
	casWatchEvery = 2 * time.Second
	// casViewTimeout bounds one read of a whole mailbox with its bodies.
	casViewTimeout = 2 * time.Minute
	// casPW is every user's password.
	casPW = "cassandra pw"
)

// casLevel is a consistency level of reads and writes for the quill nodes,
// and whether every acknowledged message must be visible at every check
// (W + R > RF).
type casLevel struct {
	name         string
	mustFindEach bool
}

var casLevels = []casLevel{{"QUORUM", true}, {"ONE", false}}

// TestCassandraServeFaults runs, on one three-node Cassandra cluster:
// for QUORUM/QUORUM and ONE/ONE, a delivery stream through three quill
// nodes and an IMAP session's changes while one Cassandra node is killed
// with kill -9 and brought back, checked through the quill nodes with the
// node down, right after its return, later, and after nodetool repair; and
// at QUORUM, kill -9 of the quill node that manages the IMAP session's
// mailbox, its data directory wiped and the node restarted.
func TestCassandraServeFaults(t *testing.T) {
	if os.Getenv("QUILL_CASSANDRA_SERVE_FAULTS") == "" {
		t.Skip("set QUILL_CASSANDRA_SERVE_FAULTS=1 (make cassandra-serve-faults): three Cassandra nodes, three quill nodes, 15-25 minutes")
	}
	seed := uint64(casSeed)
	if v := os.Getenv("QUILL_CASSANDRA_SERVE_FAULTS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("QUILL_CASSANDRA_SERVE_FAULTS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("seed %d (QUILL_CASSANDRA_SERVE_FAULTS_SEED=%d repeats the run's victims, users and bodies); load average %s", seed, seed, loadAvg())
	began := time.Now()
	c, err := cassandratest.StartCluster(cassandratest.ClusterOptions{Nodes: 3, ShortLived: true})
	if errors.Is(err, cassandratest.ErrNoJava) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	for i, n := range c.Nodes {
		t.Logf("Cassandra node %d: %s:%d pid %d", i+1, n.Addr, n.Port, n.PID)
	}
	t.Logf("three Cassandra nodes up in %s; load average %s", time.Since(began).Round(time.Second), loadAvg())
	rng := rand.New(rand.NewPCG(seed, 0))
	var reports []string
	for li, lv := range casLevels {
		victim := rng.IntN(len(c.Nodes))
		t.Run(lv.name, func(t *testing.T) {
			reports = append(reports, casNodeKilled(t, c, lv, seed+uint64(li)*1000, victim))
		})
	}
	t.Run("quill-kill", func(t *testing.T) {
		reports = append(reports, casQuillKilled(t, c, seed+9000))
	})
	t.Logf("seed %d, %s, load average at the end %s\n%s", seed, time.Since(began).Round(time.Second), loadAvg(), strings.Join(reports, "\n"))
}

// casNodeKilled is one level's run with a Cassandra node killed.
func casNodeKilled(t *testing.T, c *cassandratest.Cluster, lv casLevel, seed uint64, victim int) string {
	r := startCasRun(t, c, "serve_faults_"+strings.ToLower(lv.name), lv.name, seed)
	v := c.Nodes[victim]
	t.Logf("%s: Cassandra node %d (%s, pid %d) will be killed", lv.name, victim+1, v.Addr, v.PID)
	r.startLoad(r.nodes[rand.New(rand.NewPCG(seed, 3)).IntN(len(r.nodes))])
	r.progress("everything up", casBeforeKill)
	v.Kill()
	killed := time.Now()
	r.killed = killed
	t.Logf("kill -9 of Cassandra node %d (pid %d); load average %s", victim+1, v.PID, loadAvg())
	r.progress("one Cassandra node down", casWhileDown)
	r.stopLoad()
	t.Logf("stream stopped %s after the kill", time.Since(killed).Round(100*time.Millisecond))

	var checks []casCheck
	checks = append(checks, r.check("Cassandra node down", r.nodes))
	back := time.Now()
	if err := v.Restart(); err != nil {
		fatalf(t, "restart Cassandra node %d: %v", victim+1, err)
	}
	t.Logf("Cassandra node %d back (pid %d), CQL answered after %s", victim+1, v.PID, time.Since(back).Round(100*time.Millisecond))
	checks = append(checks, r.check("right after its return", r.nodes))
	time.Sleep(casHintsWait)
	checks = append(checks, r.check(fmt.Sprintf("%s later, no repair", casHintsWait), r.nodes))
	repairBegan := time.Now()
	if out, err := v.Nodetool("repair", "-full", r.keyspace); err != nil {
		errorf(t, "repair: %v", err)
	} else {
		t.Logf("nodetool repair -full %s on node %d took %s: %s", r.keyspace, victim+1,
			time.Since(repairBegan).Round(100*time.Millisecond), lastLineOf(out))
		checks = append(checks, r.check("after nodetool repair", r.nodes))
	}
	for i, ck := range checks {
		final := i == len(checks)-1 && len(checks) == 4
		if ck.wrong > 0 || ck.reused > 0 || ck.dups > 0 || ck.uidNextDown > 0 {
			errorf(t, "%s: %d read back with other bytes, %d UIDs naming another message, %d duplicates, UIDNEXT went down %d times",
				ck.what, ck.wrong, ck.reused, ck.dups, ck.uidNextDown)
		}
		if (lv.mustFindEach || final) && (ck.missing() > 0 || ck.changesLost > 0 || ck.viewErrs > 0) {
			errorf(t, "%s at %s: %d acknowledged messages not visible through some node, %d acknowledged changes not there, %d mailboxes unreadable",
				ck.what, lv.name, ck.missing(), ck.changesLost, ck.viewErrs)
		}
	}
	return r.report(fmt.Sprintf("%s/%s, Cassandra node %d killed", lv.name, lv.name, victim+1), checks)
}

// casQuillKilled kills the quill node that manages the IMAP session's
// mailbox in the middle of the stream and the session, waits for the
// other two to take its buckets over, wipes its data directory, restarts
// it and checks everything through all three.
func casQuillKilled(t *testing.T, c *cassandratest.Cluster, seed uint64) string {
	r := startCasRun(t, c, "serve_faults_quill", "QUORUM", seed)
	mgr := managerOf(t, r.nodes[0], r.ch.user)
	var victim *Node
	for _, n := range r.nodes {
		if n.ID == mgr {
			victim = n
		}
	}
	if victim == nil {
		fatalf(t, "no quill node %s (manager of %s)", mgr, r.ch.user)
	}
	t.Logf("quill node %s manages %s's mailbox: it will be killed mid-session", victim.ID, r.ch.user)
	r.startLoad(victim)
	r.progress("three quill nodes up", casBeforeKill)
	old := victim.ID
	victim.Kill9()
	r.s.setDown(victim, true)
	killed := time.Now()
	r.killed = killed
	t.Logf("kill -9 of quill node %s; load average %s", old, loadAvg())
	others := without(r.nodes, victim)
	took := waitFor(t, "the other quill nodes to take the killed one's buckets", casTakeover, func() bool { return agree(others, others) })
	t.Logf("the other two manage every bucket %s after the kill", took.Round(100*time.Millisecond))
	r.progress("two quill nodes", casWhileDown)
	// Through the two, while the stream and the session go on.
	taken := r.check("through the other two, under load", others)
	entries, _ := os.ReadDir(victim.Data)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(victim.Data, e.Name()))
	}
	victim.Restart()
	t.Logf("quill node %s wiped and restarted as %s", old, victim.ID)
	took = waitFor(t, "the restarted node back in the user map", casTakeover, func() bool { return ready(r.nodes) })
	t.Logf("%s back in the user map after %s, managing %d buckets", victim.ID, took.Round(100*time.Millisecond), r.nodes[0].bucketOwners()[victim.ID])
	r.s.setDown(victim, false)
	r.progress("three quill nodes again", casWhileDown)
	r.stopLoad()
	t.Logf("stream stopped %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	final := r.check("through all three, after the wiped node's return", r.nodes)
	for _, ck := range []casCheck{taken, final} {
		if ck.missing() > 0 || ck.wrong > 0 || ck.reused > 0 || ck.dups > 0 || ck.changesLost > 0 || ck.viewErrs > 0 || ck.uidNextDown > 0 {
			errorf(t, "%s: %d missing, %d other bytes, %d UIDs reused, %d duplicates, %d changes lost, %d mailboxes unreadable, UIDNEXT went down %d times",
				ck.what, ck.missing(), ck.wrong, ck.reused, ck.dups, ck.changesLost, ck.viewErrs, ck.uidNextDown)
		}
	}
	return r.report("QUORUM/QUORUM, quill node "+old+" killed, wiped, restarted", []casCheck{taken, final})
}

// casRun is one run's quill cluster, stream, IMAP session and UID record.
type casRun struct {
	t        *testing.T
	keyspace string
	seed     uint64
	nodes    []*Node
	s        *stream
	ch       *changer
	began    time.Time
	// killed is when the fault began (for the report).
	killed time.Time

	mu sync.Mutex
	// uids is every UID seen per user and the message (seq) it named;
	// uidNext the highest UIDNEXT seen per user.
	uids    map[string]map[uint32]int
	uidNext map[string]uint32
	// reused counts UIDs seen naming two messages; below UIDs that
	// appeared below one seen before; uidNextDown UIDNEXTs lower than one
	// seen before.
	reused, below, uidNextDown int
	watches                    int

	watchStop chan struct{}
	watchDone chan struct{}
}

func startCasRun(t *testing.T, c *cassandratest.Cluster, keyspace, level string, seed uint64) *casRun {
	args := []string{"--store", "cassandra", "--cassandra", strings.Join(c.Hosts(), ","), "--keyspace", keyspace,
		"--cassandra-rf", "3", "--cassandra-read", level, "--cassandra-write", level}
	began := time.Now()
	nodes := startSet(t, 3, func(_ int, nd *Node) {
		nd.extra, nd.startWait, nd.logs = args, casStartWait, t.TempDir()
	})
	t.Logf("three quill nodes on keyspace %s (RF 3, %s/%s) in %s: %s, %s, %s", keyspace, level, level,
		time.Since(began).Round(100*time.Millisecond), nodes[0].ID, nodes[1].ID, nodes[2].ID)
	users := nodes[0].addUsers(t, "cass", casUsers, casPW)
	s := newStream(t, nodes, users, casPW)
	s.body = func(n int) string { return casBody(seed, n) }
	r := &casRun{t: t, keyspace: keyspace, seed: seed, nodes: nodes, s: s, began: time.Now(),
		uids: map[string]map[uint32]int{}, uidNext: map[string]uint32{}}
	r.ch = newChanger(t, nodes, "changes@cluster.example")
	return r
}

// startLoad starts the stream, the IMAP session (first through via) and
// the watcher.
func (r *casRun) startLoad(via *Node) {
	r.began = time.Now()
	r.s.start(casWorkers, r.seed, true)
	r.ch.start(via, r.s.up)
	r.watchStop, r.watchDone = make(chan struct{}), make(chan struct{})
	go r.watch()
}

func (r *casRun) stopLoad() {
	r.s.finish()
	r.ch.finish()
	close(r.watchStop)
	<-r.watchDone
	r.s.summary(r.t)
	r.ch.summary()
	r.mu.Lock()
	r.t.Logf("watcher: %d mailbox reads; %d UIDs appeared below one seen before, %d UIDNEXTs lower than one seen before, %d UIDs naming another message", r.watches, r.below, r.uidNextDown, r.reused)
	r.mu.Unlock()
}

// progress waits d, logging the counts every casProgressEvery.
func (r *casRun) progress(what string, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(min(casProgressEvery, time.Until(end)))
		tried, failed := r.s.counts()
		fl, ex, refused := r.ch.counts()
		r.t.Logf("+%.0fs %s: %d deliveries tried, %d acknowledged, %d failed; IMAP session: %d keywords and %d expunges acknowledged, %d refused",
			time.Since(r.began).Seconds(), what, tried, tried-failed, failed, fl, ex, refused)
	}
}

// watch reads a random user's mailbox through a random live node every
// casWatchEvery, recording its UIDs, until stopLoad.
func (r *casRun) watch() {
	defer close(r.watchDone)
	rng := rand.New(rand.NewPCG(r.seed, 5))
	for {
		select {
		case <-r.watchStop:
			return
		case <-time.After(casWatchEvery):
		}
		up := r.s.up()
		n := up[rng.IntN(len(up))]
		u := r.s.users[rng.IntN(len(r.s.users))]
		if v, err := n.casView(u, casPW); err == nil {
			r.record(u, v)
			r.mu.Lock()
			r.watches++
			r.mu.Unlock()
		}
	}
}

// record notes the UIDs of a view: a UID naming another message than
// before, a UID below the highest one seen before that was not seen, and a
// UIDNEXT lower than one seen before are counted.
func (r *casRun) record(user string, v casMailbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.uids[user]
	if seen == nil {
		seen = map[uint32]int{}
		r.uids[user] = seen
	}
	var top uint32
	for uid := range seen {
		top = max(top, uid)
	}
	for _, m := range v.msgs {
		if m.seq < 0 {
			continue
		}
		prev, ok := seen[m.uid]
		switch {
		case ok && prev != m.seq:
			r.reused++
			if r.reused <= maxLostLogs {
				errorf(r.t, "%s: UID %d named seq %d and now seq %d", user, m.uid, prev, m.seq)
			}
		case !ok && m.uid < top:
			r.below++
		}
		seen[m.uid] = m.seq
	}
	if v.uidNext < r.uidNext[user] {
		r.uidNextDown++
		r.t.Logf("%s: UIDNEXT %d after %d", user, v.uidNext, r.uidNext[user])
	}
	r.uidNext[user] = max(r.uidNext[user], v.uidNext)
}

// casCheck is what one check found; message counts are of acknowledged
// deliveries.
type casCheck struct {
	what  string
	acked int
	// notVisible: through some node (lost: through every node);
	// unreadable: listed but its bytes could not be read.
	notVisible, lost, unreadable, wrong, dups int
	viewErrs                                  int
	changes, changesLost                      int
	reused, uidNextDown                       int
	took                                      time.Duration
}

func (c casCheck) missing() int { return c.notVisible + c.unreadable }

func (c casCheck) String() string {
	return fmt.Sprintf("%s: %d acknowledged; not visible through some node %d (through every node %d), unreadable %d, other bytes %d, duplicates %d, mailbox reads failed %d; IMAP changes %d acknowledged, %d not there; UIDs reused %d (read in %s)",
		c.what, c.acked, c.notVisible, c.lost, c.unreadable, c.wrong, c.dups, c.viewErrs, c.changes, c.changesLost, c.reused, c.took.Round(100*time.Millisecond))
}

// check reads every user's mailbox with its bodies through every quill
// node: each acknowledged message must be there once with its bytes
// (SHA-256 of the body), and each change the IMAP session got OK for.
func (r *casRun) check(what string, nodes []*Node) casCheck {
	t := r.t
	began := time.Now()
	// What was acknowledged so far (the stream may go on meanwhile).
	r.s.mu.Lock()
	acked := map[string][]int{}
	acks := map[string]map[int]ack{}
	for u, m := range r.s.acked {
		acks[u] = map[int]ack{}
		for k, a := range m {
			acked[u] = append(acked[u], k)
			acks[u][k] = a
		}
	}
	r.s.mu.Unlock()
	r.mu.Lock()
	reusedBefore, downBefore := r.reused, r.uidNextDown
	r.mu.Unlock()
	ck := casCheck{what: what}
	logged := 0
	for _, u := range r.s.users {
		sort.Ints(acked[u])
		ck.acked += len(acked[u])
		notHere := map[int]int{}
		for _, n := range nodes {
			v, err := n.casView(u, casPW)
			if err != nil {
				ck.viewErrs++
				errorf(t, "%s: %s through %s: %v", what, u, n.ID, err)
				continue
			}
			r.record(u, v)
			count := map[int]int{}
			sums := map[int][32]byte{}
			unread := map[int]bool{}
			r.mu.Lock()
			for i, m := range v.msgs {
				// A message whose bytes could not be read is named by
				// what its UID named before.
				if seq, ok := r.uids[u][m.uid]; ok && m.seq < 0 {
					v.msgs[i].seq = seq
				}
			}
			r.mu.Unlock()
			for _, m := range v.msgs {
				count[m.seq]++
				sums[m.seq] = m.sum
				unread[m.seq] = m.unreadable
			}
			for _, k := range acked[u] {
				switch {
				case count[k] == 0:
					notHere[k]++
					if logged++; logged <= maxLostLogs {
						t.Logf("%s: %s seq %d not visible through %s (%s)", what, u, k, n.ID, r.s.explain(acks[u][k]))
					}
				case unread[k]:
					ck.unreadable++
				case sums[k] != sha256.Sum256([]byte(casBody(r.seed, k))):
					ck.wrong++
				}
				if count[k] > 1 {
					ck.dups += count[k] - 1
				}
			}
		}
		for _, c := range notHere {
			ck.notVisible++
			if c == len(nodes) {
				ck.lost++
			}
		}
	}
	ck.changes, ck.changesLost = r.ch.check(what, nodes)
	r.mu.Lock()
	ck.reused, ck.uidNextDown = r.reused-reusedBefore, r.uidNextDown-downBefore
	r.mu.Unlock()
	ck.took = time.Since(began)
	t.Logf("check %s", ck)
	return ck
}

// report is the run's summary for the test's last lines and the docs.
func (r *casRun) report(title string, checks []casCheck) string {
	tried, failed := r.s.counts()
	fl, ex, refused := r.ch.counts()
	after := 0
	r.s.mu.Lock()
	for _, m := range r.s.acked {
		for _, a := range m {
			if a.at.After(r.killed) {
				after++
			}
		}
	}
	r.s.mu.Unlock()
	out := fmt.Sprintf("%s (keyspace %s): %d deliveries tried, %d acknowledged (%d after the kill), %d failed; IMAP session %d keywords + %d expunges acknowledged, %d refused; watcher %d reads, %d UIDs below one seen before",
		title, r.keyspace, tried, tried-failed, after, failed, fl, ex, refused, r.watches, r.below)
	for _, c := range checks {
		out += "\n  " + c.String()
	}
	return out
}

// casBody is message n's body: 2-12 KB of 76-character lines, drawn from
// the seed, so a check can hash what was sent without keeping it.
func casBody(seed uint64, n int) string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	size := 2048 + rng.IntN(10*1024)
	var b strings.Builder
	line := make([]byte, 76)
	for b.Len() < size {
		for i := range line {
			line[i] = alnum[rng.IntN(len(alnum))]
		}
		line[0] = 'x' // never a line that SMTP would dot-stuff or trim
		b.Write(line)
		b.WriteString("\r\n")
	}
	return b.String()
}

// casMailbox is a user's INBOX as one node shows it.
type casMailbox struct {
	uidNext uint32
	msgs    []casMessage
}

// casMessage is one message: its seq (-1 if its subject is not "seq N"),
// the SHA-256 of its body, its flags.
type casMessage struct {
	uid        uint32
	seq        int
	sum        [32]byte
	flags      []imap.Flag
	unreadable bool
}

// casView reads the user's INBOX through the node: UIDNEXT, and each
// message's UID, flags, subject and body. If the messages cannot be read
// all at once, each is read alone and one that fails is marked unreadable.
func (n *Node) casView(user, pw string) (casMailbox, error) {
	var v casMailbox
	conn, err := net.DialTimeout("tcp", n.Addrs["imap"], ioTimeout)
	if err != nil {
		return v, err
	}
	conn.SetDeadline(time.Now().Add(casViewTimeout))
	c := imapclient.New(conn, nil)
	defer c.Close()
	if err := c.Login(user, pw).Wait(); err != nil {
		return v, fmt.Errorf("login: %w", err)
	}
	sel, err := c.Select("INBOX", &imap.SelectOptions{ReadOnly: true}).Wait()
	if err != nil {
		return v, fmt.Errorf("select: %w", err)
	}
	v.uidNext = uint32(sel.UIDNext)
	if sel.NumMessages == 0 {
		return v, nil
	}
	whole := &imap.FetchItemBodySection{Peek: true}
	var all imap.SeqSet
	all.AddRange(1, 0)
	msgs, err := c.Fetch(all, &imap.FetchOptions{UID: true, Flags: true, BodySection: []*imap.FetchItemBodySection{whole}}).Collect()
	if err == nil {
		for _, m := range msgs {
			v.msgs = append(v.msgs, parseCasMessage(uint32(m.UID), m.Flags, m.FindBodySection(whole)))
		}
		return v, nil
	}
	list, err2 := c.Fetch(all, &imap.FetchOptions{UID: true, Flags: true}).Collect()
	if err2 != nil {
		return v, fmt.Errorf("fetch: %v; fetch without bodies: %w", err, err2)
	}
	for _, m := range list {
		one, err := c.Fetch(imap.UIDSetNum(m.UID), &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{whole}}).Collect()
		if err != nil || len(one) != 1 {
			v.msgs = append(v.msgs, casMessage{uid: uint32(m.UID), seq: -1, flags: m.Flags, unreadable: true})
			continue
		}
		v.msgs = append(v.msgs, parseCasMessage(uint32(m.UID), m.Flags, one[0].FindBodySection(whole)))
	}
	return v, nil
}

func parseCasMessage(uid uint32, flags []imap.Flag, raw []byte) casMessage {
	m := casMessage{uid: uid, seq: -1, flags: flags}
	head, body, ok := strings.Cut(string(raw), "\r\n\r\n")
	if !ok {
		m.unreadable = true
		return m
	}
	m.sum = sha256.Sum256([]byte(body))
	for _, l := range strings.Split(head, "\r\n") {
		if s, ok := strings.CutPrefix(l, "Subject: seq "); ok {
			if k, err := strconv.Atoi(s); err == nil {
				m.seq = k
			}
		}
	}
	return m
}

// changer is an IMAP session that changes one mailbox message after
// message: pass 0 expunges every fourth message (UID STORE \Deleted, UID
// EXPUNGE) and gives the others the keyword $Pass0, each later pass adds
// $Pass1, $Pass2, ... It keeps what the server acknowledged; on a broken
// connection it logs in again through a live node.
type changer struct {
	t     *testing.T
	nodes []*Node
	user  string
	uids  []uint32

	mu       sync.Mutex
	flagged  map[[2]uint32]bool // (UID, pass) acknowledged
	expunged map[uint32]bool
	// unsure are UIDs whose EXPUNGE got no answer: either is right;
	// inflight is the UID of the command under way (a check while the
	// session runs may see its change before the session saw the OK).
	unsure   map[uint32]bool
	inflight uint32
	refused  int
	why      map[string]int

	stop chan struct{}
	done chan struct{}
}

func newChanger(t *testing.T, nodes []*Node, user string) *changer {
	nodes[0].addUser(t, user, casPW)
	for i := range casChangeMessages {
		if err := nodes[i%len(nodes)].send(user, fmt.Sprintf("change %d", i)); err != nil {
			fatalf(t, "deliver change %d: %v", i, err)
		}
	}
	_, subj, _, err := nodes[0].imapView(user, casPW)
	if err != nil || len(subj) != casChangeMessages {
		fatalf(t, "%s: %d messages, want %d (%v)", user, len(subj), casChangeMessages, err)
	}
	ch := &changer{t: t, nodes: nodes, user: user, flagged: map[[2]uint32]bool{}, expunged: map[uint32]bool{},
		unsure: map[uint32]bool{}, why: map[string]int{}}
	for uid := range subj {
		ch.uids = append(ch.uids, uid)
	}
	sort.Slice(ch.uids, func(i, j int) bool { return ch.uids[i] < ch.uids[j] })
	return ch
}

// start runs the session, first through via, after a broken connection
// through a random node of up().
func (ch *changer) start(via *Node, up func() []*Node) {
	ch.stop, ch.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ch.done)
		rng := rand.New(rand.NewPCG(uint64(len(ch.uids)), 7))
		var c *rawIMAP
		dial := func() bool {
			for {
				select {
				case <-ch.stop:
					return false
				default:
				}
				var err error
				if c, err = dialRawIMAP(via, ch.user, casPW); err == nil {
					c.limit = casViewTimeout
					if _, err = c.cmd("SELECT INBOX"); err == nil {
						return true
					}
					c.conn.Close()
				}
				ch.note(err)
				time.Sleep(200 * time.Millisecond)
				ups := up()
				via = ups[rng.IntN(len(ups))]
			}
		}
		if !dial() {
			return
		}
		defer func() { c.conn.Close() }()
		for p := 0; ; p++ {
			for i, uid := range ch.uids {
				select {
				case <-ch.stop:
					return
				default:
				}
				ch.mu.Lock()
				gone := ch.expunged[uid] || ch.unsure[uid]
				ch.inflight = uid
				ch.mu.Unlock()
				if gone {
					continue
				}
				var err error
				if p == 0 && i%4 == 3 {
					if _, err = c.cmd(fmt.Sprintf(`UID STORE %d +FLAGS.SILENT (\Deleted)`, uid)); err == nil {
						_, err = c.cmd(fmt.Sprintf("UID EXPUNGE %d", uid))
						ch.mu.Lock()
						if err == nil {
							ch.expunged[uid] = true
						} else {
							ch.unsure[uid] = true
						}
						ch.mu.Unlock()
					}
				} else if _, err = c.cmd(fmt.Sprintf("UID STORE %d +FLAGS.SILENT ($Pass%d)", uid, p)); err == nil {
					ch.mu.Lock()
					ch.flagged[[2]uint32{uid, uint32(p)}] = true
					ch.mu.Unlock()
				}
				if err != nil {
					ch.note(err)
					c.conn.Close()
					if !dial() {
						return
					}
				}
			}
		}
	}()
}

// note counts a refused or failed command by its text, digits as #.
func (ch *changer) note(err error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.refused++
	ch.why[failureText(err)]++
	if ch.refused <= maxReadLogs {
		ch.t.Logf("IMAP session of %s: %v", ch.user, err)
	}
}

func (ch *changer) finish() {
	close(ch.stop)
	<-ch.done
}

func (ch *changer) counts() (flagged, expunged, refused int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return len(ch.flagged), len(ch.expunged), ch.refused
}

func (ch *changer) summary() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.t.Logf("IMAP session of %s: %d keywords and %d expunges acknowledged, %d commands refused or cut off, %d expunges without an answer",
		ch.user, len(ch.flagged), len(ch.expunged), ch.refused, len(ch.unsure))
	for k, n := range ch.why {
		ch.t.Logf("  %d× %s", n, k)
	}
}

// check reads the session's mailbox through every node: every
// acknowledged expunge and keyword must be there, and every message not
// expunged (or whose expunge got no answer) still listed. It returns how
// many changes were acknowledged and how many are not there (counted once
// per node).
func (ch *changer) check(what string, nodes []*Node) (changes, lost int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	changes = len(ch.flagged) + len(ch.expunged)
	for _, n := range nodes {
		_, _, flags, err := n.imapView(ch.user, casPW)
		if err != nil {
			errorf(ch.t, "%s: %s through %s: %v", what, ch.user, n.ID, err)
			lost += changes
			continue
		}
		bad := 0
		for _, uid := range ch.uids {
			_, listed := flags[uid]
			switch {
			case ch.expunged[uid] && listed:
				bad++
				ch.t.Logf("%s: %s UID %d expunged (acknowledged), yet listed through %s", what, ch.user, uid, n.ID)
			case !ch.expunged[uid] && !ch.unsure[uid] && uid != ch.inflight && !listed:
				bad++
				ch.t.Logf("%s: %s UID %d never expunged, yet missing through %s", what, ch.user, uid, n.ID)
			}
		}
		for k := range ch.flagged {
			if !hasFlag(flags[k[0]], imap.Flag(fmt.Sprintf("$Pass%d", k[1]))) {
				bad++
				if bad <= maxLostLogs {
					ch.t.Logf("%s: %s UID %d lacks $Pass%d (acknowledged) through %s", what, ch.user, k[0], k[1], n.ID)
				}
			}
		}
		lost += bad
	}
	return changes, lost
}

func hasFlag(fs []imap.Flag, f imap.Flag) bool {
	for _, x := range fs {
		if strings.EqualFold(string(x), string(f)) {
			return true
		}
	}
	return false
}

// loadAvg is the machine's load over the last minute, for the report.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func lastLineOf(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
