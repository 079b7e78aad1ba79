package cluster_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// faultParams reads QUILL_FAULTS (the number of faults, def when unset) and
// QUILL_FAULT_SEED (replays a run).
func faultParams(t *testing.T, def int) (faults int, seed uint64) {
	faults = def
	if v, err := strconv.Atoi(os.Getenv("QUILL_FAULTS")); err == nil && v > 0 {
		faults = v
	}
	seed = uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("QUILL_FAULT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (QUILL_FAULT_SEED replays), %d faults", seed, faults)
	return faults, seed
}

// TestFaultsLoseNoAcknowledgedMail delivers a stream of uniquely numbered
// messages to random users through random nodes while nodes are killed
// (SIGKILL, then restarted) and paused (SIGSTOP, then SIGCONT), one at a
// time. When every node is back, a checker reads every mailbox through every
// node: no acknowledged message may be missing (BLUEPRINT invariant 1);
// duplicates are counted. QUILL_FAULTS sets the number of faults (default a
// short run for CI; the long run is `make faults`). TestFaultsNetns adds
// partitions, full disks and wiped nodes.
func TestFaultsLoseNoAcknowledgedMail(t *testing.T) {
	faults, seed := faultParams(t, 6)
	rnd := rand.New(rand.NewPCG(seed, 1))
	// Beside the inbound stream, a user submits mail for another domain
	// (a sink in this process, found through a DNS server here too): the
	// outbound queue may not lose what submission acknowledged.
	sk := &sink{addr: freeAddr(t)}
	sk.serve(t)
	_, sinkPort, _ := net.SplitHostPort(sk.addr)
	nodes := startClusterWith(t, 3, "--dns", startDNS(t), "--outbound-port", sinkPort, "--queue-retry", "1s",
		"--submission", "127.0.0.1:0", "--submit-max-per-hour", "0")
	users := nodes[0].addUsers(t, "fault", 8, "pw")
	const sender = "sender@queue.test"
	nodes[0].createUser(t, sender, "pw")

	// The node set changes under the clients: they pick among the nodes
	// not currently faulty.
	s := newStream(t, nodes, users, "pw")
	s.start(4, seed, false)
	out := startOutbound(s, sk, sender)
	kinds := []string{faultKill9, faultSigstop, faultTerm, faultBurst}
	var lastFault time.Time
	for f := 0; f < faults; {
		time.Sleep(time.Duration(1000+rnd.IntN(2000)) * time.Millisecond)
		kind := kinds[rnd.IntN(len(kinds))]
		if kind == faultBurst {
			f = s.burst(t, nodes, rnd, f, faultKill9, faultSigstop)
			lastFault = time.Now()
			continue
		}
		victim := nodes[rnd.IntN(len(nodes))]
		s.setDown(victim, true)
		tried, failed := s.counts()
		rec := faultRecord{n: f, victim: victim.ID, start: time.Now(), kind: kind}
		stopFor(t, victim, rec.kind, rnd)
		s.setDown(victim, false)
		rec.end = time.Now()
		lastFault = rec.end
		s.record(rec, tried, failed)
		f++
	}
	s.finish()
	waitFor(t, "every node back with rebuilt soft state", 90*time.Second, func() bool { return ready(nodes) })
	tried, acked, missing, dups := out.finish(outboundLimit)
	t.Logf("outbound: %d submitted, %d acknowledged, %d never delivered to the remote server within %v, %d delivered more than once",
		tried, acked, missing, outboundLimit, dups)
	if missing > 0 {
		errorf(t, "outbound: %d of %d acknowledged submissions never reached the remote server", missing, acked)
	}
	waitHiddenCheck(t, lastFault)

	s.summary(t)
	if s.total() == 0 {
		fatalf(t, "no delivery was acknowledged")
	}
	r := s.check(t, nodes, "checker")
	t.Logf("checker %v after the last fault: acknowledged-but-lost %d, hidden (missing through some nodes) %d, duplicates %d (read through each of %d nodes)",
		time.Since(lastFault).Round(time.Second), r.lost, r.partial, r.dups, len(nodes))
	reportAudit(t, nodes)
}

