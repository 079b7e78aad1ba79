package cluster_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/quillmail/quill/internal/cluster"
)

// redoReps is how many kill -9 rounds TestRedoKill9KeepsAcknowledgedChanges
// runs: QUILL_REDO_REPS (docs/reliability.md gives 100), 3 by default so
// CI stays within its time (about 15 s a round).
func redoReps(t *testing.T) int {
	if s := os.Getenv("QUILL_REDO_REPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("QUILL_REDO_REPS=%q: want a positive number", s)
		}
		return n
	}
	return 3
}

// boxState is what one IMAP session saw of a mailbox.
type boxState struct {
	uidNext, modseq uint64
	subj            map[uint32]string
	flags           map[uint32][]imap.Flag
}

// redoSession is an IMAP session with deadlines, so a node that stalls
// fails the call instead of the test.
func redoSession(n *Node, user, pw string) (*imapclient.Client, error) {
	conn, err := net.DialTimeout("tcp", n.Addrs["imap"], ioTimeout)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	c := imapclient.New(conn, nil)
	if err := c.Login(user, pw).Wait(); err != nil {
		c.Close()
		return nil, fmt.Errorf("login through %s: %w", n.ID, err)
	}
	return c, nil
}

// look selects a mailbox (CONDSTORE) and reads every message's subject and
// flags.
func look(c *imapclient.Client, name string) (*boxState, error) {
	sel, err := c.Select(name, &imap.SelectOptions{CondStore: true}).Wait()
	if err != nil {
		return nil, err
	}
	st := &boxState{uidNext: uint64(sel.UIDNext), modseq: sel.HighestModSeq, subj: map[uint32]string{}, flags: map[uint32][]imap.Flag{}}
	if sel.NumMessages == 0 {
		return st, nil
	}
	var all imap.SeqSet
	all.AddRange(1, 0)
	msgs, err := c.Fetch(all, &imap.FetchOptions{UID: true, Flags: true, Envelope: true}).Collect()
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		st.subj[uint32(m.UID)] = m.Envelope.Subject
		st.flags[uint32(m.UID)] = m.Flags
	}
	return st, nil
}

// lookBoth reads INBOX and Archive through node n.
func lookBoth(n *Node, user, pw string) (inbox, archive *boxState, err error) {
	c, err := redoSession(n, user, pw)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	if inbox, err = look(c, "INBOX"); err != nil {
		return nil, nil, err
	}
	if archive, err = look(c, "Archive"); err != nil {
		return nil, nil, err
	}
	c.Logout().Wait()
	return inbox, archive, nil
}

// acked is what the writer acknowledged before it was killed.
type acked struct {
	inbox, archive *boxState // as the last acknowledged command left them
	expunged       []string  // subjects expunged
	moved          []string  // subjects moved to Archive
}

// older says how a mailbox seen after the kill is older than the
// acknowledged one (empty: it is not).
func older(box string, got, want *boxState, gone []string) string {
	if got.modseq < want.modseq {
		return fmt.Sprintf("%s HIGHESTMODSEQ %d, was %d", box, got.modseq, want.modseq)
	}
	if got.uidNext < want.uidNext {
		return fmt.Sprintf("%s UIDNEXT %d, was %d", box, got.uidNext, want.uidNext)
	}
	bySubj := map[string]uint32{}
	for uid, s := range got.subj {
		bySubj[s] = uid
	}
	for _, s := range gone {
		if uid, ok := bySubj[s]; ok {
			return fmt.Sprintf("%s shows %q (UID %d), expunged or moved away", box, s, uid)
		}
	}
	for uid, s := range want.subj {
		guid, ok := bySubj[s]
		if !ok {
			return fmt.Sprintf("%s lacks %q (UID %d)", box, s, uid)
		}
		if guid != uid {
			return fmt.Sprintf("%s shows %q under UID %d, was %d", box, s, guid, uid)
		}
		for _, f := range want.flags[uid] {
			if f != `\Recent` && !slices.Contains(got.flags[guid], f) { // \Recent belongs to a session
				return fmt.Sprintf("%s %q (UID %d) lost flag %s: %v, was %v", box, s, uid, f, got.flags[guid], want.flags[uid])
			}
		}
	}
	return ""
}

