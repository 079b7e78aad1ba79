package cluster_test

// Archipelago's availability measure (issue 17 item 2, docs/reliability.md):
// n islands of two nodes each, a stream of deliveries and mailbox reads over
// many users through the live nodes, then every node of one island killed
// with SIGKILL. Reported: the share of users whose every operation after
// the kill succeeded (and saw every message acknowledged before it began),
// and the share of operations that succeeded, beside the same 2n nodes
// without islands with the same two nodes killed, and the islands with two
// nodes of different islands killed (the failures islands contain best).
// `make availability` runs n = 2, 3, 4; it is not part of CI (about a
// minute and a half per cluster; one kind only with
// -run 'TestIslandAvailability$/one_node_of_two').

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// availUsersPerIsland is the users per two nodes.
	availUsersPerIsland = 60
	// availFill is the messages each user holds before the stream.
	availFill = 3
	// availBefore and availAfter are the stream's length before the kill
	// and the window after it that the figures judge.
	availBefore = 10 * time.Second
	availAfter  = 40 * time.Second
	// availWorkers is the clients running at once.
	availWorkers = 8
)

type availResult struct {
	label                string
	nodes, killed, users int
	untouched            int // users with every operation in the window ok
	judged               int // users with at least one operation in the window
	ops, opsOK           int
	before, beforeOK     int
}

