package cluster_test

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
)

// Archipelago's islands (issue 17 item 1): four nodes in islands a and b,
// two each, R=2. Every user's mail and profile stay on its island's nodes,
// whichever node the mail came through; with both nodes of island a
// killed, island b's users keep working through the survivors and island
// a's get temporary failures (never another island's node standing in, nor
// an internal name in the reply); island a back, its users' mail is all
// there.
func TestIslandsConfineUsersAndFailures(t *testing.T) {
	// The two island tests run beside each other, after the package's
	// other tests: each mostly waits on membership and repair, and CI's
	// time is short.
	t.Parallel()
	const (
		users = 24
		pw    = "pw"
		sends = 4 // per user, one through each node
	)
	nodes := startSet(t, 4, func(i int, nd *Node) {
		nd.extra = []string{"--island", []string{"a", "a", "b", "b"}[i], "--replicas", "2"}
	})
	islandOf := map[string]string{nodes[0].ID: "a", nodes[1].ID: "a", nodes[2].ID: "b", nodes[3].ID: "b"}

	// The first table, made by the lowest node once the membership is
	// stable, reaches every node, and the user map follows it.
	var table []string // bucket -> island
	took := waitFor(t, "every node to install the island table and agree on the map", 40*time.Second, func() bool {
		var first []string
		var managers []string
		for _, n := range nodes {
			st, err := n.Status()
			if err != nil || st.IslandEpoch == 0 || st.Managed != st.Ready {
				return false
			}
			var isl, mgr []string
			for _, b := range st.Buckets {
				isl = append(isl, b.Island)
				mgr = append(mgr, string(b.Node))
			}
			if first != nil && (!slices.Equal(first, isl) || !slices.Equal(managers, mgr)) {
				return false
			}
			first, managers = isl, mgr
		}
		for b, m := range managers {
			if islandOf[m] != first[b] {
				return false
			}
		}
		table = first
		return true
	})
	t.Logf("island table in force everywhere %v after the nodes agreed", took.Round(time.Second))
	userIsland := func(u string) string { return table[cluster.Bucket(u)] }

	addrs := nodes[0].addUsers(t, "isl", users, pw)
	per := map[string][]string{}
	for _, u := range addrs {
		per[userIsland(u)] = append(per[userIsland(u)], u)
	}
	if len(per["a"]) == 0 || len(per["b"]) == 0 {
		fatalf(t, "users of one island only: %v", per)
	}
	for i := range sends {
		for _, u := range addrs {
			if err := nodes[i%len(nodes)].send(u, fmt.Sprintf("m-%d", i)); err != nil {
				fatalf(t, "send m-%d to %s through %s: %v", i, u, nodes[i%len(nodes)].ID, err)
			}
		}
	}
	// The nodes holding each user's mail, as every node answers it.
	for _, u := range addrs {
		var shown struct {
			Holders []string `json:"holders"`
		}
		if err := nodes[3].get("/api/users/"+url.PathEscape(u), &shown); err != nil {
			fatalf(t, "show %s: %v", u, err)
		}
		if len(shown.Holders) == 0 {
			fatalf(t, "%s: no node holds its mail", u)
		}
		for _, h := range shown.Holders {
			if islandOf[h] != userIsland(u) {
				errorf(t, "%s of island %s: mail held on %s of island %s", u, userIsland(u), h, islandOf[h])
			}
		}
	}

	// Island a goes down at once.
	nodes[0].Kill9()
	nodes[1].Kill9()
	alive := nodes[2:]
	waitFor(t, "the survivors to drop island a's buckets", 30*time.Second, func() bool {
		for _, n := range alive {
			st, err := n.Status()
			if err != nil {
				return false
			}
			for b, bs := range st.Buckets {
				if (table[b] == "a") != (bs.Node == "") {
					return false
				}
			}
		}
		return true
	})
	waitFor(t, "the survivors' soft state", 30*time.Second, func() bool { return allReady(alive) })
	for i, u := range per["b"] {
		via := alive[i%len(alive)]
		if err := via.send(u, "m-after"); err != nil {
			fatalf(t, "%s of island b through %s with island a down: %v", u, via.ID, err)
		}
		_, subj, _, err := alive[(i+1)%len(alive)].imapView(u, pw)
		if err != nil {
			fatalf(t, "%s of island b with island a down: %v", u, err)
		}
		if len(subj) != sends+1 {
			errorf(t, "%s of island b with island a down: %d messages, want %d", u, len(subj), sends+1)
		}
	}
	internal := []string{nodes[0].ID, nodes[1].ID, nodes[2].ID, nodes[3].ID, "127.0.0.1", "rpc error", "island", "bucket"}
	clean := func(what, reply string) {
		for _, s := range internal {
			if strings.Contains(reply, s) {
				errorf(t, "%s: reply %q shows %q", what, reply, s)
			}
		}
	}
	// A few of island a's users suffice: each refusal waits for the
	// manager lookups' retries (cluster.ManagerRetry).
	for i, u := range per["a"][:min(3, len(per["a"]))] {
		via := alive[i%len(alive)]
		err := via.send(u, "m-lost")
		var se *gosmtp.SMTPError
		if !errors.As(err, &se) || se.Code/100 != 4 || (se.EnhancedCode[1] != 3 && se.EnhancedCode[1] != 4) {
			fatalf(t, "%s of island a through %s with island a down: SMTP %v, want 451 4.3.x or 4.4.x", u, via.ID, err)
		}
		clean("SMTP for "+u, se.Message)
		_, _, _, err = via.imapView(u, pw)
		if err == nil || !strings.Contains(err.Error(), "UNAVAILABLE") {
			fatalf(t, "%s of island a: IMAP login %v, want NO [UNAVAILABLE]", u, err)
		}
		clean("IMAP for "+u, strings.TrimPrefix(err.Error(), "login through "+via.ID))
		_, err = via.pop3Login(u, pw, ioTimeout)
		if err == nil || !strings.Contains(err.Error(), "[SYS/TEMP]") {
			fatalf(t, "%s of island a: POP3 login %v, want -ERR [SYS/TEMP]", u, err)
		}
		clean("POP3 for "+u, strings.ReplaceAll(err.Error(), via.ID, ""))
	}

	// Island a back: its users' mail is all there, read through island b.
	nodes[0].Restart()
	nodes[1].Restart()
	waitFor(t, "island a back in every node's map", 40*time.Second, func() bool { return allReady(nodes) && ownersInIsland(nodes, table, islandOf) })
	for i, u := range addrs {
		want := sends
		if userIsland(u) == "b" {
			want++
		}
		_, subj, _, err := nodes[2+i%2].imapView(u, pw)
		if err != nil {
			fatalf(t, "%s after island a came back: %v", u, err)
		}
		if len(subj) != want {
			errorf(t, "%s of island %s after island a came back: %d messages, want %d", u, userIsland(u), len(subj), want)
		}
	}

	// The stores: every replica of every message, and every profile, on a
	// node of its user's island, and every message named by its replicas
	// on nodes of that island only.
	msgs, profiles := 0, 0
	for _, n := range nodes {
		n.inStore(t, func(db *store.DB) error {
			err := mailbox.New(db).Scan(func(h replica.Held) error {
				msgs++
				if islandOf[n.ID] != userIsland(h.User) {
					errorf(t, "%s of island %s holds message %s of %s (island %s)", n.ID, islandOf[n.ID], h.Object, h.User, userIsland(h.User))
				}
				for _, r := range h.Replicas {
					if islandOf[string(r)] != userIsland(h.User) {
						errorf(t, "message %s of %s (island %s) names replica %s of island %s", h.Object, h.User, userIsland(h.User), r, islandOf[string(r)])
					}
				}
				return nil
			})
			for b := 0; b < cluster.Buckets && err == nil; b++ {
				err = userdb.New(db).Scan(b, func(p *userdb.Profile) error {
					profiles++
					if islandOf[n.ID] != userIsland(p.Address) {
						errorf(t, "%s of island %s holds the profile of %s (island %s)", n.ID, islandOf[n.ID], p.Address, userIsland(p.Address))
					}
					return nil
				})
			}
			return err
		})
	}
	if want := 2 * (users*sends + len(per["b"])); msgs != want {
		errorf(t, "%d message copies in the stores, want %d (R=2)", msgs, want)
	}
	if profiles != 2*users {
		errorf(t, "%d profile copies in the stores, want %d", profiles, 2*users)
	}
}