// outboundLimit bounds the wait, once every node is back, for the
// outbound queue to deliver what submission acknowledged (a few retries at
// --queue-retry 1s, and a restarted leader's hold-off).
const outboundLimit = 60 * time.Second

// hiddenAfter is when the checker reads every mailbox through every node
// after the last fault: an acknowledged message missing from any node's
// view then counts against the run, whatever hid it (the writers' audit
// shows a stored message within this time).
const hiddenAfter = 60 * time.Second

// waitHiddenCheck waits until hiddenAfter has passed since the last fault.
func waitHiddenCheck(t *testing.T, lastFault time.Time) {
	if d := hiddenAfter - time.Since(lastFault); d > 0 {
		t.Logf("waiting %v more, so the check is %v after the last fault", d.Round(time.Second), hiddenAfter)
		time.Sleep(d)
	}
}

// reportAudit counts the repairs the writers' audit logged on every node in
// every life of it: each is a message that was hidden (or a mail map that
// was wrong) until the audit found it, a missed trigger to look into.
func reportAudit(t *testing.T, nodes []*Node) int {
	total := 0
	var lines []string
	for _, n := range nodes {
		for _, l := range n.logFiles() {
			b, _ := os.ReadFile(l)
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "msg=\"audit: ") {
					total++
					if len(lines) < 10 {
						lines = append(lines, line)
					}
				}
			}
		}
	}
	t.Logf("writers' audit: %d repairs logged across the nodes", total)
	for _, l := range lines {
		t.Logf("  %s", l)
	}
	return total
}

// Fault kinds of the fault tests.
const (
	faultKill9     = "kill9"     // SIGKILL, restart after 1-4 s
	faultSigstop   = "sigstop"   // SIGSTOP for 2-8 s, then SIGCONT
	faultTerm      = "term"      // SIGTERM (a clean shutdown: exit status 0, no panic), start again at once
	faultBurst     = "burst"     // 3-5 faults back to back on different nodes, mostly clean restarts
	faultPartition = "partition" // one node cut from the others for 3-8 s
	faultDiskFull  = "diskfull"  // the node's disk filled to nsFillLeaves free for 3-8 s
	faultWipe      = "wipe"      // SIGKILL, data directory emptied, restart as a new node
)

// faultKinds are the kinds of TestFaultsNetns; wipe stays last (the
// random choices leave it out).
var faultKinds = []string{faultKill9, faultSigstop, faultTerm, faultBurst, faultPartition, faultDiskFull, faultWipe}

// stopFor runs a kill9 fault (SIGKILL, restart after 1-4 s), a sigstop
// fault (SIGSTOP for 2-8 s, then SIGCONT) or a term fault (SIGTERM, start
// again as soon as it exited) on the victim; a clean shutdown that does not
// exit with status 0, or panics, is an error.
func stopFor(t *testing.T, victim *Node, kind string, rnd *rand.Rand) {
	switch kind {
	case faultKill9:
		victim.Kill9()
		time.Sleep(time.Duration(1000+rnd.IntN(3000)) * time.Millisecond)
		victim.Restart()
	case faultTerm:
		if err := victim.Term(); err != nil {
			errorf(t, "clean restart: %v", err)
		}
		victim.Restart()
	default:
		victim.Pause()
		time.Sleep(time.Duration(2000+rnd.IntN(6000)) * time.Millisecond)
		victim.Resume()
	}
}