// A writer killed with kill -9 right after acknowledged STORE, EXPUNGE and
// MOVE batches loses none of them (Neptune's REDO log, issue 17 item 3):
// the bucket's next manager replays its log before serving, and every
// surviving node, then the returning one, shows every acknowledged change.
// A client that alternates nodes throughout never sees an older state than
// the acknowledged one: HIGHESTMODSEQ, UIDNEXT, a flag, an expunged or
// moved message (item 4).
//
// What makes the loss possible without the log: the writer writes a change
// through one replica (its own node when it holds the message) and answers;
// here the message's other replica is paused (SIGSTOP) while the batches
// run, so the change is on the dying node alone when it is killed. The
// user is chosen so that the writer's node ranks first for the bucket, the
// proxy's second (the secondary, which takes over) and the paused node
// third; each round rotates the roles.
func TestRedoKill9KeepsAcknowledgedChanges(t *testing.T) {
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	reps := redoReps(t)
	perms := [][3]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {1, 0, 2}, {2, 1, 0}}
	const pw = "pw"
	start := time.Now()
	for rep := 0; rep < reps; rep++ {
		p := perms[rep%len(perms)]
		writer, proxy, paused := nodes[p[0]], nodes[p[1]], nodes[p[2]]
		user := userRankedAs(t, rep, writer, proxy, paused)
		redoRound(t, rep, nodes, writer, proxy, paused, user, pw)
		t.Logf("round %d/%d done (%s)", rep+1, reps, time.Since(start).Round(time.Second))
	}
}

// userRankedAs returns an address whose bucket ranks the three nodes in
// this order.
func userRankedAs(t *testing.T, rep int, order ...*Node) string {
	members := make([]cluster.Member, len(order))
	for i, n := range order {
		members[i] = cluster.Member{ID: cluster.NodeID(n.ID)}
	}
	for i := 0; i < 100000; i++ {
		u := fmt.Sprintf("redo%d-%d@cluster.example", rep, i)
		r := cluster.Ranked(cluster.Bucket(u), members)
		ok := true
		for j := range order {
			ok = ok && string(r[j].ID) == order[j].ID
		}
		if ok {
			return u
		}
	}
	fatalf(t, "no user ranks the nodes %v", members)
	return ""
}