// allReady says every node has rebuilt the soft state of the buckets it
// manages.
func allReady(nodes []*Node) bool {
	for _, n := range nodes {
		st, err := n.Status()
		if err != nil || st.Ready != st.Managed {
			return false
		}
	}
	return true
}

// ownersInIsland says every node's map gives each bucket a manager of the
// bucket's island.
func ownersInIsland(nodes []*Node, table []string, islandOf map[string]string) bool {
	for _, n := range nodes {
		st, err := n.Status()
		if err != nil {
			return false
		}
		for b, bs := range st.Buckets {
			if islandOf[string(bs.Node)] != table[b] {
				return false
			}
		}
	}
	return true
}

// A node that changes island moves its users' state: node 1 of island a
// comes back in island b, so island a's users' copies on it are misplaced
// (replica.judgeRepair), and repair moves them into island a (node 0, the
// island's only node now), copy first, with every message still read.
// This is the path an island table change takes (the moved buckets'
// replicas become misplaced the same way). About 35 s, so not in CI: run
// with QUILL_ISLAND_MOVE=1 (make island-move).
func TestIslandChangeMovesMailHome(t *testing.T) {
	if os.Getenv("QUILL_ISLAND_MOVE") == "" {
		t.Skip("set QUILL_ISLAND_MOVE=1 (make island-move)")
	}
	const sends = 4
	nodes := startSet(t, 4, func(i int, nd *Node) {
		nd.extra = []string{"--island", []string{"a", "a", "b", "b"}[i], "--replicas", "2"}
	})
	var table []string
	waitFor(t, "the island table on every node", 40*time.Second, func() bool {
		st, err := nodes[3].Status()
		if err != nil || st.IslandEpoch == 0 || !allReady(nodes) {
			return false
		}
		table = nil
		for _, b := range st.Buckets {
			table = append(table, b.Island)
		}
		return ownersInIsland(nodes, table, map[string]string{nodes[0].ID: "a", nodes[1].ID: "a", nodes[2].ID: "b", nodes[3].ID: "b"})
	})
	addrs := nodes[0].addUsers(t, "mv", 12, "pw")
	for i := range sends {
		for _, u := range addrs {
			if err := nodes[i].send(u, fmt.Sprintf("m-%d", i)); err != nil {
				fatalf(t, "send m-%d to %s: %v", i, u, err)
			}
		}
	}
	nodes[1].Stop()
	nodes[1].extra = []string{"--island", "b", "--replicas", "2"}
	nodes[1].Restart()
	islandOf := map[string]string{nodes[0].ID: "a", nodes[1].ID: "b", nodes[2].ID: "b", nodes[3].ID: "b"}
	seen := false
	waitFor(t, "repair to move the misplaced copies home", 2*time.Minute, func() bool {
		total := 0
		for _, n := range nodes {
			var rs struct {
				Misplaced int `json:"misplaced"`
			}
			if err := n.get("/api/replication", &rs); err != nil {
				return false
			}
			total += rs.Misplaced
		}
		seen = seen || total > 0
		return seen && total == 0
	})
	for _, u := range addrs {
		if _, subj, _, err := nodes[2].imapView(u, "pw"); err != nil || len(subj) != sends {
			errorf(t, "%s after the move: %d messages (%v), want %d", u, len(subj), err, sends)
		}
	}
	for _, n := range nodes {
		n.inStore(t, func(db *store.DB) error {
			return mailbox.New(db).Scan(func(h replica.Held) error {
				if islandOf[n.ID] != table[cluster.Bucket(h.User)] {
					errorf(t, "%s of island %s still holds %s of %s (island %s)", n.ID, islandOf[n.ID], h.Object, h.User, table[cluster.Bucket(h.User)])
				}
				return nil
			})
		})
	}
}