// burst runs 3-5 faults back to back, each on another node than the one
// before and never two nodes down at once: mostly clean restarts, the
// others drawn from also (kill9, sigstop). Bucket handoffs follow each
// other faster than soft state settles, the pattern that hid two messages
// in the independent checker's run (clean restarts of nodes 0, 2, 0, 1,
// then a SIGSTOP of 1). Each fault is recorded; it returns the next fault
// number.
func (s *stream) burst(t *testing.T, nodes []*Node, rnd *rand.Rand, f int, also ...string) int {
	steps := 3 + rnd.IntN(3)
	var last *Node
	for i := 0; i < steps; i++ {
		victim := nodes[rnd.IntN(len(nodes))]
		for victim == last {
			victim = nodes[rnd.IntN(len(nodes))]
		}
		last = victim
		kind := faultTerm
		if len(also) > 0 && rnd.IntN(4) == 0 {
			kind = also[rnd.IntN(len(also))]
		}
		tried, failed := s.counts()
		rec := faultRecord{n: f, kind: kind, victim: victim.ID, start: time.Now(), note: fmt.Sprintf(" (burst step %d of %d)", i+1, steps)}
		s.setDown(victim, true)
		stopFor(t, victim, kind, rnd)
		s.setDown(victim, false)
		rec.end = time.Now()
		s.record(rec, tried, failed)
		f++
	}
	return f
}

// replStatus is the JSON of GET /api/replication.
type replStatus struct {
	Node            string    `json:"node"`
	Objects         int64     `json:"objects"`
	Replicas        int       `json:"replicas"`
	LogPending      int64     `json:"log_pending"`
	LogWaiting      int64     `json:"log_waiting_absent"`
	UnderReplicated int64     `json:"under_replicated"`
	LastRepair      time.Time `json:"last_repair"`
}

// Replication reads GET /api/replication from the node.
func (n *Node) Replication() (replStatus, error) {
	var r replStatus
	err := n.get("/api/replication", &r)
	return r, err
}

// fullyReplicated reports whether every node has nothing left in its
// update log and knows of no object with fewer than its replicas.
func fullyReplicated(nodes []*Node) (bool, string) {
	ok, st, _ := replicatedSince(nodes, time.Time{})
	return ok, st
}

// replicatedSince is fullyReplicated with every node's last repair scan
// begun after since (a scan from before a fault may not know of it); it
// also returns the nodes' statuses.
func replicatedSince(nodes []*Node, since time.Time) (bool, string, []replStatus) {
	var parts []string
	var all []replStatus
	ok := true
	for _, n := range nodes {
		r, err := n.Replication()
		if err != nil {
			return false, err.Error(), nil
		}
		all = append(all, r)
		parts = append(parts, fmt.Sprintf("%s: objects %d, log_pending %d, under_replicated %d", n.ID, r.Objects, r.LogPending, r.UnderReplicated))
		if r.LogPending != 0 || r.UnderReplicated != 0 || !r.LastRepair.After(since) {
			ok = false
		}
	}
	return ok, strings.Join(parts, "; "), all
}

// wipeSafe reports whether the victim may be wiped with no loss but what
// write policy one allows: a repair scan on every node begun after since
// found no object short of live replicas, and the victim's update log has
// nothing left to push to live nodes; then only messages acknowledged after
// the victim's scan began can be on it alone, and it returns that time.
// With full, every node must be fully replicated (fullyReplicated). It
// also returns the objects short of replicas summed over the nodes.
func wipeSafe(nodes []*Node, victim *Node, since time.Time, full bool) (bool, string, time.Time, int64) {
	var parts []string
	var from time.Time
	var backlog int64
	ok := true
	for _, n := range nodes {
		r, err := n.Replication()
		if err != nil {
			return false, err.Error(), from, 0
		}
		backlog += r.UnderReplicated
		parts = append(parts, fmt.Sprintf("%s: log_pending %d, log_waiting_absent %d, under_replicated %d, scan %v ago",
			n.ID, r.LogPending, r.LogWaiting, r.UnderReplicated, time.Since(r.LastRepair).Round(100*time.Millisecond)))
		if r.UnderReplicated != 0 || !r.LastRepair.After(since) || ((full || n == victim) && r.LogPending != 0) {
			ok = false
		}
		if n == victim {
			from = r.LastRepair
		}
	}
	return ok, strings.Join(parts, "; "), from, backlog
}

// stillCounted names a node that still counts one of the wiped ids as a
// live member (failure detection has not caught up), or "".
func stillCounted(nodes []*Node, wiped []string) string {
	if len(wiped) == 0 {
		return ""
	}
	for _, n := range nodes {
		st, err := n.Status()
		if err != nil {
			return fmt.Sprintf("%s: status: %v", n.ID, err)
		}
		for _, m := range st.Members {
			if slices.Contains(wiped, string(m.ID)) && m.State != "dead" && m.State != "left" {
				return fmt.Sprintf("%s still counts wiped node %s as %s", n.ID, m.ID, m.State)
			}
		}
	}
	return ""
}

