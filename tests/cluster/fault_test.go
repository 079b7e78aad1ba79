package cluster_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFaultsLoseNoAcknowledgedMail delivers a stream of uniquely numbered
// messages to random users through random nodes while nodes are killed
// (SIGKILL, then restarted) and paused (SIGSTOP, then SIGCONT), one at a
// time. When every node is back, a checker reads every mailbox through every
// node: no acknowledged message may be missing (BLUEPRINT invariant 1);
// duplicates are counted. QUILL_FAULTS sets the number of faults (default a
// short run for CI; the long run is `make faults`).
func TestFaultsLoseNoAcknowledgedMail(t *testing.T) {
	faults := 6
	if v, err := strconv.Atoi(os.Getenv("QUILL_FAULTS")); err == nil && v > 0 {
		faults = v
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("QUILL_FAULT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (QUILL_FAULT_SEED replays), %d faults", seed, faults)
	rnd := rand.New(rand.NewPCG(seed, 1))
	nodes := startCluster(t, 3)
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	var users []string
	for i := 0; i < 8; i++ {
		u := fmt.Sprintf("fault%d@cluster.example", i)
		users = append(users, u)
		nodes[0].addUser(t, u, "pw")
	}

	// The node set changes under the clients: they pick among the nodes
	// not currently faulty.
	var mu sync.Mutex
	down := map[*Node]bool{}
	acked := map[string]map[int]bool{}
	attempts, failures := 0, 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq int
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)+2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				seq++
				n := seq
				var up []*Node
				for _, nd := range nodes {
					if !down[nd] {
						up = append(up, nd)
					}
				}
				mu.Unlock()
				u := users[r.IntN(len(users))]
				err := up[r.IntN(len(up))].send(u, fmt.Sprintf("seq %d", n))
				mu.Lock()
				attempts++
				if err == nil {
					if acked[u] == nil {
						acked[u] = map[int]bool{}
					}
					acked[u][n] = true
				} else {
					failures++
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}(w)
	}
	for f := 0; f < faults; f++ {
		time.Sleep(time.Duration(1000+rnd.IntN(2000)) * time.Millisecond)
		victim := nodes[rnd.IntN(len(nodes))]
		mu.Lock()
		down[victim] = true
		mu.Unlock()
		if rnd.IntN(2) == 0 {
			t.Logf("fault %d: SIGKILL %s", f, victim.ID)
			victim.Kill9()
			time.Sleep(time.Duration(1000+rnd.IntN(3000)) * time.Millisecond)
			victim.Restart()
		} else {
			pause := time.Duration(2000+rnd.IntN(6000)) * time.Millisecond
			t.Logf("fault %d: SIGSTOP %s for %v", f, victim.ID, pause)
			victim.Pause()
			time.Sleep(pause)
			victim.Resume()
		}
		mu.Lock()
		delete(down, victim)
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	waitFor(t, "every node back with rebuilt soft state", 90*time.Second, func() bool { return ready(nodes) })

	total := 0
	for _, s := range acked {
		total += len(s)
	}
	t.Logf("%d deliveries tried, %d acknowledged, %d refused or failed while nodes were down", attempts, total, failures)
	if total == 0 {
		t.Fatal("no delivery was acknowledged")
	}
	lost, dups := 0, 0
	for _, n := range nodes {
		for _, u := range users {
			_, subj, _, err := n.imapView(u, "pw")
			if err != nil {
				t.Fatalf("%s through %s: %v", u, n.ID, err)
			}
			count := map[int]int{}
			for _, s := range subj {
				if k, err := strconv.Atoi(strings.TrimPrefix(s, "seq ")); err == nil {
					count[k]++
				}
			}
			for k := range acked[u] {
				if count[k] == 0 {
					lost++
					t.Errorf("%s through %s: acknowledged message seq %d is missing", u, n.ID, k)
				}
			}
			for _, c := range count {
				if c > 1 {
					dups += c - 1
				}
			}
		}
	}
	t.Logf("checker: acknowledged-but-lost %d, duplicates %d (read through each of %d nodes)", lost, dups, len(nodes))
}