func TestIslandAvailability(t *testing.T) {
	if os.Getenv("QUILL_AVAILABILITY") == "" {
		t.Skip("the availability figure: make availability (QUILL_AVAILABILITY=1)")
	}
	ns := []int{2, 3, 4}
	if v := os.Getenv("QUILL_AVAILABILITY_ISLANDS"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 2 {
				t.Fatalf("QUILL_AVAILABILITY_ISLANDS=%q: want numbers >= 2", v)
			}
			ns = append(ns, n)
		}
	}
	var results []availResult
	for _, n := range ns {
		for _, v := range []struct {
			islands, spread bool
			label           string
		}{
			{true, false, fmt.Sprintf("%d islands of 2 nodes, one island killed", n)},
			{false, false, fmt.Sprintf("%d nodes, one island", 2*n)},
			{true, true, fmt.Sprintf("%d islands of 2 nodes, one node of two islands killed", n)},
		} {
			t.Run(strings.ReplaceAll(v.label, " ", "_"), func(t *testing.T) {
				r := availabilityRun(t, n, v.islands, v.spread)
				r.label = v.label
				results = append(results, r)
			})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| cluster | nodes killed | users | users untouched | goal (islands) | operations ok after the kill | before the kill |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		goal := "—"
		if strings.Contains(r.label, "one island killed") {
			k := float64(r.nodes / 2)
			goal = fmt.Sprintf("≥ %.1f%%", 100*(1-1/k-0.02))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f%% (%d of %d) | %s | %.1f%% (%d of %d) | %.1f%% |\n",
			r.label, r.killed, r.users, pct(r.untouched, r.judged), r.untouched, r.judged, goal,
			pct(r.opsOK, r.ops), r.opsOK, r.ops, pct(r.beforeOK, r.before))
	}
	t.Logf("availability:\n%s", b.String())
	if out := os.Getenv("QUILL_AVAILABILITY_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, r := range results {
		if k := float64(r.nodes / 2); strings.Contains(r.label, "one island killed") && pct(r.untouched, r.judged) < 100*(1-1/k-0.02) {
			errorf(t, "%s: %.1f%% of users untouched, the goal is at least %.1f%%", r.label, pct(r.untouched, r.judged), 100*(1-1/k-0.02))
		}
	}
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// availabilityRun starts 2n nodes (in n islands of two, or all in one),
// fills the users' mailboxes, runs the stream and kills two nodes: the
// first island's (nodes 0 and 1), or with spread one node of each of the
// first two islands (nodes 0 and 2).
func availabilityRun(t *testing.T, n int, islands, spread bool) availResult {
	sayFailuresLast(t)
	var nodes []*Node
	for i := range 2 * n {
		nd := &Node{t: t, Data: t.TempDir(), Gossip: freeAddr(t), HTTP: freeAddr(t)}
		if islands {
			nd.extra = []string{"--island", fmt.Sprintf("isl-%d", i/2)}
		}
		if i > 0 {
			nd.join = []string{nodes[0].Gossip}
		}
		nd.start()
		t.Cleanup(nd.Stop)
		nodes = append(nodes, nd)
	}
	waitFor(t, "all nodes to agree on the user map", 60*time.Second, func() bool { return agree(nodes, nodes) })
	if islands {
		waitFor(t, "the island table", 90*time.Second, func() bool {
			for _, nd := range nodes {
				var st struct {
					Table   bool `json:"table"`
					Islands []struct {
						Buckets int  `json:"buckets"`
						InTable bool `json:"in_table"`
					} `json:"islands"`
				}
				if err := nd.get("/api/islands", &st); err != nil || !st.Table {
					return false
				}
				in := 0
				for _, isl := range st.Islands {
					if isl.InTable && isl.Buckets > 0 {
						in++
					}
				}
				if in != n {
					return false
				}
			}
			return agree(nodes, nodes)
		})
	}
	waitFor(t, "soft state on every node", 60*time.Second, func() bool { return ready(nodes) })

	const pw = "avail-pw"
	users := nodes[0].addUsers(t, "avail", availUsersPerIsland*n, pw)
	acked := make([]atomic.Int64, len(users))
	for i, u := range users {
		if err := nodes[i%len(nodes)].sendMany(u, "fill", availFill); err != nil {
			fatalf(t, "fill %s: %v", u, err)
		}
		acked[i].Store(availFill)
	}
	waitFor(t, "every message on its replicas", 120*time.Second, func() bool { ok, _ := fullyReplicated(nodes); return ok })

	var mu sync.Mutex
	up := append([]*Node(nil), nodes...)
	live := func(r *rand.Rand) *Node {
		mu.Lock()
		defer mu.Unlock()
		return up[r.IntN(len(up))]
	}
	type op struct {
		user  int
		start time.Time
		ok    bool
		err   string
	}
	var ops []op
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range availWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(n)))
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				// Each worker has its own users: a user has one session at
				// a time (POP3 locks the maildrop).
				cnt := (len(users) - w + availWorkers - 1) / availWorkers
				i := w + availWorkers*(k%cnt)
				via := live(r)
				start := time.Now()
				var err error
				if (k/cnt+k%cnt)%2 == 0 { // each user's visits alternate
					if err = via.send(users[i], fmt.Sprintf("avail-%d-%d", w, k)); err == nil {
						acked[i].Add(1)
					}
				} else {
					want := acked[i].Load()
					seen := 0
					err = via.pop3Subjects(users[i], pw, func(string) bool { seen++; return true })
					if err == nil && int64(seen) < want {
						err = fmt.Errorf("%d messages visible, %d acknowledged", seen, want)
					}
				}
				o := op{user: i, start: start, ok: err == nil}
				if err != nil {
					o.err = err.Error()
				}
				mu.Lock()
				ops = append(ops, o)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(availBefore)
	victims := []*Node{nodes[0], nodes[1]}
	if spread {
		victims[1] = nodes[2]
	}
	mu.Lock()
	up = slices.DeleteFunc(slices.Clone(nodes), func(nd *Node) bool { return slices.Contains(victims, nd) }) // clients stop choosing them
	mu.Unlock()
	now := time.Now()
	for _, v := range victims {
		v.Kill9()
	}
	t.Logf("killed %s and %s at %s", victims[0].ID, victims[1].ID, now.Format(time.TimeOnly))
	time.Sleep(availAfter)
	close(stop)
	wg.Wait()

	res := availResult{nodes: len(nodes), killed: 2, users: len(users)}
	failed := map[int]bool{}
	seen := map[int]bool{}
	// The first failures of each phase, for the log.
	var errsBefore, errsAfter []string
	for _, o := range ops {
		if !o.ok && o.start.Before(now) && len(errsBefore) < 5 {
			errsBefore = append(errsBefore, users[o.user]+": "+o.err)
		} else if !o.ok && !o.start.Before(now) && len(errsAfter) < 5 {
			errsAfter = append(errsAfter, users[o.user]+": "+o.err)
		}
		if o.start.Before(now) {
			res.before++
			if o.ok {
				res.beforeOK++
			}
			continue
		}
		if o.start.After(now.Add(availAfter)) {
			continue
		}
		res.ops++
		seen[o.user] = true
		if o.ok {
			res.opsOK++
		} else {
			failed[o.user] = true
		}
	}
	res.judged = len(seen)
	res.untouched = len(seen) - len(failed)
	var bad []string
	for u := range failed {
		bad = append(bad, users[u])
	}
	sort.Strings(bad)
	t.Logf("%d of %d users untouched; %d of %d operations ok after the kill (%d of %d before); touched: %d users",
		res.untouched, res.judged, res.opsOK, res.ops, res.beforeOK, res.before, len(bad))
	t.Logf("first failures before the kill: %q; after: %q", errsBefore, errsAfter)
	return res
}