// inStore stops the node and runs fn on its store.
func (n *Node) inStore(t *testing.T, fn func(db *store.DB) error) {
	t.Helper()
	n.Stop()
	db, err := store.Open(n.Data)
	if err != nil {
		fatalf(t, "open the store of %s: %v", n.ID, err)
	}
	err = fn(db)
	db.Close()
	if err != nil {
		fatalf(t, "scan the store of %s: %v", n.ID, err)
	}
}

// islandView is GET /api/islands as the tests read it.
type islandView struct {
	Table   bool     `json:"table"`
	Epoch   uint64   `json:"epoch"`
	Owners  []string `json:"owners"`
	Islands []struct {
		Name    string `json:"name"`
		Buckets int    `json:"buckets"`
		InTable bool   `json:"in_table"`
	} `json:"islands"`
	Manager *struct {
		Coordinator bool   `json:"coordinator"`
		Commits     int    `json:"commits"`
		Aborts      int    `json:"aborts"`
		Last        string `json:"last"`
		Waiting     string `json:"waiting"`
	} `json:"manager"`
}

// tableEverywhere waits until every node has installed the same table at
// epoch want or above, and returns it (bucket -> island).
func tableEverywhere(t *testing.T, nodes []*Node, what string, timeout time.Duration, ok func(v islandView) bool) islandView {
	t.Helper()
	var got islandView
	waitFor(t, what, timeout, func() bool {
		var first *islandView
		for _, n := range nodes {
			var v islandView
			if err := n.get("/api/islands", &v); err != nil || !v.Table || !ok(v) {
				return false
			}
			if first != nil && (first.Epoch != v.Epoch || !slices.Equal(first.Owners, v.Owners)) {
				return false
			}
			first = &v
		}
		got = *first
		return allReady(nodes)
	})
	return got
}