// setWritePolicy sets a user's write policy through the node.
func (n *Node) setWritePolicy(t *testing.T, addr, policy string) {
	t.Helper()
	if err := n.api(http.MethodPut, "/api/users/"+addr+"/replication", map[string]string{"write_policy": policy}, nil); err != nil {
		fatalf(t, "write policy of %s: %v", addr, err)
	}
}

// Settings of TestFaultsNetns.
const (
	// netFaultNodes is the cluster size: with 2 replicas, any one node
	// may be wiped, or killed for good at the end.
	netFaultNodes = 3
	netReplicas   = 2
	// netReplaceAfter is --replace-after: how long a node may be away
	// before its messages get replicas elsewhere; longer than any kill,
	// pause or partition here, so only a wiped node (whose old id never
	// returns) is replaced.
	netReplaceAfter = 20 * time.Second
	// timeToRLimit bounds the wait for every message to have its replicas
	// again after the last fault.
	timeToRLimit = 3 * time.Minute
	// wipeGateWait bounds the wait before a wipe for the victim's update
	// log to be empty (and, before a second wipe, for the whole cluster
	// to be fully replicated): under the delivery stream the logs are
	// rarely empty for long. A wipe that cannot go ahead is a SIGKILL.
	wipeGateWait = 15 * time.Second
	// wipeGateBacklog is the count of objects short of replicas (summed
	// over the nodes) above which the gate gives up at once instead of
	// waiting wipeGateWait: repair makes a few hundred copies a second
	// under the stream, so more cannot clear within the wait.
	wipeGateBacklog = 2000
	// diskFullWait bounds the wait for a filled node to flag its disk
	// full.
	diskFullWait = 15 * time.Second
	// netDiskPerFault sizes each node's tmpfs by the length of the run,
	// up to netDiskMax: a full-disk fault writes a filler of nearly the
	// whole tmpfs, which lives in memory (48 GB tmpfs for a 1,000-fault
	// run had the kernel kill the test).
	netDiskPerFault = 48 << 20
	netDiskMax      = 6 << 30
)