func redoRound(t *testing.T, rep int, nodes []*Node, writer, proxy, paused *Node, user, pw string) {
	proxy.addUser(t, user, pw)
	// The user's mail spreads over all three nodes, so some message is
	// held by the writer's node and the paused one (with the cluster's
	// spread a user's mail may sit on two nodes only, and a round whose
	// mail is on the writer's and the proxy's could not lose anything).
	if err := proxy.api(http.MethodPut, "/api/users/"+user+"/spread", map[string]int{"spread": 3}, nil); err != nil {
		fatalf(t, "round %d: spread of %s: %v", rep, user, err)
	}
	const count = 9
	for i := 0; i < count; i++ {
		if err := nodes[i%3].send(user, fmt.Sprintf("r%d m%d", rep, i)); err != nil {
			fatalf(t, "round %d: delivery: %v", rep, err)
		}
	}
	c, err := redoSession(proxy, user, pw)
	if err != nil {
		fatalf(t, "round %d: %v", rep, err)
	}
	defer c.Close()
	st, err := look(c, "INBOX")
	if err != nil || len(st.subj) != count {
		fatalf(t, "round %d: INBOX through %s: %v (%d messages, want %d)", rep, proxy.ID, err, len(st.subj), count)
	}
	var uids []uint32
	for uid := range st.subj {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	set := func(us ...uint32) imap.UIDSet {
		var s imap.UIDSet
		for _, u := range us {
			s.AddNum(imap.UID(u))
		}
		return s
	}
	var a acked
	// The batches, with the message's other replica paused.
	paused.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			paused.Resume()
			resumed = true
		}
	}
	defer resume()
	// Each batch is tried until acknowledged: one that went through the
	// paused node (a message it holds) fails UNAVAILABLE once the node is
	// declared dead, and is sent again (each is idempotent).
	run := func(what string, do func() error) {
		var err error
		for try := 0; try < 20; try++ {
			if err = do(); err == nil || imapCode(err) != imap.ResponseCodeUnavailable {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			resume()
			fatalf(t, "round %d: %s through %s: %v", rep, what, proxy.ID, err)
		}
	}
	store := func(flag imap.Flag, us ...uint32) func() error {
		return func() error {
			_, err := c.Store(set(us...), &imap.StoreFlags{Op: imap.StoreFlagsAdd, Flags: []imap.Flag{flag}}, nil).Collect()
			return err
		}
	}
	run("STORE \\Seen", store(imap.FlagSeen, uids[0], uids[2], uids[4], uids[6], uids[8]))
	run("STORE \\Flagged", store(imap.FlagFlagged, uids[0], uids[1], uids[2]))
	run("STORE $Redo", store("$Redo", uids[1], uids[2]))
	run("STORE \\Deleted", store(imap.FlagDeleted, uids[3], uids[5]))
	run("EXPUNGE", func() error { _, err := c.Expunge().Collect(); return err })
	a.expunged = []string{st.subj[uids[3]], st.subj[uids[5]]}
	run("MOVE", func() error { _, err := c.Move(set(uids[7], uids[8]), "Archive").Wait(); return err })
	a.moved = []string{st.subj[uids[7]], st.subj[uids[8]]}
	// What the writer acknowledged, read in the same session (the writer
	// has not died yet; a change after the batches would be read too).
	if a.inbox, err = look(c, "INBOX"); err == nil {
		a.archive, err = look(c, "Archive")
	}
	run("SELECT after the batches", func() error { return err })
	if len(a.inbox.subj) != count-4 || len(a.archive.subj) != 2 {
		resume()
		fatalf(t, "round %d: after the batches INBOX has %d and Archive %d messages, want %d and 2", rep, len(a.inbox.subj), len(a.archive.subj), count-4)
	}
	// Kill the writer at once, then let the paused replica go on.
	writer.Kill9()
	resume()
	c.Close()

	survivors := without(nodes, writer)
	check := func(n *Node, when string) (string, error) {
		inbox, archive, err := lookBoth(n, user, pw)
		if err != nil {
			return "", err
		}
		if s := older("INBOX", inbox, a.inbox, append(slices.Clone(a.expunged), a.moved...)); s != "" {
			return fmt.Sprintf("%s, through %s: %s", when, n.ID, s), nil
		}
		if s := older("Archive", archive, a.archive, nil); s != "" {
			return fmt.Sprintf("%s, through %s: %s", when, n.ID, s), nil
		}
		return "", nil
	}
	// A client alternating the survivors from the kill until both serve:
	// every state it is shown is at least the acknowledged one; errors
	// (the writer's node gone, the new one replaying) are allowed.
	served := map[string]bool{}
	var errs []string
	deadline := time.Now().Add(90 * time.Second)
	for i := 0; len(served) < len(survivors); i++ {
		if time.Now().After(deadline) {
			fatalf(t, "round %d: survivors did not serve within 90 s after the kill; last errors: %v", rep, tail(strings.Join(errs, "\n"), 5))
		}
		n := survivors[i%len(survivors)]
		bad, err := check(n, "after the kill")
		if bad != "" {
			fatalf(t, "round %d: an acknowledged change is lost: %s (writer %s killed, %s paused during the batches)", rep, bad, writer.ID, paused.ID)
		}
		if err != nil {
			errs = append(errs, err.Error())
			time.Sleep(200 * time.Millisecond)
			continue
		}
		served[n.ID] = true
	}
	waitFor(t, "survivors to rebuild soft state", 60*time.Second, func() bool { return ready(survivors) })
	for _, n := range survivors {
		if bad, err := check(n, "after the failover"); bad != "" || err != nil {
			fatalf(t, "round %d: %s %v", rep, bad, err)
		}
	}
	// The writer's node comes back, takes its buckets back once it has
	// caught up, and shows the same.
	writer.Restart()
	waitFor(t, "the writer's node to come back", 60*time.Second, func() bool { return ready(nodes) })
	for _, n := range nodes {
		var bad string
		var err error
		waitFor(t, "a session through "+n.ID, 30*time.Second, func() bool {
			bad, err = check(n, "after the writer's node came back")
			return bad != "" || err == nil
		})
		if bad != "" {
			fatalf(t, "round %d: %s", rep, bad)
		}
	}
}