// Archipelago's table change (§3.1, §4.1) on real nodes: islands a and b
// hold mail; nodes of a new island c join, and the coordinator (the lowest
// node id) moves buckets to c by monotonic bin packing under the two-phase
// commit; repair moves the moved users' mail to c, copy first; then island
// c is removed (quill island remove) and its buckets go back. Through each
// change every user reads every message exactly once, and at the end every
// copy is in its user's island.
func TestIslandTableChangesByTwoPhaseCommit(t *testing.T) {
	t.Parallel() // beside TestIslandsConfineUsersAndFailures
	const (
		users = 16
		sends = 3
		pw    = "pw"
	)
	isl := []string{"a", "b", "c"}
	nodes := startSet(t, 2, func(i int, nd *Node) { nd.extra = []string{"--island", isl[i], "--replicas", "1"} })
	v1 := tableEverywhere(t, nodes, "the first table over a and b", 40*time.Second, func(v islandView) bool { return v.Epoch >= 1 })
	addrs := nodes[0].addUsers(t, "tpc", users, pw)
	for i := range sends {
		for _, u := range addrs {
			if err := nodes[i%2].send(u, fmt.Sprintf("m-%d", i)); err != nil {
				fatalf(t, "send m-%d to %s: %v", i, u, err)
			}
		}
	}
	readEach := func(what string) {
		t.Helper()
		for i, u := range addrs {
			via := nodes[i%len(nodes)]
			_, subj, _, err := via.imapView(u, pw)
			if err != nil {
				errorf(t, "%s: %s through %s: %v", what, u, via.ID, err)
				continue
			}
			count := map[string]int{}
			for _, s := range subj {
				count[s]++
			}
			for k := range sends {
				if c := count[fmt.Sprintf("m-%d", k)]; c != 1 {
					errorf(t, "%s: %s through %s sees m-%d %d times, want once (%v)", what, u, via.ID, k, c, subj)
				}
			}
			if len(subj) != sends {
				errorf(t, "%s: %s through %s sees %d messages, want %d", what, u, via.ID, len(subj), sends)
			}
		}
	}
	// Repair has moved the users' mail when every node names only nodes
	// of the user's island as holding it (the mail map drops a node whose
	// fragment empties).
	islandOf := map[string]string{nodes[0].ID: "a", nodes[1].ID: "b"}
	settled := func(what string, owners []string) {
		t.Helper()
		waitFor(t, what, 2*time.Minute, func() bool {
			for _, u := range addrs {
				for _, n := range nodes {
					var shown struct {
						Holders []string `json:"holders"`
					}
					if err := n.get("/api/users/"+url.PathEscape(u), &shown); err != nil || len(shown.Holders) == 0 {
						return false
					}
					for _, h := range shown.Holders {
						if islandOf[h] != owners[cluster.Bucket(u)] {
							return false
						}
					}
				}
			}
			return true
		})
	}

	// Island c joins.
	c := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t), join: []string{nodes[0].Gossip},
		extra: []string{"--island", "c", "--replicas", "1"}}
	c.start()
	t.Cleanup(c.Stop)
	nodes = append(nodes, c)
	islandOf[c.ID] = "c"
	v2 := tableEverywhere(t, nodes, "a table with island c", 90*time.Second, func(v islandView) bool { return v.Epoch > v1.Epoch })
	gained := 0
	for b := range v2.Owners {
		switch {
		case v2.Owners[b] == "c":
			gained++
		case v2.Owners[b] != v1.Owners[b]:
			errorf(t, "bucket %d went from %s to %s: only the new island may gain", b, v1.Owners[b], v2.Owners[b])
		}
	}
	if gained < 60 || gained > 110 {
		errorf(t, "island c gained %d buckets of 256, want about a third", gained)
	}
	t.Logf("table epoch %d -> %d: island c gained %d buckets", v1.Epoch, v2.Epoch, gained)
	readEach("during the move to c")
	settled("repair to move the moved users' mail to island c", v2.Owners)
	readEach("after the move to c")
	onC := 0
	for _, u := range addrs {
		if v2.Owners[cluster.Bucket(u)] == "c" {
			onC++
		}
	}

	// Island c is removed: its buckets go back to a and b.
	if err := nodes[1].api("POST", "/api/islands/c/remove", nil, nil); err != nil {
		fatalf(t, "remove island c: %v", err)
	}
	v3 := tableEverywhere(t, nodes, "a table without island c", 90*time.Second, func(v islandView) bool { return v.Epoch > v2.Epoch })
	for b, o := range v3.Owners {
		if o == "c" {
			errorf(t, "bucket %d still on island c after its removal", b)
		}
		if v2.Owners[b] != "c" && o != v2.Owners[b] {
			errorf(t, "bucket %d went from %s to %s while only c was to lose buckets", b, v2.Owners[b], o)
		}
	}
	readEach("during the move back")
	settled("repair to move island c's users back", v3.Owners)
	readEach("after the move back")
	copies := 0
	for _, n := range nodes {
		n.inStore(t, func(db *store.DB) error {
			return mailbox.New(db).Scan(func(h replica.Held) error {
				copies++
				if islandOf[n.ID] != v3.Owners[cluster.Bucket(h.User)] {
					errorf(t, "%s of island %s still holds %s of %s (island %s)", n.ID, islandOf[n.ID], h.Object, h.User, v3.Owners[cluster.Bucket(h.User)])
				}
				return nil
			})
		})
	}
	if copies != users*sends {
		errorf(t, "%d message copies in the stores, want %d (R=1)", copies, users*sends)
	}
	t.Logf("%d of %d users moved to island c and back; %d copies where they belong", onC, users, copies)
}