// TestFaultsNetns is the fault harness over real processes in network
// namespaces (issue 5). While 4 clients deliver uniquely numbered messages
// to random users through random nodes, and read every 20th back, one fault
// at a time hits a random node of 3 (2 replicas per message): kill -9 and
// restart, SIGSTOP/SIGCONT, a network partition cutting it from the others,
// a full disk (its tmpfs filled), or a wipe (kill -9, data directory
// emptied, back as a new node; one wipe per 20 faults, at least one, never
// a second before the cluster reports every message fully replicated).
// Half the users have write policy quorum: a wipe may lose none of their
// acknowledged mail; the others have the default, one, which may lose a
// message acknowledged just before its node is wiped (see oneWindow).
// After the last fault the test measures the time until every node reports
// every message back at 2 copies (GET /api/replication), then reads every
// mailbox through every node: acknowledged-but-lost must be 0, duplicates
// are counted. Last, it kills one node for good and checks that every
// acknowledged message is still readable through the survivors.
// QUILL_FAULTS sets the number of faults (CI runs the default; `make
// faults` a long run), QUILL_FAULT_SEED replays one. Needs root; skipped
// otherwise.
func TestFaultsNetns(t *testing.T) {
	requireNetns(t)
	faults, seed := faultParams(t, 12)
	rnd := rand.New(rand.NewPCG(seed, 1))
	extra := []string{"--replicas", strconv.Itoa(netReplicas), "--min-free", strconv.Itoa(nsMinFree),
		"--replace-after", netReplaceAfter.String()}
	// Room for the run: write-ahead logs of ~70 MB each and the mail of a
	// long run (see nsDiskSize); a disk full outside the full-disk fault
	// would refuse mail for the wrong reason.
	diskSize := min(max(nsDiskSize, int64(faults)*netDiskPerFault), netDiskMax)
	c := startNetCluster(t, netFaultNodes, netOptions{tmpfs: true, diskSize: diskSize, extra: extra})
	nodes := c.Nodes
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	var users []string
	policy := map[string]string{}
	for i := 0; i < 8; i++ {
		u := fmt.Sprintf("netfault%d@cluster.example", i)
		users = append(users, u)
		nodes[0].createUser(t, u, "pw")
		if i%2 == 1 {
			nodes[0].setWritePolicy(t, u, "quorum")
			policy[u] = "quorum"
		}
	}

	// The plan: every kind once (as far as the number of faults allows),
	// one wipe per 20 faults (QUILL_WIPE_EVERY sets another share, to try
	// the wipe gate hard), the rest kills, pauses, partitions and full
	// disks; in random order.
	wipeEvery := 20
	if v, err := strconv.Atoi(os.Getenv("QUILL_WIPE_EVERY")); err == nil && v > 0 {
		wipeEvery = v
		t.Logf("one wipe per %d faults (QUILL_WIPE_EVERY)", v)
	}
	plan := append([]string(nil), faultKinds...)
	rnd.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	if faults < len(plan) {
		plan = plan[:faults]
	}
	for w := 1; w < faults/wipeEvery && len(plan) < faults; w++ {
		plan = append(plan, faultWipe)
	}
	for len(plan) < faults {
		plan = append(plan, faultKinds[rnd.IntN(len(faultKinds)-1)])
	}
	rnd.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })

	s := newStream(t, nodes, users, "pw")
	s.policy = policy
	s.start(4, seed, true)
	kinds := map[string]int{}
	wiped := false
	// wipedIDs are the old ids of wiped nodes: gone for good.
	var wipedIDs []string
	var wipeWatches []chan string
	lowDisk := map[*Node]bool{}
	var lastFault time.Time
	// f counts the faults injected (a burst is several); i walks the plan.
	f := 0
	for i := 0; i < len(plan) && f < faults; i++ {
		kind := plan[i]
		time.Sleep(time.Duration(1000+rnd.IntN(2000)) * time.Millisecond)
		victim := nodes[rnd.IntN(len(nodes))]
		hold := time.Duration(3000+rnd.IntN(5000)) * time.Millisecond
		rec := faultRecord{n: f, kind: kind, victim: victim.ID}
		var safeFrom time.Time
		if kind == faultWipe {
			// A wipe waits until it can lose only what write policy one
			// allows (see oneWindow), and, after a first wipe, until the
			// cluster is fully replicated again.
			ok, st := false, ""
			gate := time.Now()
			start := gate
			for !ok && time.Since(start) < wipeGateWait {
				var backlog int64
				if ghost := stillCounted(nodes, wipedIDs); ghost != "" {
					// A node that still counts an earlier wiped node's
					// old id as alive reports copies on it as copies:
					// its under_replicated says nothing yet. (Session 7's
					// 1,000-fault run wiped a second node 6.5 s after a
					// first one this way and lost every message whose two
					// copies were on those two nodes.)
					// Only repair scans begun after it is gone count.
					st, gate = ghost, time.Now()
					time.Sleep(100 * time.Millisecond)
					continue
				}
				ok, st, safeFrom, backlog = wipeSafe(nodes, victim, gate, wiped)
				if !ok && backlog > wipeGateBacklog {
					// The repair cannot catch up within the wait: do not
					// spend it (late in a long run, each wipe leaves
					// tens of thousands of copies to make again).
					break
				}
				if !ok {
					time.Sleep(100 * time.Millisecond)
				}
			}
			if ok {
				// What the gate saw: the evidence a wipe went by.
				t.Logf("fault %d: wipe gate passed after %v: %s", f, time.Since(start).Round(100*time.Millisecond), st)
			}
			if !ok {
				kind = faultKinds[rnd.IntN(len(faultKinds)-1)]
				rec.kind = kind
				t.Logf("fault %d: no wipe, replication not there yet after %v (%s); %s instead", f, time.Since(start).Round(100*time.Millisecond), st, kind)
				// Try again a few faults on (or next, near the end).
				for _, g := range []int{i + 3, i + 2, i + 1} {
					if g < len(plan) && plan[g] != faultWipe {
						plan[g] = faultWipe
						break
					}
				}
			}
		}
		rec.start = time.Now()
		tried, failed := s.counts()
		switch kind {
		case faultKill9, faultSigstop, faultTerm:
			s.setDown(victim, true)
			stopFor(t, victim, kind, rnd)
			s.setDown(victim, false)
		case faultBurst:
			// Its steps are recorded (and counted) one by one.
			f = s.burst(t, nodes, rnd, f, faultKill9, faultSigstop)
			lastFault = time.Now()
			kinds[kind]++
			continue
		case faultPartition:
			c.Partition([]*Node{victim}, without(nodes, victim))
			time.Sleep(hold)
			c.Heal()
		case faultDiskFull:
			rec.note = diskFull(t, c, nodes, victim, f, hold)
		case faultWipe:
			s.setDown(victim, true)
			old := victim.ID
			s.mu.Lock()
			s.oneWindows = append(s.oneWindows, oneWindow{from: safeFrom.Add(-time.Second), to: time.Now().Add(time.Second), fault: f})
			s.mu.Unlock()
			c.Wipe(victim)
			wipedIDs = append(wipedIDs, old)
			s.setDown(victim, false)
			rec.note = " (back as " + victim.ID + ")"
			rec.victim = old
			wiped = true
			wipeWatches = append(wipeWatches, watchWipe(t, nodes, f, time.Now()))
		}
		rec.end = time.Now()
		lastFault = rec.end
		kinds[kind]++
		s.record(rec, tried, failed)
		f++
		// A disk full outside the full-disk fault skews the run: say so.
		for _, n := range nodes {
			if free := c.FreeBytes(n); free >= 0 && free < nsMinFree && !lowDisk[n] {
				lowDisk[n] = true
				t.Logf("after fault %d: %s has %d MiB free of %d (under --min-free, outside the full-disk fault): it takes no new mail",
					f, n.ID, free>>20, diskSize>>20)
			}
		}
		// A node that died by itself is an error; it is started again
		// so the run goes on and the checker still counts.
		for _, n := range nodes {
			if n.Exited() {
				errorf(t, "node %s exited by itself (%v) during or after fault %d; stderr:\n%s", n.ID, n.cmd.ProcessState, f, tail(n.Stderr(), 30))
				n.stopped = true
				n.Restart()
			}
		}
	}
	s.finish()

	// Time to R copies: from the end of the last fault until every node
	// agrees on the members, has rebuilt its soft state, and then (a
	// repair scan begun after that) reports an empty update log and no
	// object short of its replicas. If it never comes, the checker still
	// runs.
	waitFor(t, "every node up with rebuilt soft state", 120*time.Second, func() bool { return ready(nodes) })
	upAfter := time.Since(lastFault)
	settled := time.Now()
	var timeToR time.Duration
	var replState string
	var repl []replStatus
	for {
		ok, st, all := replicatedSince(nodes, settled)
		replState, repl = st, all
		if ok {
			timeToR = time.Since(lastFault)
			break
		}
		if time.Since(lastFault) > timeToRLimit {
			errorf(t, "not every message back at %d copies %v after the last fault: %s", netReplicas, timeToRLimit, st)
			timeToR = -1
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("replication after the run: %s", replState)
	if timeToR >= 0 {
		// Each node's object count is from its last repair scan, which
		// may have begun while another node's re-homing was still
		// pushing copies to it (CI, 2026-11-24: 331 copies short while
		// every node said all was replicated; nothing was lost). The
		// counts are taken again from scans begun after that moment.
		// If that never comes, the earlier counts stand and the checks
		// below (census, a node killed for good) still run.
		counted := time.Now()
		for time.Since(counted) < 60*time.Second {
			if ok, _, all := replicatedSince(nodes, counted); ok {
				repl = all
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	waitHiddenCheck(t, lastFault)
	s.summary(t)
	if s.total() == 0 {
		fatalf(t, "no delivery was acknowledged")
	}
	res := s.check(t, nodes, "checker")
	audits := reportAudit(t, nodes)
	var objects int64
	for _, r := range repl {
		objects += r.Objects
	}
	acked := s.total()
	if want := int64(netReplicas * (acked - res.lost - res.oneWindow)); timeToR >= 0 && objects < want {
		// Each acknowledged message is one object on each of its
		// replicas; profiles and messages not acknowledged add more.
		errorf(t, "the nodes hold %d objects, fewer than %d acknowledged messages × %d replicas", objects, acked-res.lost-res.oneWindow, netReplicas)
		defer census(t, nodes, netReplicas)
	} else if os.Getenv("QUILL_CENSUS") != "" {
		defer census(t, nodes, netReplicas)
	}

	// The strongest check of replication: one node gone for good, every
	// acknowledged message is still there through the others.
	victim := nodes[rnd.IntN(len(nodes))]
	victim.Kill9()
	survivors := without(nodes, victim)
	waitFor(t, "the survivors to agree without the killed node, soft state rebuilt", 90*time.Second, func() bool { return ready(survivors) })
	agreed := time.Now()
	missing := -1
	for missing != 0 && time.Since(agreed) < 60*time.Second {
		if missing = s.missingAnywhere(survivors); missing != 0 {
			time.Sleep(time.Second)
		}
	}
	visible := time.Since(agreed)
	var after checkResult
	if missing != 0 {
		after = s.check(t, survivors, "after killing "+victim.ID+" for good")
	}

	var wipeTimes []string
	for _, w := range wipeWatches {
		wipeTimes = append(wipeTimes, <-w)
	}

	// Kinds of the faults injected (a burst's steps by their own kind),
	// and the number of bursts.
	bursts := kinds[faultBurst]
	kinds = map[string]int{}
	s.mu.Lock()
	for _, fr := range s.faults {
		kinds[fr.kind]++
	}
	s.mu.Unlock()
	if bursts > 0 {
		kinds["(in bursts: "+strconv.Itoa(bursts)+")"] = 0
	}
	var kindList []string
	for k := range kinds {
		kindList = append(kindList, k)
	}
	sort.Strings(kindList)
	var kindCounts []string
	for _, k := range kindList {
		if strings.HasPrefix(k, "(") {
			kindCounts = append(kindCounts, k)
			continue
		}
		kindCounts = append(kindCounts, fmt.Sprintf("%s %d", k, kinds[k]))
	}
	s.mu.Lock()
	attempts := s.attempts
	s.mu.Unlock()
	ttr := "not reached"
	if timeToR >= 0 {
		ttr = timeToR.Round(100 * time.Millisecond).String()
	}
	t.Logf("faults: %d on %d nodes in network namespaces, %d replicas, write policy one for 4 users and quorum for 4 (%s)",
		f, len(nodes), netReplicas, strings.Join(kindCounts, ", "))
	t.Logf("every node up with rebuilt soft state %v after the last fault", upAfter.Round(100*time.Millisecond))
	var disks []string
	for _, n := range nodes {
		disks = append(disks, fmt.Sprintf("%s %d MiB", n.ID, c.UsedBytes(n)>>20))
	}
	t.Logf("disk used (tmpfs of %d MiB each, --min-free %d MiB): %s", diskSize>>20, nsMinFree>>20, strings.Join(disks, ", "))
	t.Logf("time until every message had %d copies again: %s after the last fault ended", netReplicas, ttr)
	for _, w := range wipeTimes {
		t.Logf("%s", w)
	}
	t.Logf("checker (%v after the last fault): acknowledged-but-lost %d, lost within write policy one's window before a wipe %d, hidden (missing through some nodes) %d, duplicates %d (every mailbox read through each of %d nodes); audit repairs %d",
		hiddenAfter, res.lost, res.oneWindow, res.partial, res.dups, len(nodes), audits)
	if missing == 0 {
		t.Logf("after SIGKILL of %s for good: acknowledged-but-lost 0 through the %d survivors (all visible %v after they agreed)",
			victim.ID, len(survivors), visible.Round(100*time.Millisecond))
	} else {
		t.Logf("after SIGKILL of %s for good: acknowledged-but-lost %d, missing through some survivors %d (of %d survivors)",
			victim.ID, after.lost, after.partial, len(survivors))
	}
	t.Logf("| faults | kinds | tried | acknowledged | lost | lost in one's window | duplicates | time to %d copies | lost after a node is gone |", netReplicas)
	t.Logf("| %d | %s | %d | %d | %d | %d | %d | %s | %d |", f, strings.Join(kindCounts, ", "), attempts, acked,
		res.lost, res.oneWindow, res.dups, ttr, after.lost)
}

// watchWipe measures, in the background, the time from the return of a
// wiped node (at back) until every message has its replicas again: every
// node's user map has the new node and not the old one (agree), then a
// repair scan begun after that finds nothing short and the update logs are
// empty. Later faults may slow it; it gives up after timeToRLimit. The
// channel carries one line for the report.
func watchWipe(t *testing.T, nodes []*Node, f int, back time.Time) chan string {
	out := make(chan string, 1)
	go func() {
		settled := time.Time{}
		for time.Since(back) < timeToRLimit {
			if settled.IsZero() {
				if agree(nodes, nodes) {
					settled = time.Now()
				}
			} else if ok, _, _ := replicatedSince(nodes, settled); ok {
				out <- fmt.Sprintf("wipe (fault %d): every message back at %d copies %v after the wiped node came back (members agreed after %v; --replace-after %v)",
					f, netReplicas, time.Since(back).Round(100*time.Millisecond), settled.Sub(back).Round(100*time.Millisecond), netReplaceAfter)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		out <- fmt.Sprintf("wipe (fault %d): not every message back at %d copies %v after the wiped node came back", f, netReplicas, timeToRLimit)
	}()
	return out
}

// diskFull fills the victim's disk, waits until the node itself says its
// disk is full (it looks every few seconds), holds that for hold so the
// cluster runs with a full node, frees the disk and describes what
// happened.
func diskFull(t *testing.T, c *netCluster, nodes []*Node, victim *Node, f int, hold time.Duration) string {
	if err := c.Fill(victim); err != nil {
		fatalf(t, "fault %d: fill the disk of %s: %v", f, victim.ID, err)
	}
	free := c.FreeBytes(victim)
	filled := time.Now()
	self, all := time.Duration(-1), time.Duration(-1)
	for time.Since(filled) < diskFullWait && self < 0 {
		if seenDiskFull([]*Node{victim}, victim) {
			self = time.Since(filled)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for held := time.Now(); time.Since(held) < hold; time.Sleep(100 * time.Millisecond) {
		if all < 0 && seenDiskFull(nodes, victim) {
			all = time.Since(filled)
		}
	}
	if err := c.Unfill(victim); err != nil {
		fatalf(t, "fault %d: free the disk of %s: %v", f, victim.ID, err)
	}
	note := fmt.Sprintf(" (%d MiB free; ", free>>20)
	switch {
	case self < 0:
		errorf(t, "fault %d: %s with %d MiB free (--min-free %d MiB) did not flag its disk full within %v",
			f, victim.ID, free>>20, nsMinFree>>20, diskFullWait)
		return note + fmt.Sprintf("the node never said its disk was full in %v)", diskFullWait)
	case all < 0:
		return note + fmt.Sprintf("full in its own view after %v, not in every node's)", self.Round(100*time.Millisecond))
	default:
		return note + fmt.Sprintf("full in its own view after %v, in every node's after %v; held %v after that)",
			self.Round(100*time.Millisecond), all.Round(100*time.Millisecond), hold.Round(100*time.Millisecond))
	}
}

// seenDiskFull reports whether every node's view flags n's disk as full.
func seenDiskFull(nodes []*Node, n *Node) bool {
	for _, o := range nodes {
		st, err := o.Status()
		if err != nil {
			return false
		}
		full := false
		for _, m := range st.Members {
			if string(m.ID) == n.ID && m.DiskFull {
				full = true
			}
		}
		if !full {
			return false
		}
	}
	return true
}
